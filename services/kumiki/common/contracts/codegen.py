"""Generate Python code from proto/kumiki/v1 (protobuf messages, gRPC stubs, type stubs).

Run `python -m kumiki.common.contracts.codegen` after editing a .proto file. The output is committed and
a test regenerates it into a temporary folder and compares, so stale generated code fails CI. Output
depends on the grpcio-tools version, which pyproject.toml pins for that reason.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_PACKAGE = Path("kumiki/v1")
OUTPUT_PACKAGE = "kumiki.common.contracts.v1"
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "v1"

_IMPORT = re.compile(r"^from kumiki\.v1 import ", re.MULTILINE)
_IMPORT_PYI = re.compile(r"^import kumiki\.v1\.(\w+)$", re.MULTILINE)
_REF_PYI = re.compile(r"\bkumiki\.v1\.(\w+_pb2)\b")


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))


def _rewrite(text: str) -> str:
    """Generated modules import each other as `kumiki.v1`; they live in `kumiki.common.contracts.v1`."""
    text = _IMPORT.sub(f"from {OUTPUT_PACKAGE} import ", text)
    text = _IMPORT_PYI.sub(rf"import {OUTPUT_PACKAGE}.\1", text)
    return _REF_PYI.sub(rf"{OUTPUT_PACKAGE}.\1", text)


def generate(output: Path) -> list[Path]:
    """Write the generated package into `output` (replacing it) and return the files written."""
    from grpc_tools import protoc  # dev dependency: imported only when generating

    include = Path(protoc.__file__).resolve().parent / "_proto"
    scripts = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as scratch:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={scratch}",
            f"--grpc_python_out={scratch}",
            f"--plugin=protoc-gen-mypy={scripts / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={scripts / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={scratch}",
            f"--mypy_grpc_out={scratch}",
            *(str(path.relative_to(PROTO_ROOT)) for path in proto_files()),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed; see the messages above")
        produced = Path(scratch) / PROTO_PACKAGE
        if output.exists():
            shutil.rmtree(output)
        output.mkdir(parents=True)
        written = []
        for source in sorted(produced.iterdir()):
            target = output / source.name
            target.write_text(_rewrite(source.read_text()))
            written.append(target)
        init = output / "__init__.py"
        init.write_text('"""Generated from proto/kumiki/v1 by kumiki.common.contracts.codegen; do not edit."""\n')
        written.append(init)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT, help="output package folder")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
