"""Generated code must match proto/: regenerate into a temporary folder and compare byte for byte."""

from pathlib import Path

from kumiki.common.contracts import codegen


def test_generated_code_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "v1"
    codegen.generate(fresh)
    committed = codegen.DEFAULT_OUTPUT
    fresh_files = sorted(p.name for p in fresh.iterdir())
    committed_files = sorted(p.name for p in committed.iterdir() if p.is_file() and p.suffix in (".py", ".pyi"))
    assert fresh_files == committed_files, "run: python -m kumiki.common.contracts.codegen"
    stale = [name for name in fresh_files if (fresh / name).read_bytes() != (committed / name).read_bytes()]
    assert not stale, f"stale generated files {stale}; run: python -m kumiki.common.contracts.codegen"


def test_every_message_field_is_documented() -> None:
    """Contracts are documented field by field: each field has a comment on or above it."""
    undocumented = []
    for proto in codegen.proto_files():
        lines = proto.read_text().splitlines()
        for number, line in enumerate(lines):
            stripped = line.strip()
            is_field = (
                stripped.endswith(";") and "=" in stripped and not stripped.startswith(("option", "//", "syntax"))
            )
            if not is_field or stripped.split()[0].isupper():  # enum values carry trailing comments or none
                continue
            above = lines[number - 1].strip() if number else ""
            if "//" not in line and not above.startswith("//"):
                undocumented.append(f"{proto.name}:{number + 1}: {stripped}")
    assert not undocumented, undocumented
