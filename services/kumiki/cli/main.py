"""The `kumiki` command: each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from rich.console import Console

# Modules that define `register(subparsers)`; each adds one or more subcommands.
COMMAND_MODULES = (
    "kumiki.cli.stack",
    "kumiki.cli.simulate",
    "kumiki.cli.pack",
    "kumiki.cli.forecast",
    "kumiki.cli.quota",
    "kumiki.cli.placement",
    "kumiki.cli.replay",
    "kumiki.cli.trace",
    "kumiki.cli.kafka",
    "kumiki.cli.telemetry",
    "kumiki.cli.checkpoints",
)


class UsageError(Exception):
    """A command-line value that is wrong; printed as one line naming the option."""


def message_console() -> Console:
    """Where commands say what they did (stderr). Messages are never wrapped at the terminal's width: a piped
    or logged message stays one line that a script or a test can match (tables and bars still fit the width)."""
    return Console(stderr=True, soft_wrap=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kumiki", description="Kumiki GPU scheduler")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def _stack_tls() -> None:
    """A local stack started with `kumiki up --tls`: call its services with the CLI's certificate (KUMIKI_GRPC_*,
    what kumiki.common.grpcutil.client_channel reads), unless the environment names other certificates."""
    if os.environ.get("KUMIKI_GRPC_CAFILE"):
        return
    from kumiki.devstack.stack import client_tls

    try:
        os.environ.update(client_tls())
    except (OSError, ValueError):  # a stack.json or CA that cannot be read: plaintext, as without --tls
        return


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _stack_tls()
    try:
        result = args.handler(args)
    except UsageError as error:
        parser.exit(2, f"kumiki {args.command}: error: {error}\n")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader left (`kumiki placement explain JOB | head`): stop quietly, as other command-line tools do,
        # and keep the interpreter's final flush from raising again on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
