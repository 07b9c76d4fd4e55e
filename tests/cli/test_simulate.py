import dataclasses
import json
from pathlib import Path

import pytest

from kumiki.cli.main import main
from kumiki.sim.report import REPORT_KEYS
from kumiki.sim.trace import load_jobs, write_jobs

TINY = Path(__file__).resolve().parents[1] / "sim" / "data" / "philly-tiny.csv"


def simulate(tmp_path, *extra):
    out = tmp_path / "out"
    code = main(["simulate", "--trace", str(TINY), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), *extra])
    return code, out


def test_simulate_writes_report_with_schema_and_sound_values(tmp_path):
    code, out = simulate(tmp_path, "--policy", "fifo,fifo-backfill,srtf-oracle,tiresias,kumiki-noforecast")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    trace = load_jobs(TINY)
    work = sum(job.duration_s * job.gpus for job in trace)
    longest = max(job.duration_s for job in trace)
    assert set(report["policies"]) == {"fifo", "fifo-backfill", "srtf-oracle", "tiresias", "kumiki-noforecast"}
    for name, row in report["policies"].items():
        assert set(REPORT_KEYS) <= set(row), name
        assert row["jobs"] == len(trace)
        assert row["p50_jct_s"] <= row["p95_jct_s"] <= row["p99_jct_s"]
        assert row["avg_queue_s"] >= 0 and row["avg_jct_s"] >= row["avg_queue_s"]
        assert row["makespan_s"] >= longest
        # utilisation: at least the trace's own work, never above the cluster
        assert work / (16 * row["makespan_s"]) - 1e-9 <= row["gpu_utilization"] <= 1.0
    assert report["policies"]["fifo"]["preemptions"] == 0
    assert report["policies"]["fifo"]["lost_gpu_hours"] == 0
    # on a queueing cluster, backfill and the SRTF reference beat strict FIFO
    fifo = report["policies"]["fifo"]["avg_jct_s"]
    assert report["policies"]["fifo-backfill"]["avg_jct_s"] < fifo
    assert report["policies"]["srtf-oracle"]["avg_jct_s"] < fifo
    assert report["config"]["checkpoint"] == {"interval_s": 1800.0, "checkpoint_cost_s": 60.0, "restore_cost_s": 60.0}
    table = (out / "report.md").read_text()
    assert "| fifo |" in table and "tiresias" in table
    for png in ("jct_cdf.png", "allocated_gpus.png", "queue_length.png"):
        assert (out / png).stat().st_size > 1000


def test_fifo_matches_a_hand_computed_schedule(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\n"
        "a,0,8,,,100,,q,,\n"
        "b,10,4,,,50,,q,,\n"
        "c,20,1,,,10,,q,,\n"
    )
    out = tmp_path / "o"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--nodes",
                "1",
                "--gpus-per-node",
                "8",
                "--policy",
                "fifo",
                "--out",
                str(out),
                "--no-plots",
            ]
        )
        == 0
    )
    row = json.loads((out / "report.json").read_text())["policies"]["fifo"]
    # a: 0-100; b: 100-150; c starts with b (fits beside it): 100-110
    assert row["avg_jct_s"] == pytest.approx((100 + 140 + 90) / 3)
    assert row["makespan_s"] == pytest.approx(150)


