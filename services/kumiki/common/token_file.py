"""Files their owners replace while the process runs: a token the kubelet rotates (a projected ServiceAccount
token, well before it expires; `TokenFile`, used by the checkpoint SDK's `KUMIKI_JOB_TOKEN_FILE` and the node
agent's `--token-file`), and settings an operator changes without a restart (`WatchedFile`, e.g. telemetry's
node key generations, a mounted ConfigMap)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


class WatchedFile:
    """A file read again when it changes (mtime or inode), looked at no more often than every `recheck_s`
    (0: on every call). The caller `accept`s what it read, so a half-written file is read again next time."""

    def __init__(self, path: Path, *, recheck_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.recheck_s = recheck_s
        self.clock = clock
        self._seen: tuple[int, int] | None = None
        self._checked = float("-inf")

    def read_if_changed(self, *, force: bool = False) -> tuple[str, tuple[int, int]] | None:
        """(text, version) when the file changed since the version last accepted, else None; OSError as raised."""
        now = self.clock()
        if not force and now - self._checked < self.recheck_s:
            return None
        self._checked = now
        stat = self.path.stat()
        seen = (stat.st_mtime_ns, stat.st_ino)
        if seen == self._seen:
            return None
        return self.path.read_text(), seen

    def accept(self, version: tuple[int, int]) -> None:
        self._seen = version


class TokenFile:
    """Read again whenever the file changes; the last good token is kept while a replacement is half written.
    `refresh(required=True)` raises `error` naming `option` when there is no token at all. `recheck_s`: look at
    the file at most this often (0: on every call). A caller asking per record (the agent) need not stat a file
    the kubelet replaces every few minutes, at the earliest, several times a second."""

    def __init__(
        self,
        path: Path,
        option: str,
        error: type[Exception] = ValueError,
        *,
        recheck_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.option = option
        self.error = error
        self._file = WatchedFile(path, recheck_s=recheck_s, clock=clock)
        self.token = ""
        self.refresh(required=True)

    def refresh(self, *, required: bool = False) -> str:
        try:
            found = self._file.read_if_changed(force=required)
            if found is not None:
                text, version = found
                token = text.strip()
                if token:
                    self.token = token
                    self._file.accept(version)
                elif required:
                    raise self.error(f"{self.option}: {str(self.path)!r} is empty")
        except OSError as error:
            if required:
                raise self.error(f"{self.option}: cannot read {str(self.path)!r}: {error.strerror}") from None
        return self.token
