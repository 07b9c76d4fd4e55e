"""Did a change to `kumiki` move it beyond the runs' own chaos? Two `sim_spread.py` reports, cell by cell.

    PYTHONPATH=services .venv/bin/python benchmarks/spread_diff.py BEFORE/report.json AFTER/report.json \
        [BEFORE2/report.json AFTER2/report.json ...]

The reports come in pairs, before and after the change; the cells of every pair are pooled (the weeks of a 48 x 8
and a 64 x 8 pair are told apart by their size). `benchmarks/sim_spread.py` runs every cell (a load, a
VC mix, a shift, a week built from the slice's days) under several ordering seeds, and a week's recovered share
moves by tens of points between seeds: a change measured as "+5 points on the mean of nine weeks" may be nothing.
This pairs the two reports' cells (the same cells, the same seeds, so the same references unless the change moved
them) and gives, per part and over all shared cells:

- the mean change of the recovered share (points), a 95% bootstrap interval for it and a sign-flip p-value
  (`kumiki.sim.report.paired_change`: how likely a mean change as large is if each cell's sign were a coin toss);
- the cells that improved and worsened, and the cells where `kumiki` fell behind `kumiki-noforecast`;
- the same for `kumiki`'s average JCT itself (its ratio after / before, in percent), which does not divide by the
  oracle's gain and so is less noisy where that gain is small.

Prints markdown. Exits 2 with the file and field named when a report is not a `sim_spread.py` report or the two
share no cell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kumiki.common.config import ConfigError, read_json
from kumiki.sim.report import PairedChange, paired_change

PARTS = ("load", "mix", "shift", "week")
KUMIKI, NOFORECAST = "kumiki", "kumiki-noforecast"


class ReportError(ValueError):
    """A file that is not a readable `sim_spread.py` report."""


def load_cells(path: Path) -> dict[str, dict[str, Mapping[str, Any]]]:
    """part -> cell label -> cell, each cell checked for the fields this compares."""
    try:
        report = read_json(path, "reports")
    except ConfigError as error:
        raise ReportError(str(error)) from None
    if not isinstance(report, dict) or "config" not in report:
        raise ReportError(f"{path}: not a sim_spread.py report (no 'config')")
    parts: dict[str, dict[str, Mapping[str, Any]]] = {}
    for part in PARTS:
        cells = report.get(part)
        if not cells:
            continue
        if not isinstance(cells, dict):
            raise ReportError(f"{path}: {part}: expected an object of cells")
        for label, cell in cells.items():
            jct = cell.get("avg_jct_s") if isinstance(cell, dict) else None
            if not isinstance(jct, dict) or not all(
                isinstance(jct.get(name), (int, float)) for name in (KUMIKI, NOFORECAST)
            ):
                raise ReportError(f"{path}: {part}.{label}.avg_jct_s: needs numbers for {KUMIKI} and {NOFORECAST}")
            share = cell.get("recovered_share")
            if share is not None and not isinstance(share, (int, float)):
                raise ReportError(f"{path}: {part}.{label}.recovered_share: not a number")
        if part == "week":  # the same day orders are other cells at another size
            nodes = report["config"].get("week_nodes")
            cells = {f"{nodes} x 8: {label}": cell for label, cell in cells.items()}
        parts[part] = cells
    return parts


def describe(change: PairedChange, unit: str, scale: float) -> str:
    verdict = "told apart from chaos" if change.decided() else "within the runs' chaos"
    p_value = "< 0.001" if change.p_value < 0.001 else f"= {change.p_value:.3f}"
    return (
        f"{scale * change.mean:+.1f}{unit} (95% interval {scale * change.low:+.1f} to {scale * change.high:+.1f};"
        f" sign-flip p {p_value}, {verdict}); better in {change.better} of {change.cells} cells,"
        f" worse in {change.worse}"
    )


Pairs = tuple[list[float], list[float]]  # a figure's values before and after, cell by cell


def summary_lines(shares: Pairs, speed: Pairs) -> list[str]:
    """The paired changes of the share (where both runs have one) and of `kumiki`'s average JCT."""
    lines = [f"- recovered share: {describe(paired_change(*shares), ' points', 100.0)}"] if shares[0] else []
    return [*lines, f"- `kumiki`'s average JCT shorter by {describe(paired_change(*speed), '%', 100.0)}"]


def compare(
    before: Mapping[str, Mapping[str, Mapping[str, Any]]], after: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> str:
    """The markdown comparison of two reports' shared cells."""
    lines: list[str] = []
    all_shares: Pairs = ([], [])
    all_speed: Pairs = ([], [])
    parts_shown = 0
    for part in PARTS:
        shared = [label for label in before.get(part, {}) if label in after.get(part, {})]
        if not shared:
            continue
        lines += [
            f"### {part}",
            "",
            "| cell | kumiki s before | after | after / before | share before | after | change (points)"
            " | behind no forecasts (before / after) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        parts_shown += 1
        shares: Pairs = ([], [])
        speed: Pairs = ([], [])
        for label in shared:
            old, new = before[part][label], after[part][label]
            old_jct, new_jct = old["avg_jct_s"][KUMIKI], new["avg_jct_s"][KUMIKI]
            old_share, new_share = old.get("recovered_share"), new.get("recovered_share")
            behind = (
                f"{'yes' if old_jct > old['avg_jct_s'][NOFORECAST] else 'no'}"
                f" / {'yes' if new_jct > new['avg_jct_s'][NOFORECAST] else 'no'}"
            )
            if old_share is not None and new_share is not None:
                shares[0].append(old_share)
                shares[1].append(new_share)
                share_text = f"{100 * old_share:.1f}% | {100 * new_share:.1f}% | {100 * (new_share - old_share):+.1f}"
            else:
                share_text = "n/a | n/a | n/a"
            # higher is better for both figures: the JCT enters as its negative ratio to the one before
            speed[0].append(0.0)
            speed[1].append(1.0 - new_jct / old_jct)
            lines.append(
                f"| {label} | {old_jct:,.0f} | {new_jct:,.0f} | {new_jct / old_jct:.4f} | {share_text} | {behind} |"
            )
        lines += ["", *summary_lines(shares, speed), ""]
        for each, part_values in ((all_shares, shares), (all_speed, speed)):
            each[0].extend(part_values[0])
            each[1].extend(part_values[1])
    if not all_speed[0]:
        raise ReportError("the reports share no cell (run sim_spread.py with the same parts, sizes and weeks)")
    if parts_shown > 1:  # with one part, its lines are the whole
        lines += [f"**Over every shared cell** ({len(all_speed[0])}):", "", *summary_lines(all_shares, all_speed)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "reports", nargs="+", help="report.json files of sim_spread.py in pairs: before the change, after it, ..."
    )
    args = parser.parse_args()
    if len(args.reports) % 2:
        parser.error("reports: give them in pairs (before, after), got an odd number")
    before: dict[str, dict[str, Mapping[str, Any]]] = {}
    after: dict[str, dict[str, Mapping[str, Any]]] = {}
    try:
        for index in range(0, len(args.reports), 2):
            for pooled, path in ((before, args.reports[index]), (after, args.reports[index + 1])):
                for part, cells in load_cells(Path(path)).items():
                    pooled.setdefault(part, {}).update(cells)
        print(compare(before, after))
    except ReportError as error:
        print(f"spread_diff.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
