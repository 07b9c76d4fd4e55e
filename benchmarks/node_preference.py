"""What a pod's node preferences cost Placement's core per placement, against the same pod without them.

    .venv/bin/python benchmarks/node_preference.py [--nodes 1000] [--repeat 5] [--seed 1]

A pod without node rules or preferences is placed through the occupancy-class index: one node per class of
nodes alike in occupancy is scored. A pod with preferences (`PodRequest.node_preference`, design 0013) is scored
node by node, since two nodes alike in occupancy may differ in score; so is a pod with node rules. The cluster:
`--nodes` nodes of 8 GPUs, each holding 0-8 GPUs of earlier jobs at random (`--seed`). The cases, each placing
a 1-GPU pod, a 4-GPU pod and a 2 x 8-GPU gang with `kumiki` (best of `--repeat` runs):

- `baseline`: no rules, no preferences (the class index);
- `node rules`: avoiding 10 nodes (already node by node: the reference for the cost of leaving the index);
- `preferences, 10 nodes`: scores for 10 nodes (a preferred anti-affinity term's domains, say);
- `preferences, every node`: a score for every node (ScheduleAnyway spread over many zones).

Prints microseconds per placement and the ratio to the baseline, as a markdown table.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

from _support import at_least_one_or_exit, best_us

from kumiki.sched.cluster import ClusterState, Placement, PodPlacement, uniform_cluster
from kumiki.sched.jobs import GangRequest, PodRequest
from kumiki.sched.placement import place_gang


def busy_cluster(nodes: int, seed: int) -> ClusterState:
    state = ClusterState.empty(uniform_cluster(nodes, 8))
    rng = random.Random(seed)
    for node in range(nodes):
        used = rng.randint(0, 8)
        if used:
            state.allocate(Placement(f"held-{node}", (PodPlacement(0, node, tuple(range(used))),)))
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (default 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case, the best is kept (default 5)")
    parser.add_argument("--seed", type=int, default=1, help="how the nodes are filled (default 1)")
    args = parser.parse_args()
    at_least_one_or_exit(parser, args, "nodes", "repeat")
    state = busy_cluster(args.nodes, args.seed)
    names = [node.name for node in state.spec.nodes]
    rng = random.Random(args.seed + 1)
    some = rng.sample(names, min(10, len(names)))
    few = tuple(sorted((name, 100 - 10 * index) for index, name in enumerate(some)))
    every = tuple(sorted((name, rng.randint(-200, 200)) for name in names))
    shapes = {
        "1 GPU": lambda pod: GangRequest("j", (pod,)),
        "4 GPUs": lambda pod: GangRequest("j", (replace(pod, gpus=4),)),
        "2 x 8 GPUs": lambda pod: GangRequest("j", (replace(pod, gpus=8), replace(pod, gpus=8))),
    }
    cases = {
        "baseline": PodRequest(gpus=1),
        "node rules (avoid 10 nodes)": PodRequest(gpus=1, avoid_nodes=frozenset(some)),
        "preferences, 10 nodes": PodRequest(gpus=1, node_preference=few),
        "preferences, every node": PodRequest(gpus=1, node_preference=every),
    }
    count = max(1, 20_000 // args.nodes)
    print(f"{args.nodes} nodes of 8 GPUs, {state.free_whole} GPUs free; kumiki strategy; best of {args.repeat}\n")
    print("| pod | case | µs a placement | / baseline |")
    print("|---|---|---|---|")
    for shape, build in shapes.items():
        base = 0.0
        for case, pod in cases.items():
            request = build(pod)
            us = best_us(
                lambda request=request: place_gang(state, request, "kumiki", explain=False), count, args.repeat
            )
            base = base or us
            print(f"| {shape} | {case} | {us:,.0f} | {us / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
