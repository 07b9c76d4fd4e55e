"""A stuck asyncio process says where it waits: each task's stack on SIGUSR1, and it carries on."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import sys
import textwrap

from kumiki.common.taskdump import print_tasks


async def waits_for_ever(event: asyncio.Event) -> None:
    await event.wait()


async def test_print_tasks_names_each_task_and_where_it_waits() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(waits_for_ever(event), name="the-stuck-one")
    await asyncio.sleep(0)  # it runs up to its await
    out = io.StringIO()
    count = print_tasks(asyncio.get_running_loop(), out, header="here")
    event.set()
    await task
    text = out.getvalue()
    assert count == 2  # this test's own task and the stuck one
    assert text.startswith("--- here: 2 ---")
    assert "the-stuck-one" in text and "in waits_for_ever" in text and "await event.wait()" in text


def test_print_tasks_without_a_loop_prints_none() -> None:
    out = io.StringIO()
    assert print_tasks(None, out) == 0
    assert out.getvalue() == "--- asyncio tasks: 0 ---\n"


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from kumiki.common.taskdump import dump_tasks_on_signal

    async def wait_for_the_broker(gate):
        await gate.wait()

    async def main():
        dump_tasks_on_signal("child")
        gate = asyncio.Event()
        stuck = asyncio.create_task(wait_for_the_broker(gate), name="broker-wait")
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        line = await loop.run_in_executor(None, sys.stdin.readline)  # the parent's go-ahead, after the dump
        gate.set()
        await stuck
        print("carried on after " + line.strip(), flush=True)

    asyncio.run(main())
    """
)


def test_sigusr1_prints_the_tasks_and_the_threads_and_the_process_carries_on() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None and child.stderr is not None
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGUSR1)
        dump = []
        for line in child.stderr:  # read up to the thread dump's first line: the whole task dump is before it
            dump.append(line)
            if line.startswith("Thread 0x") or line.startswith("Current thread 0x"):
                break
        child.stdin.write("the dump\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    text = "".join(dump)
    assert "--- child: asyncio tasks on SIGUSR1: 2 ---" in text
    assert "broker-wait" in text and "in wait_for_the_broker" in text
    assert child.returncode == 0 and out.strip() == "carried on after the dump"
