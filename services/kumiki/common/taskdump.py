"""Where a stuck process stands: every asyncio task's stack and every thread's, on SIGUSR1.

A hung coroutine is a task, not a thread: a thread dump (faulthandler, py-spy) of an asyncio process shows only
the event loop waiting in `select`. `kill -USR1 <pid>` on a service or on `kumiki replay` prints each pending
task's stack to stderr (the service's log file under a local stack) and the threads' after them (work handed to
`asyncio.to_thread`), and the process carries on. The tests' hang watchdog prints the same way.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from typing import TextIO

DUMP_SIGNAL = signal.SIGUSR1
DUMP_TITLE = "asyncio tasks on"  # each dump's first line holds it, then the signal's name


def print_tasks(loop: asyncio.AbstractEventLoop | None, file: TextIO, *, header: str = "") -> int:
    """Each task of `loop` with its stack (innermost frame last); returns how many there were."""
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    print(f"--- {header or 'asyncio tasks'}: {len(tasks)} ---", file=file)
    for task in sorted(tasks, key=lambda task: task.get_name()):
        try:
            task.print_stack(file=file)
        except Exception as error:  # a frame without line numbers must not hide the others
            print(f"{task!r}: {error!r}", file=file)
    return len(tasks)


def dump_tasks_on_signal(name: str, signum: signal.Signals = DUMP_SIGNAL) -> None:
    """From now on `signum` prints the running loop's tasks, then the threads, to stderr. Call inside the loop."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        print_tasks(loop, sys.stderr, header=f"{name}: {DUMP_TITLE} {signal.Signals(signum).name}")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()

    loop.add_signal_handler(signum, dump)
