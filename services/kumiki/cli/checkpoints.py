"""`kumiki checkpoints job-token`: the token a job outside Kubernetes proves itself with to the Checkpoints service.

With a jobs' key (`KUMIKI_CHECKPOINTS_JOB_KEY_FILE`, at least 32 bytes), the Checkpoints service takes a job's
Report, Watch and ResumePoint calls only with `authorization: Bearer <token>`, the token being HMAC-SHA256 of the
job's id under that key. Whoever launches the job prints its token with this command and hands it to the job
alone (`KUMIKI_JOB_TOKEN`, or a file named by `KUMIKI_JOB_TOKEN_FILE`; the SDK sends it). A token speaks for its
job id and no other; changing the key changes every job's. Jobs on Kubernetes need none of this: their pods'
own ServiceAccount tokens prove them (`KUMIKI_CHECKPOINTS_KUBE_AUDIENCE`).

    KUMIKI_JOB_TOKEN=$(kumiki checkpoints job-token --key-file /etc/kumiki/jobs.key --job team-a/llama-ft)
"""

from __future__ import annotations

import argparse
import os

from kumiki.cli.main import UsageError
from kumiki.cli.options import key_file_option, print_secrets

KEY_VARIABLE = "KUMIKI_CHECKPOINTS_JOB_KEY_FILE"  # kumiki.preemption.adapters.identity.KEY_FILE


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    checkpoints = subparsers.add_parser("checkpoints", help="the Checkpoints service: jobs' tokens")
    commands = checkpoints.add_subparsers(dest="checkpoints_command", required=True, metavar="SUBCOMMAND")
    tokens = commands.add_parser(
        "job-token",
        help="print the token a job outside Kubernetes proves itself with to the Checkpoints service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tokens.add_argument("--job", action="append", required=True, help="the job's id; repeat for several")
    tokens.add_argument(
        "--key-file",
        default=os.environ.get(KEY_VARIABLE) or None,
        help=f"the Checkpoints service's jobs' key (default: ${KEY_VARIABLE})",
    )
    tokens.set_defaults(handler=_job_token)


def _job_token(args: argparse.Namespace) -> int:
    from kumiki.preemption.adapters.identity import job_token

    key = key_file_option(args.key_file, KEY_VARIABLE)
    for job in args.job:
        if not job or job != job.strip():
            raise UsageError(f"--job: {job!r} is empty or has surrounding whitespace (a job id is matched exactly)")
    print_secrets(args.job, lambda job: job_token(key, job))
    return 0
