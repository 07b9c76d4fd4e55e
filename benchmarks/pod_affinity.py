"""What resolving pod affinity and scoring preferences cost the binder per pod, against resolving node rules alone.

    .venv/bin/python benchmarks/pod_affinity.py [--nodes 500] [--placed 5000] [--repeat 5]

The binder resolves a pod's node rules (nodeSelector, node affinity, tolerations) against every schedulable node
at each submission; with pod affinity it also matches the pod's terms against the placed pods
(`binder.core.pod_affinity.affinity_filter`). The baseline, timed in the same process over the same nodes, is
`node_choice` for a pod with a nodeSelector. The cases:

- `anti, hostname`: one anti-affinity term over every placed pod (`--placed`, spread over `--nodes`);
- `affinity, zone`: one affinity term keeping the pod to the zones of a few placed pods;
- `topology spread, zone`: one DoNotSchedule constraint over the zones (`binder.core.topology_spread`);
- `symmetry only`: a pod without terms against the placed pods that carry them (a tenth of `--placed`), what
  every submission pays once any pod in the cluster has a term;
- `preferred: ...`: scoring the nodes for a pod's preferences (`binder.core.preferences.node_scores`, on top of
  its node rules): one preferred anti-affinity term on the hostname, one ScheduleAnyway spread constraint over
  the zones, one preferred node affinity term, and all three with a PreferNoSchedule taint on a tenth of the
  nodes.

Prints microseconds per pod and the ratio to the baseline (best of --repeat runs), as a markdown table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from _support import at_least_one_or_exit, best_us

from kumiki.binder import core
from kumiki.binder.core import Placed

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
ZONE = "topology.kubernetes.io/zone"


def node(name: str, zone: str) -> core.Node:
    labels = {core.HOSTNAME_LABEL: name, ZONE: zone, "pool": "gpu", core.GPU_MODEL_SELECTOR: "NVIDIA-A100-SXM4-80GB"}
    return core.parse_node(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1024Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def terms(kind: str, labels: dict[str, str], key: str) -> tuple[core.PodAffinityTerm, ...]:
    term = {"labelSelector": {"matchLabels": labels}, "topologyKey": key}
    return core.pod_affinity({"affinity": {kind: {REQ: [term]}}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500, help="schedulable nodes (default 500)")
    parser.add_argument("--placed", type=int, default=5000, help="placed pods (default 5000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case, the best is kept (default 5)")
    args = parser.parse_args()
    at_least_one_or_exit(parser, args, "nodes", "placed", "repeat")
    nodes = {f"n{i}": node(f"n{i}", f"z{i % 8}") for i in range(args.nodes)}
    candidates = list(nodes.values())
    spot = [
        replace(item, taints=(*item.taints, core.Taint("spot", "true", "PreferNoSchedule"))) if i % 10 == 0 else item
        for i, item in enumerate(candidates)
    ]
    anti_web = terms("podAntiAffinity", {"app": "web-0"}, core.HOSTNAME_LABEL)
    placed = [
        Placed(f"ns/p{i}", "ns", {"app": f"web-{i % 50}"}, f"n{i % args.nodes}", anti_web if i % 10 == 0 else ())
        for i in range(args.placed)
    ]
    with_terms = [pod for pod in placed if pod.terms]
    rules = core.node_rules({"nodeSelector": {"pool": "gpu"}})
    count = max(1, 2000 // args.nodes)

    def baseline() -> None:
        core.node_choice(rules, candidates, False)

    def resolved(
        pod_terms: tuple[core.PodAffinityTerm, ...],
        labels: dict[str, str],
        against: list[Placed],
        spread: tuple[core.SpreadConstraint, ...] = (),
    ) -> Callable[[], None]:
        def run() -> None:
            found = core.affinity_filter("ns/new", "ns", labels, pod_terms, against, nodes)
            found = found.also(core.spread_filter("ns/new", "ns", labels, spread, rules, against, nodes))
            core.node_choice(rules, candidates, False, found.why_not if found.restricts else None)

        return run

    zone_spread = core.spread_constraints(
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                                        "labelSelector": {"matchLabels": {"app": "web-0"}}}]},
        {"app": "web-0"},
    )  # fmt: skip

    def preferred(
        spec: dict[str, Any], labels: dict[str, str], against: list[Placed], on: list[core.Node]
    ) -> Callable[[], None]:
        prefs = core.preferences(spec, labels)

        def run() -> None:
            core.node_choice(rules, on, False)
            core.node_scores("ns/new", "ns", labels, rules, prefs, against, on)

        return run

    web = {"labelSelector": {"matchLabels": {"app": "web-0"}}, "topologyKey": core.HOSTNAME_LABEL}
    prefer_apart = {"affinity": {"podAntiAffinity": {PREF: [{"weight": 100, "podAffinityTerm": web}]}}}
    prefer_spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app": "web-0"}},
            }
        ]
    }
    prefer_zone = {"affinity": {"nodeAffinity": {PREF: [{"weight": 50, "preference": {"matchExpressions": [
        {"key": ZONE, "operator": "In", "values": ["z3"]}]}}]}}}  # fmt: skip
    prefer_all = {
        "affinity": {**prefer_apart["affinity"], **prefer_zone["affinity"]},
        **prefer_spread,
    }

    base_us = best_us(baseline, count, args.repeat)
    cases = [
        ("anti, hostname", resolved(anti_web, {"app": "web-0"}, placed), len(placed)),
        ("affinity, zone", resolved(terms("podAffinity", {"app": "web-7"}, ZONE), {}, placed), len(placed)),
        ("topology spread, zone", resolved((), {"app": "web-0"}, placed, zone_spread), len(placed)),
        ("symmetry only", resolved((), {"app": "web-0"}, with_terms), len(with_terms)),
        ("preferred: anti, hostname", preferred(prefer_apart, {"app": "web-0"}, placed, candidates), len(placed)),
        ("preferred: spread, zone", preferred(prefer_spread, {"app": "web-0"}, placed, candidates), len(placed)),
        ("preferred: node affinity", preferred(prefer_zone, {}, [], candidates), 0),
        ("preferred: all three, spot taints", preferred(prefer_all, {"app": "web-0"}, placed, spot), len(placed)),
    ]
    print(f"{args.nodes} nodes, {args.placed} placed pods; baseline: node rules alone, {base_us:,.0f} µs a pod\n")
    print("| case | placed pods matched | µs a pod | / node rules alone |")
    print("|---|---|---|---|")
    for name, run, matched in cases:
        us = best_us(run, count, args.repeat)
        print(f"| {name} | {matched:,} | {us:,.0f} | {us / base_us:.2f}x |")


if __name__ == "__main__":
    main()
