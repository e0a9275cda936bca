"""Children started by a process that serves gRPC: every one runs its program, and none outlives its
parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.processes

# What `slorouter epp` does: gRPC serving (and a channel open), then children started with
# `stop_with_parent`, which makes the start a fork.
SPAWNS = textwrap.dedent(
    """
    import asyncio, sys
    import slorouter
    import grpc
    from slorouter.children import stop_with_parent

    async def main():
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        lost = 0
        for _ in range(int(sys.argv[1])):
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; print(sys.stdin.readline().strip())",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, preexec_fn=stop_with_parent,
            )
            out, _ = await asyncio.wait_for(child.communicate(b"ran\\n"), 30)
            lost += out.strip() != b"ran"
        await channel.close()
        await server.stop(None)
        print(lost)

    asyncio.run(main())
    """
)


def test_children_of_a_grpc_server_all_run_their_program():
    # With gRPC's fork handlers on, about 1 child in 100 died before running its program.
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", SPAWNS, "500"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0", done.stderr[-2000:]


def test_an_operators_grpc_fork_setting_is_kept():
    code = "import os, slorouter; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "true"


PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from slorouter.children import stop_with_parent
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    child = subprocess.Popen(sleeper, preexec_fn=stop_with_parent)
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_child_stops_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its killed parent")
    finally:
        parent.kill()
        parent.wait(timeout=10)
