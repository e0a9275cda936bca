"""The request path's CPU cost in two (or more) source trees, side by side in one run: the gateway
(`slorouter serve`) and the ext_proc picker (Envoy + `slorouter epp`, the generated default response path),
each started from every tree given, the rounds alternating all of them, so that a refactoring of the path a
request takes through the router is measured against the code before it on the same machine at the same time.

Two cases, both with the heuristic profile (the scheduler's own cost is not what a request-path change
moves):

- ``one-token``: `slorouter sim --profile instant` pods answer one-token, non-streamed replies; wrk with 64
  connections for ``--seconds``; the router's user+system CPU per request (/proc).
- ``streamed``: simulated `llama3-8b-h100` pods stream ``--output-tokens`` tokens (one SSE event each,
  ``usage`` included) to ``--prompt-tokens``-token chat prompts, open loop at ``--stream-rate`` for
  ``--stream-seconds`` (``_stream_load.py``, its own process); the router's CPU per answered request.

A tree is ``NAME=SRC``: the ``src`` directory of a checkout (a ``git worktree add`` of the commit before a
change, say); its routers run with ``PYTHONPATH=SRC``. The simulated pods, wrk and the load generator are
this checkout's, shared by every setup. ``--tree-config NAME=FILE.yaml`` adds the YAML mapping's sections to
that tree's router configuration (one tree twice, with a feature off and on: ``--tree off=src --tree on=src
--tree-config on=audit.yaml``).

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/bench_request_path.py --tree before=/tmp/before/src --tree after=src \\
        [--case one-token|streamed|both] [--rounds 3] [--seconds 5] [--stream-seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from _harness import (
    SLOROUTER,
    cpu_seconds,
    envoy_process,
    free_port,
    free_port_range,
    logged_process,
    markdown_table,
    run_wrk,
)
from _stream_load import stream_load
from slorouter.extproc.envoy import EnvoySetup

BODY = '{"model": "sim-instant", "prompt": "Hello, how are you?", "max_tokens": 1}'


@dataclass(frozen=True)
class Setup:
    name: str  # "gateway" or "envoy + epp", then the tree
    url: str
    router_pid: int


def start_setups(
    stack: ExitStack,
    directory: Path,
    endpoints: list[str],
    trees: dict[str, str],
    extra: dict[str, dict[str, Any]],
) -> list[Setup]:
    setups = []
    for tree, src in trees.items():
        env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
        gw_port, grpc_port = free_port(), free_port()
        config = {"gateway": {"host": "127.0.0.1", "port": gw_port}, "pool": {"endpoints": endpoints}}
        config.update(extra.get(tree, {}))
        path = directory / f"{tree}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        serve = [*SLOROUTER, "serve", "--config", str(path), "--log-level", "WARNING"]
        gateway = stack.enter_context(logged_process(serve, [gw_port], env=env))
        setups.append(Setup(f"gateway [{tree}]", f"http://127.0.0.1:{gw_port}", gateway.pid))
        epp = [*SLOROUTER, "epp", "--config", str(path), "--grpc-port", str(grpc_port),
               "--grpc-health-port", str(free_port()), "--metrics-port", str(free_port()),
               "--log-level", "WARNING"]  # fmt: skip
        picker = stack.enter_context(logged_process(epp, [grpc_port], env=env))
        envoy = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", grpc_port, endpoints=tuple(endpoints))
        stack.enter_context(envoy_process(envoy, directory))
        setups.append(Setup(f"envoy + epp [{tree}]", f"http://127.0.0.1:{envoy.listen_port}", picker.pid))
    return setups


def measure(
    args: argparse.Namespace, case: str, trees: dict[str, str], extra: dict[str, dict[str, Any]]
) -> dict[str, list[float]]:
    """CPU ms per request of each setup's router, one value per round."""
    streamed = case == "streamed"
    pods = args.stream_pods if streamed else args.pods
    sim_port = free_port_range(pods)
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(pods)]
    profile, model = ("llama3-8b-h100", "sim-llama3-8b") if streamed else ("instant", "sim-instant")
    cpu_ms: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        directory = Path(tmp)
        sim = [*SLOROUTER, "sim", "--pods", str(pods), "--port", str(sim_port), "--profile", profile,
               "--model", model]  # fmt: skip
        stack.enter_context(logged_process(sim, [sim_port + i for i in range(pods)]))
        setups = start_setups(stack, directory, endpoints, trees, extra)

        def load(setup: Setup, seconds: float) -> float:
            """Requests answered."""
            if streamed:
                result = stream_load(setup.url, rate=args.stream_rate, seconds=seconds,
                                     prompt_tokens=args.prompt_tokens, max_tokens=args.output_tokens,
                                     directory=directory, model=model)  # fmt: skip
                return float(result["ok"])
            return run_wrk(f"{setup.url}/v1/completions", BODY, connections=64, seconds=seconds)["requests"]

        for setup in setups:  # warm up connections and code paths
            load(setup, args.stream_warmup if streamed else 2.0)
        for round_index in range(args.rounds):
            for setup in setups:
                print(f"{case} round {round_index + 1}: {setup.name}", file=sys.stderr, flush=True)
                before = cpu_seconds(setup.router_pid)
                answered = load(setup, args.stream_seconds if streamed else args.seconds)
                used = cpu_seconds(setup.router_pid) - before
                cpu_ms.setdefault(setup.name, []).append(used * 1e3 / max(answered, 1.0))
    return cpu_ms


