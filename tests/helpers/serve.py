"""``slorouter serve`` (the embedded default: simulated pods and an embedded predictor) as a process, and a
completion sent through it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from slorouter.sim.profiles import LLAMA3_8B_H100
from tests.helpers.processes import spawn, wait_for_line


def start_serve() -> tuple[subprocess.Popen[str], str, float]:
    """``slorouter serve`` (the embedded default) on a free port: the process, its address, and the
    monotonic time at which it said it was listening."""
    process = spawn("serve", "--port", "0", "--log-level", "WARNING")
    line, at = wait_for_line(process, "routing on http://")
    return process, line.split("http://", 1)[1].split()[0], at


def complete(address: str) -> tuple[str, float]:
    """One completion through the router at ``address``: how it was routed (``x-slorouter-route``), and the
    monotonic time of the answer."""
    body = json.dumps({"model": LLAMA3_8B_H100.model, "prompt": "Hello, world", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{address}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
        return response.headers["x-slorouter-route"], time.monotonic()
