"""`kumiki pack`: the fragmentation benchmark's report, plot and option errors."""

import json

import pytest

from kumiki.cli.main import main


def test_pack_reports_unallocated_share(tmp_path):
    pods = tmp_path / "pods.csv"
    nodes = tmp_path / "nodes.csv"
    pods.write_text(
        "job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\n"
        + "".join(f"p{i},{i},{g},2,4,,,LS,Running,\n" for i, g in enumerate([0.5, 1, 0.25, 0.5, 2, 0.75, 0]))
    )
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,32000,65536,2,T4\nb,32000,65536,4,T4\n")
    out = tmp_path / "o"
    assert (
        main(
            [
                "pack",
                "--pods",
                str(pods),
                "--nodes",
                str(nodes),
                "--placement",
                "best-fit,kumiki",
                "--seeds",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["capacity_gpus"] == 6
    for row in report["strategies"].values():
        assert 0.0 <= row["unallocated_share_mean"] <= 1.0
        assert len(row["runs"]) == 2
        for run in row["runs"]:
            assert run["arrivals"] >= 1 and (run["failed"] == 0) == (run["first_failure_arrival"] == 0)
    assert (out / "unallocated.png").exists()


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [("--placement", "best-fit,nowhere", "--placement: unknown 'nowhere'"), ("--seeds", "0", "--seeds")],
)
def test_pack_refuses_a_wrong_option_naming_it(tmp_path, capsys, option, value, expected):
    pods = tmp_path / "pods.csv"
    pods.write_text("job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\np0,0,1,2,4,,,LS,Running,\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,32000,65536,2,T4\n")
    args = {"--pods": str(pods), "--nodes": str(nodes), "--placement": "best-fit", "--seeds": "1", option: value}
    argv = ["pack", "--out", str(tmp_path / "o")] + [item for pair in args.items() for item in pair]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "o" / "report.json").exists()
