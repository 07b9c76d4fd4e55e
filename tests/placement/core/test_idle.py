"""Idle-reclaim rules per queue, pure: the option's text parsed, and a bad entry named."""

from __future__ import annotations

import pytest

from kumiki.placement.core import IdlePolicy, parse_idle_reclaim


def test_idle_reclaim_rules_parse_and_name_the_bad_entry() -> None:
    rules = parse_idle_reclaim("team=waiting:600, batch=after:1800, *=never")
    assert rules == {"team": IdlePolicy("waiting", 600.0), "batch": IdlePolicy("after", 1800.0), "*": IdlePolicy()}
    for bad in ("team=sometimes", "team=after:soon", "=after:1", "team=after:-5"):
        with pytest.raises(ValueError, match=bad.split(",")[0].replace("*", r"\*")):
            parse_idle_reclaim(bad)
