"""The binder's hot path to the API server: Bindings, status patches, Events and watches over aiohttp.

lightkube (typed models over httpx) stays the client for everything else (lists, the Lease, evictions), but
at hundreds of pods a second its per-request cost (httpx's pool and anyio streams, model encoding, watch
events decoded into models and back into dicts) was most of the binder's CPU: profiled at 100 nodes and 500
pods it spent three quarters of its samples inside httpx. aiohttp's C HTTP parser and keep-alive pool, and
bodies written and read with orjson, cost a fraction of that. The lane takes the same kubeconfig (server, CA,
client certificate, bearer token or the service account's token file); a kubeconfig it cannot serve (exec or
basic auth) gets no lane and the binder uses lightkube for everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from lightkube import KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiStatusError(RuntimeError):
    """The API server answered with an error status; `code` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Token:
    """A bearer token, re-read from its file every minute (projected service-account tokens rotate)."""

    def __init__(self, token: str | None, token_file: str | None) -> None:
        self.token = (token or "").strip()
        self.token_file = token_file
        self.read_at = time.monotonic()

    def header(self) -> str | None:
        if self.token_file and time.monotonic() - self.read_at > 60:
            try:
                self.token = Path(self.token_file).read_text().strip()
            except OSError as error:
                log.warning("token file not re-read", extra={"reason": str(error)})
            self.read_at = time.monotonic()
        return f"Bearer {self.token}" if self.token else None


class ApiLane:
    """Short requests on a pool of keep-alive connections (`connections` at once) and streaming watches."""

    def __init__(self, server: str, ssl_context: ssl.SSLContext | None, token: _Token, connections: int = 64) -> None:
        self.server = server.rstrip("/")
        self.ssl_context = ssl_context
        self.token = token
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, config: KubeConfig, connections: int = 64) -> ApiLane | None:
        """None when the kubeconfig's user authenticates in a way the lane does not speak (exec, basic)."""
        single: SingleConfig | None = config.get()
        if single is None:
            return None
        user = single.user
        if user is not None and (user.exec or user.username or user.auth_provider):
            return None
        server = single.cluster.server
        context = None
        if server.startswith("https"):
            from lightkube.config.models import User

            context = verify_cluster(single.cluster, user or User(), single.abs_file)
        token_file = str(single.abs_file(user.token_file)) if user and user.token_file else None
        token = _Token(user.token if user else None, token_file)
        return cls(server, context, token, connections)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.connections + 8,  # the watches hold a few connections for themselves
                ssl=self.ssl_context if self.ssl_context is not None else False,
                keepalive_timeout=60,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                read_bufsize=4 * 2**20,  # one watch line is one object: a pod with a large spec is still one line
                json_serialize=lambda value: orjson.dumps(value).decode(),
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
            )
        return self._session

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": JSON}
        auth = self.token.header()
        if auth:
            headers["Authorization"] = auth
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """The decoded answer of one request; ApiStatusError for an error status (the Status's message)."""
        data = orjson.dumps(body) if body is not None else None
        async with self.session().request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers=self._headers(content_type if data is not None else None),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            raw = await response.read()
            if response.status >= 400:
                message = raw[:500].decode(errors="replace")
                with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                    message = str(orjson.loads(raw).get("message") or message)
                raise ApiStatusError(response.status, message)
            if not raw:
                return {}
            decoded = orjson.loads(raw)
            return decoded if isinstance(decoded, dict) else {}

    async def watch(
        self, path: str, params: Mapping[str, str] | None = None, resource_version: str = ""
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(ADDED / MODIFIED / DELETED, object) for ever: reopened from the last version seen when the server
        closes the stream, and from the current state (ADDED for every object) when that version is too old
        (410), as lightkube's watch does; bookmarks only advance the version."""
        version = resource_version
        failures = 0
        while True:
            query = {**(params or {}), "watch": "true", "allowWatchBookmarks": "true"}
            if version:
                query["resourceVersion"] = version
            try:
                async with self.session().get(self.server + path, params=query, headers=self._headers()) as response:
                    if response.status == 410:
                        version = ""
                        continue
                    if response.status >= 400:
                        raise ApiStatusError(response.status, (await response.read())[:300].decode(errors="replace"))
                    failures = 0
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = orjson.loads(line)
                        kind = str(event.get("type") or "")
                        obj = event.get("object") or {}
                        if kind == "ERROR":
                            if obj.get("code") == 410:
                                version = ""  # too old: start over from the current state
                            raise ApiStatusError(int(obj.get("code") or 500), str(obj.get("message") or ""))
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind == "BOOKMARK":
                            continue
                        yield kind, obj
            except (aiohttp.ClientError, TimeoutError, ApiStatusError, ValueError) as error:
                failures += 1
                log.warning("watch interrupted; reopening", extra={"path": path, "reason": str(error)})
                await asyncio.sleep(min(5.0, 0.2 * failures))


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    tail = f"/{sub}" if sub else ""
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}{tail}"
