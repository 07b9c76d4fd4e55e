"""`kumiki telemetry node-key`: the key of one node's agent, for agents outside Kubernetes.

Telemetry ingest, given its own key (`KUMIKI_TELEMETRY_AGENT_KEY_FILE`, at least 32 bytes), takes a node's
samples and inventory only when they are signed with that node's key, which is derived from its key and the
node's name. This prints a node's key: install it on that node only (a file readable by the agent alone) and
start the agent with `--node-key-file`. A node's key signs for that node and no other; changing telemetry's key
changes every node's.

To withdraw one node's key (the node was compromised, its key file copied), move the node to its next
generation in telemetry's generations file (`KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE`, a line
`<node> <generation>`; telemetry reads it again within seconds), print the node's new key with that file (or
`--generation`), and install it: the old key signs nothing from then on, and no other node's key changes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kumiki.agent.core import node_name_error
from kumiki.cli.main import UsageError
from kumiki.cli.options import key_file_option, print_secrets
from kumiki.telemetry.core import GENERATIONS_VARIABLE, KEY_VARIABLE, MAX_GENERATION, node_key, parse_generations


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    telemetry = subparsers.add_parser("telemetry", help="telemetry ingest: node agents' keys")
    commands = telemetry.add_subparsers(dest="telemetry_command", required=True, metavar="SUBCOMMAND")
    keys = commands.add_parser(
        "node-key",
        help="print the key of a node's agent (agents outside Kubernetes sign their records with it)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    keys.add_argument("--node", action="append", required=True, help="the node's name; repeat for several")
    keys.add_argument(
        "--key-file",
        default=os.environ.get(KEY_VARIABLE) or None,
        help=f"telemetry's key (default: ${KEY_VARIABLE})",
    )
    keys.add_argument(
        "--generations-file",
        default=os.environ.get(GENERATIONS_VARIABLE) or None,
        help=f"node key generations: the nodes whose keys were withdrawn (default: ${GENERATIONS_VARIABLE})",
    )
    keys.add_argument(
        "--generation", type=int, help="the key generation to print (default: the node's in the file, else 0)"
    )
    keys.set_defaults(handler=_node_key)


def _node_key(args: argparse.Namespace) -> int:
    master = key_file_option(args.key_file, KEY_VARIABLE)
    for node in args.node:
        problem = node_name_error(node)
        if problem:
            raise UsageError(f"--node: {problem}")
    generations: dict[str, int] = {}
    if args.generations_file:
        try:
            generations = parse_generations(Path(args.generations_file).read_text(), "--generations-file")
        except OSError as error:
            raise UsageError(f"--generations-file: cannot read {args.generations_file!r}: {error.strerror}") from None
        except ValueError as error:
            raise UsageError(str(error)) from None
    if args.generation is not None and not 0 <= args.generation <= MAX_GENERATION:
        raise UsageError(f"--generation: must be in [0, {MAX_GENERATION}], got {args.generation}")

    def key(node: str) -> str:
        generation = args.generation if args.generation is not None else generations.get(node, 0)
        return node_key(master, node, generation).decode()

    print_secrets(args.node, key)
    return 0
