"""The prediction ledger's own CPU: one outcome added (the request path's share), and a drift check and a
summary (a scrape, the status page) over a full window, in-process.

    .venv/bin/python benchmarks/bench_ledger_cost.py [--endpoints 8] [--entries 20000]
"""

from __future__ import annotations

import argparse
import time

from slorouter.clock import ManualClock
from slorouter.predictor.ledger import LedgerSettings, PredictionLedger


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--adds", type=int, default=200_000)
    args = parser.parse_args()
    clock = ManualClock()
    endpoints = [f"10.0.0.{i}:8000" for i in range(args.endpoints)]
    # No check while adding: the request path's own share, then the periodic work on its own.
    settings = LedgerSettings(max_entries=args.entries, window_s=1e9, check_interval_s=1e9)
    ledger = PredictionLedger(clock, settings, point_factor=lambda kind: 0.6)
    ledger.add(endpoints[0], "none", "ttft", 100.0, 80.0)  # the one check at the start
    started = time.perf_counter()
    for i in range(args.adds):
        ledger.add(endpoints[i % args.endpoints], "chat", "ttft" if i % 2 else "tpot", 100.0, 50.0 + i % 100)
    add_us = (time.perf_counter() - started) / args.adds * 1e6
    started = time.perf_counter()
    for _ in range(20):
        ledger.check(clock.now())
    check_ms = (time.perf_counter() - started) / 20 * 1000
    started = time.perf_counter()
    for _ in range(20):
        ledger.summary()
    summary_ms = (time.perf_counter() - started) / 20 * 1000
    print(f"{args.endpoints} endpoints, {len(ledger):,} outcomes in the window")
    print(f"add: {add_us:.2f} µs per outcome · drift check: {check_ms:.1f} ms · summary: {summary_ms:.1f} ms")


if __name__ == "__main__":
    main()
