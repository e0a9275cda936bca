"""Fuzzing at volume: the property-based tests' strategies and properties (``tests/fuzz/strategies.py``) run
for many generated inputs per parser, counting inputs and failures instead of stopping at the first.

    .venv/bin/python benchmarks/fuzz.py                 # 100,000+ inputs across the parsers
    .venv/bin/python benchmarks/fuzz.py --examples 2000 --parsers openai,metrics

Prints one row per parser (inputs, failures, distinct failures, seconds) and the distinct failures found
(exception type and message, with the smallest input that showed it); exits 1 when any input failed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.fuzz

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tests.fuzz.strategies import PARSERS  # noqa: E402


@dataclass
class Tally:
    inputs: int = 0
    failures: int = 0
    distinct: dict[str, tuple[int, str]] = field(default_factory=dict)  # signature -> (count, smallest input)
    seconds: float = 0.0


def _signature(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next(
        (f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if "/src/" in f.filename), ""
    )
    # An assertion's message is "what | the input": the input is left out of the signature.
    first = str(exc).split(" | ")[0].splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__} {where} {first}".strip()


def run(strategy: st.SearchStrategy[Any], check: Callable[[Any], None], examples: int, seed: int) -> Tally:
    tally = Tally()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(strategy)
    def body(case: Any) -> None:
        tally.inputs += 1
        try:
            check(case)
        except Exception as exc:  # counted, not raised: the run goes on
            tally.failures += 1
            key = _signature(exc)
            count, smallest = tally.distinct.get(key, (0, ""))
            shown = repr(case)
            if not smallest or len(shown) < len(smallest):
                smallest = shown
            tally.distinct[key] = (count + 1, smallest)

    started = time.perf_counter()
    hypothesis_seed(seed)(body)()
    tally.seconds = time.perf_counter() - started
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", type=int, default=0, help="inputs per parser (default: its share of --total)"
    )
    parser.add_argument(
        "--total", type=int, default=100_000, help="inputs across all parsers (default 100,000)"
    )
    parser.add_argument(
        "--parsers", default=",".join(PARSERS), help=f"comma-separated, of {', '.join(PARSERS)}"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.parsers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARSERS]
    if unknown:
        parser.error(f"unknown parser(s): {', '.join(unknown)}")
    per_parser = args.examples or -(-args.total // len(names))
    tallies: dict[str, Tally] = {}
    started = time.perf_counter()
    for name in names:
        strategy, check = PARSERS[name]
        tallies[name] = tally = run(strategy, check, per_parser, args.seed)
        print(f"{name}: {tally.inputs} inputs, {tally.failures} failures, {tally.seconds:.1f} s", flush=True)
        _print_failures(name, tally)
    wall = time.perf_counter() - started
    print()
    print("| parser | inputs | failures | distinct failures | seconds |")
    print("|---|---:|---:|---:|---:|")
    for name, tally in tallies.items():
        row = [
            name,
            f"{tally.inputs:,}",
            f"{tally.failures:,}",
            str(len(tally.distinct)),
            f"{tally.seconds:.1f}",
        ]
        print("| " + " | ".join(row) + " |")
    total_inputs = sum(t.inputs for t in tallies.values())
    total_failures = sum(t.failures for t in tallies.values())
    print(
        f"| **total** | {total_inputs:,} | {total_failures:,} | "
        f"{sum(len(t.distinct) for t in tallies.values())} | {wall:.1f} |"
    )
    return 1 if total_failures else 0


def _print_failures(name: str, tally: Tally) -> None:
    """The distinct failures of one parser, as soon as its run ends (a later crash loses none of them)."""
    for key, (count, smallest) in sorted(tally.distinct.items(), key=lambda kv: -kv[1][0]):
        print(f"  [{name}] {count}x {key}\n      e.g. {smallest[:600]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