def report(case: str, cpu_ms: dict[str, list[float]], trees: dict[str, str]) -> None:
    first = next(iter(trees))
    rows = []
    for name, values in cpu_ms.items():
        kind, _, tree = name.partition(" [")
        base = statistics.median(cpu_ms[f"{kind} [{first}]"])
        median = statistics.median(values)
        rows.append([kind, tree.rstrip("]"), " / ".join(f"{v:.3f}" for v in values), f"{median:.3f}",
                     f"{median / base:.3f}×"])  # fmt: skip
    print(f"\n{case}:\n")
    print(markdown_table(["router", "tree", "CPU ms/req per round", "median", f"÷ {first}"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=SRC",
                        help="a source tree to run the routers from (twice or more)")  # fmt: skip
    parser.add_argument("--tree-config", action="append", default=[], metavar="NAME=FILE.yaml",
                        help="sections added to that tree's router configuration")  # fmt: skip
    parser.add_argument("--case", choices=["one-token", "streamed", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="one-token: seconds of wrk per round")
    parser.add_argument("--pods", type=int, default=2, help="one-token: instant pods")
    parser.add_argument("--stream-pods", type=int, default=4)
    parser.add_argument("--stream-rate", type=float, default=15.0, help="streamed: requests per second")
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--stream-warmup", type=float, default=5.0)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=256)
    args = parser.parse_args()
    trees = {}
    for spec in args.tree:
        name, sep, src = spec.partition("=")
        if not sep or not name or not (Path(src) / "slorouter" / "cli.py").is_file():
            parser.error(f"--tree {spec!r}: expected NAME=SRC, SRC a directory holding slorouter/")
        trees[name] = src
    if len(trees) < 2:
        parser.error("give --tree at least twice, to compare")
    extra: dict[str, dict[str, Any]] = {}
    for spec in args.tree_config:
        name, sep, path = spec.partition("=")
        if not sep or name not in trees or not Path(path).is_file():
            parser.error(f"--tree-config {spec!r}: expected NAME=FILE.yaml, NAME one of the trees")
        sections = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if not isinstance(sections, dict):
            parser.error(f"--tree-config {spec!r}: the file must hold a mapping of configuration sections")
        extra[name] = sections
    cases = ["one-token", "streamed"] if args.case == "both" else [args.case]
    for case in cases:
        report(case, measure(args, case, trees, extra), trees)
    print(f"\nmedians of {args.rounds} rounds; heuristic profile; one-token: wrk 64 connections for "
          f"{args.seconds:g} s; streamed: {args.stream_rate:g} req/s for {args.stream_seconds:g} s, "
          f"{args.prompt_tokens}-token prompts, {args.output_tokens}-token replies")  # fmt: skip


if __name__ == "__main__":
    main()
