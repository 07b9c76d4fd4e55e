"""DcgmExporterSource against a real HTTP server on loopback serving an exporter page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from kumiki.agent.adapters.dcgm import DcgmExporterSource, DcgmScrapeFailed, url_error

PAGE = (Path(__file__).parent.parent / "fixtures" / "dcgm_exporter_a100_mig.prom").read_text(encoding="utf-8")


class Exporter:
    """A loopback stand-in for dcgm-exporter whose answers the test can change."""

    def __init__(self) -> None:
        self.page = PAGE
        self.status = 200
        self.requests = 0
        self.url = ""

    async def metrics(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.Response(text=self.page, status=self.status, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    state = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", state.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}/metrics"
    yield state
    await runner.cleanup()


async def test_scrapes_inventory_and_samples_over_http(exporter: Exporter) -> None:
    source = DcgmExporterSource(exporter.url, "gpu-node-7")
    try:
        inventory = await source.open(now=1_700_000_000.0)
        samples = await source.sample(timestamp=1_700_000_001.0)
    finally:
        await source.close()
    assert exporter.requests == 2
    assert len(inventory.gpus) == 3
    assert [(s.gpu_index, s.mig_instance_id) for s in samples] == [(0, None), (1, None), (1, 1), (1, 2), (2, None)]
    assert samples[0].labels["pod"] == "llama-ft-0"
    assert samples[0].fields.gpu_util_pct == 87.0
    assert {s.timestamp for s in samples} == {1_700_000_001.0}


async def test_a_failed_scrape_is_counted_and_sampling_goes_on(exporter: Exporter) -> None:
    source = DcgmExporterSource(exporter.url, "gpu-node-7")
    try:
        await source.open(now=1.0)
        exporter.status = 503
        assert await source.sample(timestamp=2.0) == []
        exporter.status = 200
        exporter.page = PAGE + 'DCGM_FI_DEV_GPU_UTIL{gpu="0" broken\n'
        samples = await source.sample(timestamp=3.0)
    finally:
        await source.close()
    assert source.errors["scrape"] == 1
    assert source.errors["exporter_line"] == 1
    assert len(samples) == 5


async def test_an_unreachable_exporter_stops_the_start(exporter: Exporter) -> None:
    exporter.status = 404
    source = DcgmExporterSource(exporter.url, "gpu-node-7")
    with pytest.raises(DcgmScrapeFailed, match="HTTP 404"):
        await source.open(now=1.0)


def test_urls_are_checked() -> None:
    assert url_error("http://localhost:9400/metrics") is None
    assert url_error("localhost:9400") is not None
    assert url_error("ftp://x/metrics") is not None