def test_window_and_seed_are_applied(tmp_path):
    code, out = simulate(
        tmp_path, "--policy", "fifo", "--start-s", "10000", "--end-s", "20000", "--seed", "3", "--no-plots"
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    expected = sum(1 for job in load_jobs(TINY) if job.submit_s is not None and 10000 <= job.submit_s < 20000)
    assert report["policies"]["fifo"]["jobs"] == expected and report["config"]["seed"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo,bogus"], "--policy: unknown 'bogus'"),
        (["--policy", "fifo", "--placement", "worst-fit"], "--placement: unknown"),
        (["--policy", "fifo", "--seed", "x"], "--seed must be a whole number"),
        (["--policy", "fifo", "--seeds", "0,1,0"], "--seeds repeats 0"),
        (["--policy", "fifo", "--seeds", "1,-2"], "--seeds must be >= 0"),
        (["--policy", "fifo", "--seeds", ","], "--seeds must list at least one whole number"),
        (["--policy", "fifo", "--seeds", "0,x"], "--seeds must list whole numbers, got 'x'"),
        (["--policy", "fifo", "--start-s", "5", "--end-s", "1"], "--end-s"),
        (["--policy", "fifo", "--checkpoint-cost-s", "-1"], "--checkpoint-cost-s must be >= 0"),
        (["--policy", "fifo", "--shift", "x100"], "--shift: unknown shift 'x100' (known: x10, new-vc)"),
        (["--policy", "kumiki", "--progress-reports", "0"], "--progress-reports must be >= 1"),
        (["--policy", "kumiki", "--progress-reports", "8", "--progress-share", "1.5"], "--progress-share must be <= 1"),
        (["--policy", "kumiki", "--progress-reports", "8", "--progress-noise", "-1"], "--progress-noise must be >= 0"),
        (["--policy", "fifo", "--idle-fraction", "1"], "--idle-fraction must be < 1, got 1"),
        (["--policy", "fifo", "--idle-fraction", "-0.1"], "--idle-fraction must be >= 0"),
        (["--policy", "fifo", "--idle-after-s", "0"], "--idle-after-s must be > 0, got 0"),
        (["--policy", "fifo", "--idle-reclaim", "q=soon"], "--idle-reclaim: 'q=soon': expected queue=never|after"),
        (
            ["--policy", "fifo", "--day-order", "1,0"],
            "--day-order: day order [1, 0] must list each of the trace's 1 days",
        ),
        (
            ["--policy", "fifo", "--day-order", "0,x"],
            "--day-order: day order '0,x' must be comma-separated day numbers",
        ),
    ],
)
def test_bad_options_name_the_option(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        simulate(tmp_path, *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_shifted_trace_is_simulated_and_reported(tmp_path):
    jobs = load_jobs(TINY)
    submits = [job.submit_s for job in jobs if job.submit_s is not None]
    middle = (min(submits) + max(submits)) / 2
    renamed = sum(1 for job in jobs if job.queue == "11cb48" and job.submit_s is not None and job.submit_s >= middle)
    code, out = simulate(tmp_path, "--policy", "fifo,kumiki", "--shift", "new-vc", "--no-plots")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["shift"] == {"name": "new-vc", "queue": "11cb48", "from_s": middle, "jobs": renamed}
    assert report["policies"]["fifo"]["per_queue"]["never-seen"]["jobs"] == renamed > 0
    assert "Synthetic shift new-vc: queue '11cb48'" in (out / "report.md").read_text()
    # x10: the busiest queue's late jobs run ten times longer, so first-come-first-served takes longer
    plain = json.loads((simulate(tmp_path / "plain", "--policy", "fifo", "--no-plots")[1] / "report.json").read_text())
    code, out = simulate(tmp_path / "x10", "--policy", "fifo", "--shift", "x10", "--no-plots")
    longer = json.loads((out / "report.json").read_text())
    assert longer["config"]["shift"]["queue"] == "6c71a0"
    assert longer["policies"]["fifo"]["avg_jct_s"] > plain["policies"]["fifo"]["avg_jct_s"]


def test_zombies_are_a_scenario_and_idle_reclaim_is_reported_with_the_run(tmp_path):
    args = ("--policy", "kumiki-noforecast", "--no-plots", "--idle-fraction", "0.3", "--seeds", "0,1")
    code, out = simulate(tmp_path, *args, "--day-windows")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["idle"] == {"fraction": 0.3, "found_after_s": 600.0, "reclaim": "*=waiting:0"}
    row = report["policies"]["kumiki-noforecast"]
    assert 0 < row["idle_jobs"] < row["jobs"] and row["idle_found"] >= row["idle_reclaimed"] > 0
    assert row["computing_utilization"] < row["gpu_utilization"]
    assert "idle_reclaimed" in report["seeds"]["policies"]["kumiki-noforecast"]  # averaged over the seeds
    text = (out / "report.md").read_text()
    assert "0.3 of the jobs are zombies" in text and "`--idle-reclaim *=waiting:0`" in text
    code, kept_out = simulate(tmp_path / "kept", *args, "--idle-reclaim", "*=never")
    kept = json.loads((kept_out / "report.json").read_text())["policies"]["kumiki-noforecast"]
    assert kept["idle_jobs"] == row["idle_jobs"] and kept["idle_reclaimed"] == 0
    assert row["preemptions"] >= row["idle_reclaimed"]  # a reclaim is an eviction
    # reclaimed, the zombies' GPUs go to jobs that compute: these finish sooner (here 128,000 s against 200,000 s)
    assert row["avg_jct_computing_s"] < kept["avg_jct_computing_s"]
    plain = json.loads((simulate(tmp_path / "plain", "--policy", "fifo", "--no-plots")[1] / "report.json").read_text())
    assert plain["config"]["idle"] is None and "idle_jobs" not in plain["policies"]["fifo"]


def test_progress_reports_are_a_scenario_reported_with_the_run(tmp_path):
    code, out = simulate(tmp_path, "--policy", "kumiki,kumiki-noforecast", "--progress-reports", "8", "--no-plots")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["progress_reports"] == {"min_gpus": 8, "share": 1.0, "noise_sigma": 0.2}
    assert (
        "Progress reports (a scenario, not in the trace): 100% of the jobs of >= 8 GPUs"
        in (out / "report.md").read_text()
    )
    plain = json.loads(
        (simulate(tmp_path / "plain", "--policy", "kumiki", "--no-plots")[1] / "report.json").read_text()
    )
    assert plain["config"]["progress_reports"] is None
    # the reference without forecasts hears no reports; kumiki, told the whole-node jobs' progress, runs otherwise
    assert report["policies"]["kumiki"]["avg_jct_s"] != plain["policies"]["kumiki"]["avg_jct_s"]


def test_a_week_of_the_traces_days_in_another_order_is_simulated_and_reported(tmp_path):
    # the tiny trace spread over four days (every submit time x 10), written as a trace file
    days = [dataclasses.replace(job, submit_s=job.submit_s * 10) for job in load_jobs(TINY)]
    trace = tmp_path / "days.csv"
    write_jobs(trace, days)

    def run(name, *extra):
        out = tmp_path / name
        args = ["simulate", "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out)]
        assert main([*args, "--policy", "fifo", "--no-plots", *extra]) == 0
        return json.loads((out / "report.json").read_text()), out

    plain, _ = run("plain")
    same, _ = run("same", "--day-order", "0,1,2,3")
    reordered, out = run("reordered", "--day-order", "3,2,1,0")
    assert same["policies"]["fifo"]["avg_jct_s"] == plain["policies"]["fifo"]["avg_jct_s"]
    assert reordered["config"]["day_order"] == [3, 2, 1, 0] and plain["config"]["day_order"] is None
    assert reordered["policies"]["fifo"]["jobs"] == plain["policies"]["fifo"]["jobs"] == len(days)
    assert reordered["policies"]["fifo"]["avg_jct_s"] != plain["policies"]["fifo"]["avg_jct_s"]
    assert "Days in the order [3, 2, 1, 0]" in (out / "report.md").read_text()


def test_bad_queue_file_and_unknown_queue(tmp_path, capsys):
    queues = tmp_path / "q.yaml"
    queues.write_text("11cb48: 8\n")
    with pytest.raises(SystemExit):
        simulate(tmp_path, "--policy", "fifo", "--queues", str(queues))
    assert "no guarantee for queue(s)" in capsys.readouterr().err
    queues.write_text("11cb48: -2\n")
    with pytest.raises(SystemExit):
        simulate(tmp_path, "--policy", "fifo", "--queues", str(queues))
    assert "guaranteed GPU count > 0" in capsys.readouterr().err


def test_trace_without_durations_is_rejected_with_the_job(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\nx,0,1,,,,,q,,\n")
    with pytest.raises(SystemExit):
        main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--nodes",
                "1",
                "--gpus-per-node",
                "8",
                "--policy",
                "fifo",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert "job x: field 'duration_s'" in capsys.readouterr().err


def test_day_windows_and_the_share_of_the_oracles_gain_the_forecasts_recover(tmp_path):
    trace = tmp_path / "two-days.csv"
    lines = ["job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\n"]
    for index in range(160):  # two days; queue "long" runs 50x longer than "short"
        queue = "long" if index % 4 == 0 else "short"
        duration = (5_000 if queue == "long" else 100) + 7 * (index % 5)
        lines.append(f"j{index},{index * 1_080},1,,,{duration},,{queue},,\n")
    trace.write_text("".join(lines))
    out = tmp_path / "out"
    policies = "kumiki,kumiki-noforecast,kumiki-oracle"
    args = ["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "2", "--policy", policies]
    assert main([*args, "--out", str(out), "--day-windows", "--no-plots"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = report["policies"]
    value = report["forecast_value"]
    base, own, best = (rows[name]["avg_jct_s"] for name in ("kumiki-noforecast", "kumiki", "kumiki-oracle"))
    assert value["noforecast_avg_jct_s"] == base and value["oracle_avg_jct_s"] == best
    if value["recovered_share"] is not None:
        assert value["recovered_share"] == pytest.approx((base - own) / (base - best))
    windows = report["windows"]
    assert list(windows) == ["day 0", "day 1"]
    assert sum(window["jobs"] for window in windows.values()) == 160
    for window in windows.values():
        assert set(window["policies"]) == set(policies.split(","))
        assert set(window["forecast_value"]) >= {"recovered_share", "noforecast_avg_jct_s"}
    assert report["windows_spread"]["kumiki_over_kumiki-noforecast"]["windows"] == 2
    markdown = (out / "report.md").read_text()
    assert "## Day windows" in markdown
    # what the forecasts added to the average JCT, per queue and per class of job (own run time, GPUs): the
    # groups' parts add up to the gap, per window too
    assert set(report["seeds"]["forecast_cost_by_queue"]) == {"long", "short"}
    for by, title in (("queue", "per queue"), ("class", "per job class (own run time, GPUs)")):
        whole = report["seeds"][f"forecast_cost_by_{by}"]
        assert whole and sum(whole.values()) == pytest.approx(own - base)
        for window in windows.values():
            rows = window["policies"]
            gap = rows["kumiki"]["avg_jct_s"] - rows["kumiki-noforecast"]["avg_jct_s"]
            assert sum(window[f"forecast_cost_by_{by}"].values()) == pytest.approx(gap)
        assert f"## What the forecasts added to the average JCT, {title} (s)" in markdown
        assert f"| {by} | whole run | day 0 | day 1 |" in markdown


def test_seeds_report_every_seed_their_mean_and_the_share_of_the_means(tmp_path):
    policies = "kumiki,kumiki-noforecast,kumiki-oracle"
    code, out = simulate(tmp_path, "--policy", policies, "--seeds", "0,3", "--no-plots")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["seeds"] == [0, 3] and report["config"]["seed"] == 0
    spread = report["seeds"]
    assert spread["seeds"] == [0, 3]
    for name in policies.split(","):
        row = spread["policies"][name]
        by_seed = row["avg_jct_s_by_seed"]
        assert len(by_seed) == 2
        assert by_seed[0] == report["policies"][name]["avg_jct_s"]  # the per-run table is the first seed's
        assert row["avg_jct_s"] == pytest.approx(sum(by_seed) / 2)
    # the headline share is the one of the mean JCTs, and each seed's is its own runs'
    value = report["forecast_value"]
    means = {name: spread["policies"][name]["avg_jct_s"] for name in policies.split(",")}
    assert value["noforecast_avg_jct_s"] == means["kumiki-noforecast"]
    assert value["oracle_avg_jct_s"] == means["kumiki-oracle"]
    assert len(spread["recovered_share_by_seed"]) == 2
    markdown = (out / "report.md").read_text()
    assert "## Average JCT over seeds 0, 3 (s)" in markdown and "| kumiki-oracle |" in markdown


def test_a_gated_policy_reports_its_gate_and_its_recovered_share(tmp_path):
    policies = "kumiki,kumiki-gated,kumiki-noforecast,kumiki-oracle"
    code, out = simulate(tmp_path, "--policy", policies, "--no-plots")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    # the tiny trace's arrivals span 7.4 h: one look, at 6 h
    assert report["policies"]["kumiki-gated"]["gate_on_share"] in (0.0, 1.0)
    assert "gate_on_share" not in report["policies"]["kumiki"]
    shares = report["seeds"]["recovered_share_by_policy"]
    assert set(shares) == {"kumiki", "kumiki-gated"}
    assert shares["kumiki"] == report["forecast_value"]["recovered_share"]
    assert "`kumiki-gated`: " in (out / "report.md").read_text()


QUEUES = ("6c71a0", "11cb48", "ed69ec", "ee9e8c", "6214e9", "e13805", "b436b2", "103959")


def quota_tree(tmp_path, limit=None):
    """philly-tiny's queues under one tree: 6c71a0 guaranteed half the 16 GPUs, the rest borrow."""
    queues = [{"name": "6c71a0", "guarantee": 8, **({"limit": limit} if limit else {})}]
    queues += [{"name": name, "guarantee": 1} for name in QUEUES[1:]]
    path = tmp_path / "tree.yaml"
    path.write_text(json.dumps({"cluster": {"gpus": {"": 16}}, "queues": queues}))
    return path


def test_a_quota_tree_admits_every_attempt_and_is_reported(tmp_path):
    code, out = simulate(tmp_path, "--policy", "fifo,tiresias", "--quota", str(quota_tree(tmp_path, limit=8)))
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["quota"].endswith("tree.yaml")
    for name, row in report["policies"].items():
        assert row["jobs"] == 300, name  # every job admitted some day and finished
        quota = row["quota"]
        assert quota["denied"], name  # 6c71a0's limit of 8 held some of its 142 jobs back
        assert set(quota["gpu_s_by_queue"]) == set(QUEUES)
    open_code, open_out = simulate(tmp_path / "open", "--policy", "fifo")
    assert open_code == 0
    open_fifo = json.loads((open_out / "report.json").read_text())["policies"]["fifo"]
    assert "quota" not in open_fifo and open_fifo["avg_jct_s"] != report["policies"]["fifo"]["avg_jct_s"]
    table = (out / "report.md").read_text()
    assert "## Quota admission" in table and "| tiresias |" in table.split("## Quota admission")[1]


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"cluster": {"gpus": {"": 16}}, "queues": [{"name": "6c71a0"}]}, "queue '11cb48' is not in the queue tree"),
        ({"cluster": {"gpus": {"": 16}}, "queues": [{"name": "x", "guarantee": 99}]}, "queue x: guarantee"),
        ([1, 2], "--quota"),
    ],
)
def test_a_quota_tree_that_cannot_run_names_the_problem(tmp_path, capsys, tree, message):
    path = tmp_path / "tree.yaml"
    path.write_text(json.dumps(tree))
    with pytest.raises(SystemExit):
        simulate(tmp_path, "--policy", "fifo", "--quota", str(path))
    err = capsys.readouterr().err
    assert "--quota" in err and message in err


def test_the_philly_vcs_example_tree_runs_as_the_docs_say(tmp_path):
    """docs/examples/philly-vcs.yaml, read as written: every queue of philly-tiny is one of its VCs."""
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "philly-vcs.yaml"
    code, out = simulate(tmp_path, "--policy", "tiresias", "--quota", str(example), "--no-plots")
    assert code == 0
    row = json.loads((out / "report.json").read_text())["policies"]["tiresias"]
    assert row["jobs"] == 300 and set(row["quota"]["gpu_s_by_queue"]) == set(QUEUES)
