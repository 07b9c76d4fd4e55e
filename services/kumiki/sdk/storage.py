"""Writing a checkpoint so that a crash never leaves half of one: temp file, fsync, rename, fsync the folder."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write `path` through `write(file)`: readers see the old file or the whole new one, never a part."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)
    return target


def uri_of(path: str | Path) -> str:
    return Path(path).resolve().as_uri()


def path_of(uri: str) -> Path:
    """A file:// URI (what the SDK's helpers report) or a plain path, as a local path."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" in uri:
        raise ValueError(f"uri: only file:// checkpoints can be opened locally, got {uri!r}")
    return Path(uri)
