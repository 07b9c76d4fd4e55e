"""The efficiency report of a replay: baseline against Kumiki on the same trace and cluster, as Markdown and a
PNG, from the run's own results (results.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kumiki.common.config import read_json

ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, summary key, format)
    ("jobs completed", "completed", "{:,.0f}"),
    ("average JCT (s)", "avg_jct_s", "{:,.0f}"),
    ("p95 JCT (s)", "p95_jct_s", "{:,.0f}"),
    ("average queueing (s)", "avg_queue_s", "{:,.0f}"),
    ("makespan (s)", "makespan_s", "{:,.0f}"),
    ("GPUs allocated while jobs wait", "allocation_under_backlog", "{:.1%}"),
    ("GPUs computing while jobs wait", "utilisation_under_backlog", "{:.1%}"),
    ("idle GPU-hours (allocated, computing nothing)", "idle_gpu_h", "{:,.1f}"),
    ("idle jobs found by telemetry (attempts)", "idle_found", "{:,.0f}"),
    ("idle jobs reclaimed (checkpointed, requeued)", "idle_reclaimed", "{:,.0f}"),
    ("telemetry found a zombie after (s, median)", "idle_found_after_s", "{:,.0f}"),
    ("idle reclaim evicted a found zombie after (s, median)", "idle_reclaimed_after_s", "{:,.0f}"),
    ("lost GPU-hours (preemption)", "lost_gpu_h", "{:,.1f}"),
    ("jobs completed per GPU-hour", "jobs_per_gpu_h", "{:.3f}"),
)


def load_results(run: Path) -> dict[str, Any]:
    path = run / "results.json" if run.is_dir() else run
    data = read_json(path, "--run")
    if not isinstance(data, dict) or not isinstance(data.get("phases"), dict):
        raise ValueError(f"--run: {path} has no 'phases' (not a replay's results.json)")
    return data


DELAYS = {"idle_found_after_s", "idle_reclaimed_after_s"}  # how long telemetry and reclaim took
NO_RATIO = {"idle_found", "idle_reclaimed", *DELAYS}  # counts of events and delays, not figures of merit


def _cell(value: float, key: str, fmt: str) -> str:
    return "-" if key in DELAYS and not value else fmt.format(value)  # nothing found or reclaimed: no delay


def _ratio(baseline: float, kumiki: float, key: str) -> str:
    if baseline == 0 or kumiki == 0 or key in NO_RATIO:
        return "-"
    better_high = key in {"completed", "allocation_under_backlog", "utilisation_under_backlog", "jobs_per_gpu_h"}
    return (
        f"{kumiki / baseline:.2f}x"
        if better_high
        else f"{baseline / kumiki:.2f}x better"
        if kumiki < baseline
        else f"{kumiki / baseline:.2f}x worse"
    )


def _progress_line(results: dict[str, Any]) -> list[str]:
    """The progress-report scenario, when the run had one (a results.json from before it has no such key)."""
    scenario = results.get("progress_reports")
    if not scenario:
        return []
    sent = ", ".join(f"{name} {phase.get('progress_reported', 0):,}" for name, phase in results["phases"].items())
    reporters = results.get("progress_reporters", 0)
    who = "1 job reports" if reporters == 1 else f"{reporters:,} jobs report"
    return ["", f"{scenario}: {who} here; reports sent: {sent}."]


def markdown(results: dict[str, Any]) -> str:
    phases = results["phases"]
    names = [name for name in ("baseline", "kumiki", "open") if name in phases]
    compare = "baseline" in phases and "kumiki" in phases
    lines = [
        f"# Replay: {results['trace']} ({results['jobs']} jobs, {results['idle_jobs']} idle), "
        f"{results['nodes']} x {results['gpus_per_node']} GPUs at {results['speed']:g}x"
        + (", pods through the binder on a real API server (KWOK nodes)" if results.get("via") == "pods" else ""),
        *_progress_line(results),
        "",
        "| | "
        + " | ".join(f"{name} ({phases[name]['policy']})" for name in names)
        + (" | Kumiki vs baseline |" if len(names) == 2 else " |"),
        "|---|" + "---|" * len(names) + ("---|" if len(names) == 2 else ""),
    ]
    for label, key, fmt in ROWS:
        if any(key not in phases[name]["summary"] for name in names):
            continue  # a results.json from before this figure existed
        cells = [_cell(phases[name]["summary"][key], key, fmt) for name in names]
        row = f"| {label} | " + " | ".join(cells) + " |"
        if compare:
            row += f" {_ratio(phases['baseline']['summary'][key], phases['kumiki']['summary'][key], key)} |"
        lines.append(row)
    simulated = results.get("simulated_kumiki") or {}
    if "error" in simulated:
        lines += ["", f"Live against simulated: {simulated['error']}"]
    for name in ("open", "kumiki"):
        if not simulated or "avg_jct_s" not in simulated or name not in phases:
            continue
        live = phases[name]["summary"]["avg_jct_s"]
        lines += [
            "",
            f"Live ({name}) against simulated without quota (same jobs, cluster and policy):"
            f" average JCT {live:,.0f} s live, {simulated['avg_jct_s']:,.0f} s simulated"
            f" ({live / simulated['avg_jct_s'] - 1:+.1%}).",
        ]
        break
    twins = results.get("simulated_phases") or {}
    rows = [name for name in names if "avg_jct_s" in twins.get(name, {})]
    if rows:
        lines += [
            "",
            "Each phase against its simulated twin (same jobs, cluster, policy and queue tree; quota's own core"
            " admits in the simulator; the same zombies, reclaimed by placement's idle rule):",
            "",
            "| phase | live avg JCT s | simulated avg JCT s | live against simulated "
            "| idle found, live / simulated | idle reclaims, live / simulated |",
            "|---|---|---|---|---|---|",
        ]
        for name in rows:
            live, twin = phases[name]["summary"]["avg_jct_s"], twins[name]["avg_jct_s"]
            found, reclaims = (
                f"{phases[name]['summary'].get(key, 0):,.0f} / "
                + (f"{twins[name][key]:,.0f}" if key in twins[name] else "n/a")
                for key in ("idle_found", "idle_reclaimed")
            )
            lines.append(f"| {name} | {live:,.0f} | {twin:,.0f} | {live / twin - 1:+.1%} | {found} | {reclaims} |")
        found_after = {name: twins[name]["idle_found_after_s"] for name in rows if "idle_found_after_s" in twins[name]}
        delays = [f"{name} {delay:,.0f} s" for name, delay in found_after.items() if delay is not None]
        if found_after and not delays:
            lines += ["", "Telemetry finds no zombie on this path (its nodes send no GPU samples), nor does a twin."]
        if delays:
            lines += [
                "",
                "A twin finds a zombie as late as its live phase did (the median, from the bind to telemetry's"
                f" finding: {', '.join(delays)}); telemetry's rule is {results.get('idle_after_s', 600):,.0f} s below"
                " 5%, and sampling, batching and the broker add their part of a wall second, times the speed-up.",
            ]
    for name in names:
        if "error" in twins.get(name, {}):
            lines += ["", f"Simulated {name}: {twins[name]['error']}"]
    for name in names:
        problems = phases[name]["problems"]
        lines.append("")
        lines.append(
            f"Invariants, {name}: "
            + ("every job completed once, no GPU held by two jobs." if not problems else "; ".join(problems))
        )
    baseline_def = (
        "Baseline: static per-queue quotas (each queue capped at its guaranteed share of the cluster, no borrowing) "
        "with FIFO, the way most clusters run today. Kumiki: the same guarantees with idle GPUs lent to whoever "
        "waits, and the stack's placement policy. Open: the stack's policy with no quota admission. The simulator"
        " runs each phase's twin with its queue tree (quota's core admits). Times are trace seconds (wall clock x"
        " speed-up)."
    )
    lines += ["", baseline_def, ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = results["phases"]
    names = [name for name in ("baseline", "kumiki", "open") if name in phases]
    colours = {"baseline": "#999999", "kumiki": "#4c72b0", "open": "#55a868"}
    panels = (
        ("average and p95 JCT (h)", ("avg_jct_s", "p95_jct_s"), 1 / 3600),
        ("GPUs while jobs wait", ("allocation_under_backlog", "utilisation_under_backlog"), 100.0),
        ("jobs per GPU-hour", ("jobs_per_gpu_h",), 1.0),
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    for axis, (title, keys, scale) in zip(axes, panels, strict=True):
        width = 0.8 / max(1, len(names))
        for offset, name in enumerate(names):
            values = [phases[name]["summary"][key] * scale for key in keys]
            positions = [index + offset * width for index in range(len(keys))]
            axis.bar(positions, values, width, label=name, color=colours[name])
        axis.set_xticks([index + width * (len(names) - 1) / 2 for index in range(len(keys))])
        labels = {
            "avg_jct_s": "avg",
            "p95_jct_s": "p95",
            "allocation_under_backlog": "allocated %",
            "utilisation_under_backlog": "computing %",
            "jobs_per_gpu_h": "",
        }
        axis.set_xticklabels([labels[key] for key in keys])
        axis.set_title(title)
    axes[0].legend()
    figure.suptitle(
        f"{results['trace']}: {results['jobs']} jobs on {results['nodes']} x {results['gpus_per_node']} GPUs, live"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, png = out / "report.md", out / "report.png"
    plot(results, png)
    md.write_text(markdown(results) + f"\n![report]({png.name})\n")
    return md, png
