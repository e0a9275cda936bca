"""The prediction ledger in virtual time: a workload change, and a model from another pool.

``change``: ``new-user`` traffic on 4 × ``llama3-8b-h100``, then from ``--switch-s`` on ``code-generation``
(long prompts with shared repository prefixes) at ``--qps-after``, routed by
predicted-latency with the ledger as the router keeps it. Every ``--step-s`` of virtual time: the pool's
TTFT coverage and MAPE over the ledger's window, the TTFT p90 of the requests that arrived in the step,
whether an endpoint drifts, and the trainings so far. Read whether the ledger moves before TTFT p90 does,
and comes back after the retrain.

``broken``: the predictor serves a model trained on another pool and never trains (a trainer that is
down, a prediction server left on the wrong models): the pool's own model (trained in a run before), the
other pool's model with the ledger's fallback (``fallback_after_s``), and without it; the heuristic
profile alone for reference. TTFT p90 of the whole run, per seed and the median; when the fallback began.

    .venv/bin/python benchmarks/bench_ledger.py change --seeds 0,1,2
    .venv/bin/python benchmarks/bench_ledger.py broken --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import resolve_policy
from slorouter.bench.pool import parse_pool
from slorouter.bench.workloads import BenchRequest, generate
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.ledger import LedgerSettings, PredictionLedger
from slorouter.predictor.model_store import ModelMetadata, ModelStore

POOL = "4x llama3-8b-h100"
OTHER_POOL = "4x llama3-8b-a100"  # where the foreign model was trained
POLICY = resolve_policy("predicted-latency")
HEURISTIC = resolve_policy("token-aware")
LEDGER = LedgerSettings()  # the router's defaults


def _traffic(
    workload: str, qps: float, duration_s: float, seed: int, start_s: float = 0.0
) -> list[BenchRequest]:
    requests = generate(workload, qps=qps, duration_s=duration_s, seed=seed)
    return [dataclasses.replace(r, arrival=r.arrival + start_s) for r in requests]


class Timeline:
    """The pool's ledger figures at each check, kept by wrapping the ledger's own check."""

    def __init__(self, ledger: PredictionLedger, version: Callable[[], str | None] = lambda: None) -> None:
        self.points: list[tuple[float, float | None, float | None, bool, bool]] = []
        self.versions: list[tuple[float, str | None]] = []  # the TTFT model served at each check
        check = ledger.check

        def recorded(now: float) -> None:
            check(now)
            self.versions.append((now, version()))
            summary = ledger.summary()
            ttft = [kinds["ttft"] for kinds in summary.endpoints.values() if "ttft" in kinds]
            outcomes = sum(a.outcomes for a in ttft)
            coverage = sum(a.coverage * a.outcomes for a in ttft) / outcomes if outcomes else None
            mapes = [(a.mape, a.outcomes) for a in ttft if a.mape is not None]
            mape = sum(m * n for m, n in mapes) / sum(n for _, n in mapes) if mapes else None
            self.points.append((now, coverage, mape, bool(summary.drifting), bool(summary.distrusted)))

        ledger.check = recorded  # type: ignore[method-assign]

    def models_before(self, end: float) -> int:
        """TTFT models served before ``end`` (trainings accepted, the first included)."""
        return len({v for t, v in self.versions if t < end and v is not None})

    def at(self, start: float, end: float) -> tuple[float | None, float | None, bool, bool]:
        inside = [p for p in self.points if start <= p[0] < end]
        if not inside:
            return None, None, False, False
        last = inside[-1]
        return last[1], last[2], any(p[3] for p in inside), any(p[4] for p in inside)


def change(
    seeds: Sequence[int], qps: float, qps_after: float, switch_s: float, duration_s: float, step_s: float
) -> None:
    profiles = parse_pool(POOL)
    settings = ClusterSettings(ledger=LEDGER)
    print(
        f"new-user at {qps:g} req/s, then code-generation at {qps_after:g} req/s from {switch_s:g} s, "
        f"on {POOL}; {POLICY.name}"
    )
    rows: dict[float, list[tuple[float | None, float | None, float, bool, int]]] = {}
    for seed in seeds:
        requests = _traffic("new-user", qps, switch_s, seed) + _traffic(
            "code-generation", qps_after, duration_s - switch_s, seed, start_s=switch_s
        )
        with ClusterSimulator.of_policy(profiles, POLICY, settings=settings, seed=seed) as sim:
            stack = sim.pickers[0]
            assert stack.ledger is not None and stack.predictor is not None
            timeline = Timeline(stack.ledger, _ttft_version(stack.predictor))
            rec = sim.run(requests)
        ttft_ms = rec.ttft_s * 1000
        for start in np.arange(0.0, duration_s, step_s):
            end = start + step_s
            arrived = (rec.arrival >= start) & (rec.arrival < end)
            p90 = float(np.nanpercentile(ttft_ms[arrived], 90)) if arrived.any() else float("nan")
            coverage, mape, drifting, _ = timeline.at(start, end)
            trained = timeline.models_before(end)
            rows.setdefault(float(start), []).append((coverage, mape, p90, drifting, trained))
    print("\n| from s | TTFT coverage | TTFT MAPE | TTFT p90 ms | drifting (seeds) | TTFT models trained |")
    print("|---:|---:|---:|---:|---:|---:|")
    for start, per_seed in rows.items():
        print(
            f"| {start:.0f} | {_fmt(_median([r[0] for r in per_seed]), '.2f')} "
            f"| {_fmt(_median([r[1] for r in per_seed]), '.2f')} "
            f"| {_fmt(_median([r[2] for r in per_seed]), ',.0f')} "
            f"| {sum(r[3] for r in per_seed)} of {len(per_seed)} "
            f"| {_fmt(_median([float(r[4]) for r in per_seed]), '.0f')} |"
        )


def _models(
    profiles_spec: str, qps: float, duration_s: float, seed: int
) -> list[tuple[bytes, ModelMetadata]]:
    """The models predicted-latency trained on ``profiles_spec`` serving ``new-user`` for ``duration_s``."""
    with ClusterSimulator.of_policy(parse_pool(profiles_spec), POLICY, seed=seed) as sim:
        sim.run(generate("new-user", qps=qps, duration_s=duration_s, seed=seed + 100))
        stack = sim.pickers[0]
        assert stack.predictor is not None
        store = ModelStore(stack.predictor.model_dir)
        return [m for m in (store.load("ttft"), store.load("tpot")) if m is not None]


def broken(seeds: Sequence[int], qps: float, duration_s: float, other_qps: float) -> None:
    profiles = parse_pool(POOL)
    print(f"new-user at {qps:g} req/s on {POOL} for {duration_s:g} s; models served without training")
    cases = ("own model", "other pool's model, fallback", "other pool's model, no fallback", HEURISTIC.name)
    p90: dict[str, list[float]] = {case: [] for case in cases}
    began: list[float] = []
    for seed in seeds:
        own = _models(POOL, qps, 120.0, seed)
        other = _models(OTHER_POOL, other_qps, 120.0, seed)
        requests = generate("new-user", qps=qps, duration_s=duration_s, seed=seed)
        for case in cases:
            if case == HEURISTIC.name:
                with ClusterSimulator.of_policy(profiles, HEURISTIC, seed=seed) as sim:
                    rec = sim.run(requests)
            else:
                ledger = (
                    LEDGER
                    if "no fallback" not in case
                    else dataclasses.replace(LEDGER, fallback_after_s=None)
                )
                settings = ClusterSettings(ledger=ledger, training=False)
                policy = POLICY
                with ClusterSimulator.of_policy(profiles, policy, settings=settings, seed=seed) as sim:
                    sim.load_models(own if case == "own model" else other)
                    stack = sim.pickers[0]
                    assert stack.ledger is not None
                    timeline = Timeline(stack.ledger)
                    rec = sim.run(requests)
                if case.endswith(", fallback"):
                    fallen = [p[0] for p in timeline.points if p[4]]
                    began.append(fallen[0] if fallen else float("nan"))
            p90[case].append(float(np.nanpercentile(rec.ttft_s * 1000, 90)))
    print("\n| case | TTFT p90 ms (median) | per seed |")
    print("|---|---:|---|")
    for case in cases:
        values = p90[case]
        print(f"| {case} | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |")
    print(f"\nfallback began at {', '.join(f'{b:.0f}' for b in began)} s (per seed)")


def _ttft_version(predictor: EmbeddedPredictor) -> Callable[[], str | None]:
    def version() -> str | None:
        return predictor.versions.get("ttft")

    return version


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None and v == v]
    return statistics.median(known) if known else None


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    change_parser = sub.add_parser("change")
    change_parser.add_argument("--seeds", default="0,1,2")
    change_parser.add_argument("--qps", type=float, default=20.0)
    change_parser.add_argument("--qps-after", type=float, default=6.0)
    change_parser.add_argument("--switch-s", type=float, default=150.0)
    change_parser.add_argument("--duration-s", type=float, default=300.0)
    change_parser.add_argument("--step-s", type=float, default=15.0)
    broken_parser = sub.add_parser("broken")
    broken_parser.add_argument("--seeds", default="0,1,2")
    broken_parser.add_argument("--qps", type=float, default=25.0)
    broken_parser.add_argument("--other-qps", type=float, default=10.0)
    broken_parser.add_argument("--duration-s", type=float, default=240.0)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.what == "change":
        change(seeds, args.qps, args.qps_after, args.switch_s, args.duration_s, args.step_s)
    else:
        broken(seeds, args.qps, args.duration_s, args.other_qps)


if __name__ == "__main__":
    main()
