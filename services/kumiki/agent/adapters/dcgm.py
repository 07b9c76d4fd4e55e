"""DCGM exporter source: scrapes dcgm-exporter's /metrics over HTTP and reads it with dcgm_core.

A failed scrape (exporter restarting, timeout, HTTP error) is logged and counted and yields no
samples for that tick; the agent keeps going, and a node that stays silent is marked unhealthy
downstream by the telemetry service's timeout.
"""

from __future__ import annotations

import logging
from collections import Counter
from urllib.parse import urlparse

import aiohttp

from kumiki.agent.core import GpuInventory, GpuSample
from kumiki.agent.dcgm_core import ExporterReading, read_exporter_page

log = logging.getLogger(__name__)


class DcgmScrapeFailed(RuntimeError):
    """The exporter could not be read (only raised at start; later failures are counted)."""


def url_error(url: str) -> str | None:
    """Why `url` cannot be a dcgm-exporter address, or None."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"{url!r} is not an http(s) URL such as http://localhost:9400/metrics"
    return None


class DcgmExporterSource:
    def __init__(self, url: str, node: str | None, *, timeout_s: float = 5.0) -> None:
        self.url = url
        self.node = node
        self.timeout_s = timeout_s
        self.errors: Counter[str] = Counter()
        self.unsupported: set[tuple[int, str]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._logged_lines: set[str] = set()

    async def _read(self, scraped_at: float) -> ExporterReading:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        async with self._session.get(self.url) as response:
            if response.status != 200:
                raise DcgmScrapeFailed(f"{self.url} answered HTTP {response.status}")
            text = await response.text()
        reading = read_exporter_page(text, self.node, scraped_at)
        for error in reading.errors:
            self.errors["exporter_line"] += 1
            if error not in self._logged_lines:
                self._logged_lines.add(error)
                log.warning("dcgm-exporter page %s: %s (skipped)", self.url, error)
        return reading

    async def open(self, now: float) -> GpuInventory:
        """First scrape; its failure stops the start so a wrong URL is seen at once."""
        try:
            reading = await self._read(now)
        except (TimeoutError, aiohttp.ClientError, DcgmScrapeFailed) as error:
            await self.close()
            raise DcgmScrapeFailed(f"cannot scrape {self.url}: {error}") from error
        return reading.inventory

    async def sample(self, timestamp: float) -> list[GpuSample]:
        try:
            reading = await self._read(timestamp)
        except (TimeoutError, aiohttp.ClientError, DcgmScrapeFailed) as error:
            self.errors["scrape"] += 1
            log.warning("scrape of %s failed: %s", self.url, error)
            return []
        return list(reading.samples)

    async def reopen(self, now: float) -> GpuInventory:
        """The exporter's page again: its inventory is rebuilt from every scrape."""
        return (await self._read(now)).inventory

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
