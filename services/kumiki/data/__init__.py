"""Data the project ships: real cluster traces (provenance and licences in traces/README.md).

A clone or an installed wheel has them, so the simulator, the replay, the tests and the benchmarks never
read a path outside the project. `resolve_trace` lets every command take either a path or a bundled name.
"""

from __future__ import annotations

from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parent / "traces"


def bundled_traces() -> list[str]:
    """Names of the bundled traces (file names without `.csv`), sorted."""
    return sorted(path.stem for path in TRACES_DIR.glob("*.csv"))


def bundled_trace(name: str) -> Path:
    """The path of a bundled trace by name (`philly-slice` or `philly-slice.csv`)."""
    stem = name[:-4] if name.endswith(".csv") else name
    path = TRACES_DIR / f"{stem}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no bundled trace {name!r} (bundled: {', '.join(bundled_traces())})")
    return path


def resolve_trace(value: str | Path) -> Path:
    """A trace argument as given on a command line: an existing file, else the name of a bundled trace.

    Raises FileNotFoundError naming both what was looked for and what is bundled."""
    path = Path(value)
    if path.is_file():
        return path
    try:
        return bundled_trace(str(value))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{value}: no such file, and no bundled trace of that name (bundled: {', '.join(bundled_traces())})"
        ) from None
