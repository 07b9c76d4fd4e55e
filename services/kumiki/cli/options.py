"""Command-line values checked after parsing: a wrong one is a `UsageError`, one line naming the option."""

from __future__ import annotations

import sys
from collections.abc import Callable

from kumiki.cli.main import UsageError


def whole_number_option(value: str, option: str, minimum: int) -> int:
    from kumiki.common.config import ConfigError, whole_number

    try:
        return whole_number(value, option, minimum=minimum)
    except ConfigError as error:
        raise UsageError(str(error)) from None


def number_option(value: str | None, option: str, minimum: float | None = 0.0) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{option} must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise UsageError(f"{option} must be finite, got {value!r}")
    if minimum is not None and number < minimum:
        raise UsageError(f"{option} must be >= {minimum:g}, got {value}")
    return number


def names_option(value: str, option: str, known: tuple[str, ...]) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise UsageError(f"{option} must name at least one of {', '.join(known)}")
    for name in names:
        if name not in known:
            raise UsageError(f"{option}: unknown {name!r} (known: {', '.join(known)})")
    if len(set(names)) != len(names):
        raise UsageError(f"{option} repeats a name")
    return names


def seeds_option(value: str) -> list[int]:
    from kumiki.common.config import ConfigError, whole_numbers

    try:
        return whole_numbers(value, "--seeds", minimum=0)
    except ConfigError as error:
        raise UsageError(str(error)) from None


def key_file_option(path: str | None, variable: str) -> bytes:
    """The HMAC key in `--key-file` (default: the file $variable names), at least MIN_KEY_BYTES."""
    from pathlib import Path

    from kumiki.common.config import ConfigError, read_key

    if not path:
        raise UsageError(f"--key-file: required (or set {variable})")
    try:
        return read_key(Path(path), "--key-file")
    except ConfigError as error:
        raise UsageError(str(error)) from None


def print_secrets(names: list[str], secret: Callable[[str], str]) -> None:
    """One name: its secret alone, to redirect into a file; several: `name<TAB>secret` a line."""
    if len(names) == 1:
        sys.stdout.write(secret(names[0]) + "\n")
    else:
        sys.stdout.writelines(f"{name}\t{secret(name)}\n" for name in names)
