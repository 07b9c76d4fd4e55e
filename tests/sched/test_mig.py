import pytest

from kumiki.sched.mig import MigError, free_starts, profile_for, usable_capacity, validate_layout


def test_valid_a100_layouts_are_accepted():
    assert validate_layout("A100-40GB", [("3g.20gb", 0), ("3g.20gb", 4)]) == 0b11111111
    assert validate_layout("A100-40GB", [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]) == 0b01111111
    assert validate_layout("H100-80GB", [("1g.10gb", slot) for slot in range(7)]) == 0b01111111


@pytest.mark.parametrize(
    ("model", "layout", "message"),
    [
        ("A100-40GB", [("3g.20gb", 2)], "cannot start at slot 2"),
        ("A100-40GB", [("4g.20gb", 0), ("4g.20gb", 0)], "overlaps"),
        ("A100-40GB", [("3g.20gb", 4), ("1g.5gb", 6)], "overlaps"),
        ("A100-40GB", [("7g.40gb", 0), ("1g.5gb", 0)], "overlaps"),
        ("A100-40GB", [("1g.10gb", 0)], "not valid on A100-40GB"),
        ("V100-32GB", [("1g.5gb", 0)], "does not support MIG"),
    ],
)
def test_invalid_layouts_are_rejected(model, layout, message):
    with pytest.raises(MigError, match=message):
        validate_layout(model, layout)


def test_free_starts_respect_occupied_slots():
    three = profile_for("A100-40GB", "3g.20gb")
    assert free_starts(0, three) == [0, 4]
    assert free_starts(profile_for("A100-40GB", "1g.5gb").mask(5), three) == [0]
    assert free_starts(0b00010001, three) == []


def test_usable_capacity_counts_what_the_mix_can_still_use():
    one = profile_for("A100-40GB", "1g.5gb")
    four = {"4g.20gb": 1.0}
    assert usable_capacity("A100-40GB", 0, four) == 4.0
    assert usable_capacity("A100-40GB", one.mask(6), four) == 4.0  # 4g starts only at slot 0
    assert usable_capacity("A100-40GB", one.mask(0), four) == 0.0
