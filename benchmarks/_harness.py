"""Shared pieces of the benchmark scripts: starting processes, waiting for ports, wrk, Markdown tables."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOROUTER = [sys.executable, "-m", "slorouter.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int) -> int:
    """The first of ``count`` consecutive ports that can all be bound, below the ephemeral range (where
    the benchmark's own client connections could take one of them between the check and the pods' start)."""
    for _ in range(100):
        base = random.randrange(20_000, 32_000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


@contextmanager
def process(args: Sequence[str], wait_ports: Sequence[int] = ()) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(list(args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        for port in wait_ports:
            wait_for_port(port)
        yield proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ensure_wrk() -> str:
    """wrk, from Debian's package (installed on first use: this is a benchmark-only dependency)."""
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() != 0:
        raise SystemExit("wrk is required: apt-get install wrk")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
    return shutil.which("wrk") or "wrk"


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _to_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"unexpected wrk duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(url: str, body: str, *, connections: int, seconds: float, threads: int = 1) -> dict[str, float]:
    """POST ``body`` to ``url`` with wrk; returns req/s and latency percentiles in ms."""
    script = f"""
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
"""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(
            [
                ensure_wrk(),
                f"-t{threads}",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--latency",
                "-s",
                f.name,
                url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(f.name)
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}
    result["requests"] = float(re.search(r"(\d+) requests in", out).group(1))
    for pct in ("50", "90", "99"):
        result[f"p{pct}_ms"] = _to_ms(re.search(rf"\s{pct}%\s+(\S+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non_2xx"] = float(errors.group(1)) if errors else 0.0
    return result


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
