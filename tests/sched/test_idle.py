"""kumiki.sched.idle: idle-reclaim rules per queue, pure; the option's text parsed, and a bad entry named."""

from __future__ import annotations

import pytest

from kumiki.sched.idle import IdlePolicy, parse_idle_reclaim, rule_for


def test_idle_reclaim_rules_parse_and_name_the_bad_entry() -> None:
    rules = parse_idle_reclaim("team=waiting:600, batch=after:1800, *=never")
    assert rules == {"team": IdlePolicy("waiting", 600.0), "batch": IdlePolicy("after", 1800.0), "*": IdlePolicy()}
    for bad in ("team=sometimes", "team=after:soon", "=after:1", "team=after:-5"):
        with pytest.raises(ValueError, match=bad.split(",")[0].replace("*", r"\*")):
            parse_idle_reclaim(bad)


def test_a_queue_without_its_own_rule_takes_the_star_rule_else_never() -> None:
    rules = parse_idle_reclaim("team=after:60, *=waiting:0")
    assert rule_for(rules, "team") == IdlePolicy("after", 60.0)
    assert rule_for(rules, "other") == IdlePolicy("waiting", 0.0)
    assert rule_for(parse_idle_reclaim("team=after:60"), "other") == IdlePolicy()


@pytest.mark.parametrize(
    ("rule", "idle_for_s", "waiting", "reclaimed"),
    [
        (IdlePolicy(), 1e9, True, False),  # never, however long and whoever waits
        (IdlePolicy("after", 600.0), 599.0, True, False),  # not idle long enough
        (IdlePolicy("after", 600.0), 600.0, False, True),  # after: nobody needs to wait
        (IdlePolicy("waiting", 600.0), 900.0, False, False),  # waiting: only for someone
        (IdlePolicy("waiting", 600.0), 900.0, True, True),
        (IdlePolicy("waiting", 600.0), 300.0, True, False),
    ],
)
def test_a_rule_reclaims_past_its_time_and_under_waiting_only_for_someone(
    rule: IdlePolicy, idle_for_s: float, waiting: bool, reclaimed: bool
) -> None:
    assert rule.reclaims(idle_for_s, waiting) is reclaimed
    assert rule.may_reclaim(idle_for_s) is (rule.mode != "never" and idle_for_s >= rule.idle_s)
