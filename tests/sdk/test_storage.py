"""Atomic checkpoint writes: a failed write leaves the old file whole and no temporary behind."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from kumiki.sdk import atomic_write, path_of, uri_of


def test_a_write_replaces_the_whole_file_and_a_failed_one_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "ckpt.bin"
    atomic_write(target, lambda file: file.write(b"first"))
    assert target.read_bytes() == b"first"

    def fails(file: BinaryIO) -> None:
        file.write(b"half of the sec")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fails)
    assert target.read_bytes() == b"first"
    assert sorted(path.name for path in target.parent.iterdir()) == ["ckpt.bin"]


def test_uris_round_trip_and_remote_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    assert path_of(uri_of(path)) == path.resolve()
    assert path_of("relative/c.npz") == Path("relative/c.npz")
    with pytest.raises(ValueError, match="only file://"):
        path_of("s3://bucket/c.npz")


def test_the_pytorch_helper_restores_bitwise(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from kumiki.sdk.torch import load_state, save_state

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    uri = save_state(tmp_path / "state.pt", model, optimizer, step=5)
    expected = torch.rand(3)
    other = torch.nn.Linear(4, 2)
    assert load_state(uri, other, torch.optim.SGD(other.parameters(), lr=0.1)) == 5
    assert torch.equal(other.weight, model.weight) and torch.equal(torch.rand(3), expected)
