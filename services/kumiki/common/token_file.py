"""A token kept in a file that its owner replaces while the process runs: the kubelet rotates a projected
ServiceAccount token well before it expires. Used by the checkpoint SDK (`KUMIKI_JOB_TOKEN_FILE`) and the node
agent (`--token-file`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


class TokenFile:
    """Read again whenever the file changes (mtime or inode); the last good token is kept while a replacement
    is half written. `refresh(required=True)` raises `error` naming `option` when there is no token at all.
    `recheck_s`: look at the file at most this often (0: on every call). A caller asking per record (the agent)
    need not stat a file the kubelet replaces every few minutes, at the earliest, several times a second."""

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
        self.recheck_s = recheck_s
        self.clock = clock
        self._seen: tuple[int, int] | None = None
        self._checked = float("-inf")
        self.token = ""
        self.refresh(required=True)

    def refresh(self, *, required: bool = False) -> str:
        now = self.clock()
        if not required and now - self._checked < self.recheck_s:
            return self.token
        self._checked = now
        try:
            stat = self.path.stat()
            seen = (stat.st_mtime_ns, stat.st_ino)
            if seen != self._seen:
                token = self.path.read_text().strip()
                if token:
                    self.token, self._seen = token, seen
                elif required:
                    raise self.error(f"{self.option}: {str(self.path)!r} is empty")
        except OSError as error:
            if required:
                raise self.error(f"{self.option}: cannot read {str(self.path)!r}: {error.strerror}") from None
        return self.token
