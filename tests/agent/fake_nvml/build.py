"""Builds the fake libnvidia-ml.so.1 and writes its configuration file (see fake_nvml.c)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"

Section = Mapping[str, object]


def build_library(out_dir: Path) -> Path:
    """Compile the fake into out_dir/libnvidia-ml.so.1 (SONAME as the real one) and return its path."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH: the fake NVML library cannot be built")
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY_NAME
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-Wl,-soname,{LIBRARY_NAME}",
            "-o",
            str(library),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return library


def _value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


@dataclass
class FakeNvmlConfig:
    """What the fake library reports; section keys are those fake_nvml.c reads."""

    gpus: list[Section]
    system: Section = field(default_factory=dict)
    migs: Sequence[Section] = ()
    nvlinks: Sequence[Section] = ()
    topology: Sequence[Section] = ()
    xids: Sequence[Section] = ()

    def text(self) -> str:
        lines: list[str] = []
        groups: list[tuple[str, Sequence[Section]]] = [
            ("system", [self.system] if self.system else []),
            ("gpu", self.gpus),
            ("mig", self.migs),
            ("nvlink", self.nvlinks),
            ("topology", self.topology),
            ("xid", self.xids),
        ]
        for name, sections in groups:
            for section in sections:
                lines.append(f"[{name}]")
                lines.extend(f"{key} = {_value(value)}" for key, value in section.items())
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(self.text(), encoding="utf-8")
        return path
