"""Fixtures for the node agent tests: the fake NVML library, compiled once per session."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

from .fake_nvml.build import LIBRARY_NAME, FakeNvmlConfig, build_library


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the freshly compiled fake libnvidia-ml.so.1."""
    folder = tmp_path_factory.mktemp("fake_nvml")
    build_library(folder)
    return folder


@dataclass
class FakeNvml:
    library_dir: Path
    config_path: Path
    monkeypatch: pytest.MonkeyPatch

    def configure(self, config: FakeNvmlConfig) -> Path:
        """Write the config the next nvmlInit reads (the fake re-reads it at every init)."""
        config.write(self.config_path)
        self.monkeypatch.setenv("FAKE_NVML_CONFIG", str(self.config_path))
        return self.config_path

    def subprocess_env(self) -> dict[str, str]:
        """Environment for a child process: pynvml there loads the fake by its soname."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            part for part in (str(self.library_dir), env.get("LD_LIBRARY_PATH", "")) if part
        )
        env["FAKE_NVML_CONFIG"] = str(self.config_path)
        return env


@pytest.fixture
def fake_nvml(fake_nvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """pynvml in this process bound to the fake library.

    The dynamic loader reads LD_LIBRARY_PATH only at process start, so in-process tests hand pynvml
    the already-opened fake as its library handle; the agent's pynvml calls are unchanged. Tests that
    run the agent as a process use `subprocess_env()` and pynvml's own CDLL("libnvidia-ml.so.1").
    """
    library = ctypes.CDLL(str(fake_nvml_dir / LIBRARY_NAME))
    monkeypatch.setattr(pynvml, "nvmlLib", library)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    yield FakeNvml(fake_nvml_dir, tmp_path / "fake_nvml.ini", monkeypatch)
    # The library stays loaded for the session: undo any init a failed test left behind, so the
    # next test's nvmlInit reads its own config.
    for _ in range(100):
        if library.nvmlShutdown() != 0:
            break
