"""Real Jaeger (built from the Go module proxy) and real Prometheus (Debian) for the observability tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from kumiki.common.tracing import configure_tracing
from kumiki.devstack.observability import BUILD_JAEGER, JaegerProcess, jaeger_binary, prometheus_binary, start_jaeger
from kumiki.devstack.processes import terminate


@pytest.fixture(scope="session")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JaegerProcess]:
    """One Jaeger for the session (tests find their own traces by trace id or job id); the test process's
    own spans (the caller's) go there too."""
    if jaeger_binary() is None:
        pytest.skip(f"no Jaeger binary: build it with `bash {BUILD_JAEGER}` (CI builds it in the background)")
    folder = tmp_path_factory.mktemp("jaeger")
    process = start_jaeger(folder, folder / "jaeger.log")
    configure_tracing("test", None, exporter=OTLPSpanExporter(endpoint=process.otlp_endpoint))
    yield process
    terminate(process.pid)


@pytest.fixture(scope="session")
def prometheus_available() -> None:
    if prometheus_binary() is None:
        pytest.skip("no prometheus binary: apt-get install prometheus (CI installs it)")
