"""Kubernetes quantities as plain numbers; a bad one names its field."""

from __future__ import annotations

import pytest

from kumiki.binder import core


def test_quantities() -> None:
    assert core.quantity("500m", "x") == 0.5
    assert core.quantity("2", "x") == 2
    assert core.quantity("1Gi", "x") == 2**30
    assert core.quantity("1.5G", "x") == 1.5e9
    with pytest.raises(core.PodSpecError, match="x: not a quantity"):
        core.quantity("lots", "x")
