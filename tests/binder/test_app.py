"""The leader's first lists wait out a busy API server (what a 1,000-node benchmark run met: "storage is
(re)initializing", a 429 while the watch cache fills) and give up on anything else, or past their deadline."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kumiki.binder import app
from kumiki.binder.adapters.lane import ApiStatusError
from kumiki.common.config import KafkaSettings
from tests.conftest import REPO_ROOT


class Answers:
    """An API call that fails with the given errors, one per call, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "answered"


async def test_a_busy_or_restarting_api_server_is_asked_again_until_it_answers() -> None:
    call = Answers(
        ApiStatusError(429, "storage is (re)initializing"),
        ApiStatusError(503, "service unavailable"),
        ConnectionResetError("connection reset by peer"),
    )
    assert await app._until_answered("list pods", call, deadline_s=30) == "answered"
    assert call.calls == 4


@pytest.mark.parametrize("code", [400, 403, 404, 409, 422])
async def test_an_answer_that_asking_again_cannot_change_stands_at_once(code: int) -> None:
    call = Answers(ApiStatusError(code, "no"))
    with pytest.raises(ApiStatusError) as raised:
        await app._until_answered("list pods", call, deadline_s=30)
    assert raised.value.code == code and call.calls == 1


async def test_past_its_deadline_the_busy_answer_stands() -> None:
    call = Answers(*(ApiStatusError(429, "storage is (re)initializing") for _ in range(50)))
    with pytest.raises(ApiStatusError, match="storage is"):
        await app._until_answered("list pods", call, deadline_s=1.0)
    assert 2 <= call.calls < 10  # backoff from 0.2 s: a few tries, not a busy loop


@pytest.mark.kafka
def test_a_bad_reason_refresh_interval_stops_the_binder_with_one_line(kafka: KafkaSettings) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")},
        "PYTHONPATH": str(REPO_ROOT / "services"),
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_BINDER_GRPC_PORT": "0",
        "KUMIKI_BINDER_HTTP_PORT": "0",
        "KUMIKI_BINDER_REASON_REFRESH_S": "often",
        "KUMIKI_LOG_LEVEL": "WARNING",
    }
    done = subprocess.run([sys.executable, "-m", "kumiki.binder"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kumiki-binder: configuration error: KUMIKI_BINDER_REASON_REFRESH_S: ")
