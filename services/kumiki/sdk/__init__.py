"""The job-side SDK: checkpoint when asked (or periodically), report it, resume from it (docs/preemption.md)."""

from kumiki.sdk.checkpoint import Job, ResumePoint, SdkConfigError
from kumiki.sdk.storage import atomic_write, path_of, uri_of

__all__ = ["Job", "ResumePoint", "SdkConfigError", "atomic_write", "path_of", "uri_of"]
