"""The prediction ledger in virtual time: a workload change, and a model from another pool.

``change``: ``new-user`` traffic on 4 × ``llama3-8b-h100``, then from ``--switch-s`` on ``code-generation``
(long prompts with shared repository prefixes) at ``--qps-after``, routed by
predicted-latency with the ledger as the router keeps it. Every ``--step-s`` of virtual time: the pool's
TTFT coverage and MAPE over the ledger's window, the TTFT p90 of the requests that arrived in the step,
whether an endpoint drifts, and the trainings so far. Read whether the ledger moves before TTFT p90 does,
and comes back after the retrain.

``broken``: the predictor serves models it did not learn on this traffic and never trains (a trainer that is
down, models loaded by hand): the pool's own model (trained in a run before), and one per ``--model-from
POOL:WORKLOAD:QPS`` (by default this pool in a quiet hour, an eighth of the rate: it never saw a queue; and
a pool of slower GPUs), each with the ledger's fallback after ``--fallback-after-s`` (guard on; 60 s, where
the router's default is no fallback) and without it (guard off); the heuristic profile alone for reference.
Per case: the TTFT p90 of the requests that are not sheddable (per seed and the median), the requests shed,
the TTFT SLO attainment, and when a TTFT model first drifted and an endpoint was first distrusted.

    .venv/bin/python benchmarks/bench_ledger.py change --seeds 0,1,2
    .venv/bin/python benchmarks/bench_ledger.py broken --seeds 0,1,2
    .venv/bin/python benchmarks/bench_ledger.py broken --workload mixed-priority --qps 40 \
        --pool "2x qwen3-32b-h100-tp2" --model-from "2x qwen3-32b-h100-tp2:mixed-priority:5" \
        --model-from "4x llama3-8b-h100:new-user:3"
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import Policy, resolve_policy
from slorouter.bench.pool import parse_pool
from slorouter.bench.records import OK, SHED, RunRecords
from slorouter.bench.workloads import BenchRequest, generate
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.ledger import LedgerSettings, PredictionLedger
from slorouter.predictor.model_store import ModelMetadata, ModelStore

POOL = "4x llama3-8b-h100"
# broken's default foreign models besides this pool's in a quiet hour: a pool of slower GPUs' (over-predicts
# every endpoint alike, so it still ranks them).
OTHER_POOL = "4x llama3-8b-a100"
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
        self.drifting: list[tuple[float, set[str]]] = []  # the kinds drifting at each check
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
            self.drifting.append((now, {k for kinds in summary.drifting.values() for k in kinds}))

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
    profiles_spec: str, policy: Policy, workload: str, qps: float, duration_s: float, seed: int
) -> list[tuple[bytes, ModelMetadata]]:
    """The models ``policy`` trained on ``profiles_spec`` serving ``workload`` at ``qps``, ``duration_s``."""
    with ClusterSimulator.of_policy(parse_pool(profiles_spec), policy, seed=seed) as sim:
        sim.run(generate(workload, qps=qps, duration_s=duration_s, seed=seed + 100))
        stack = sim.pickers[0]
        assert stack.predictor is not None
        store = ModelStore(stack.predictor.model_dir)
        return [m for m in (store.load("ttft"), store.load("tpot")) if m is not None]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a served model was trained: a pool, its traffic and rate."""

    pool: str
    workload: str
    qps: float

    @classmethod
    def parse(cls, text: str) -> Source:
        """``POOL:WORKLOAD:QPS`` (the ``--model-from`` argument)."""
        parts = text.rsplit(":", 2)
        try:
            pool, workload, qps = parts[0], parts[1], float(parts[2])
        except (IndexError, ValueError):
            raise argparse.ArgumentTypeError(f"expected POOL:WORKLOAD:QPS, got {text!r}") from None
        return cls(pool, workload, qps)

    def label(self, pool: str, workload: str, qps: float) -> str:
        if (self.pool, self.workload, self.qps) == (pool, workload, qps):
            return "this pool's own model"
        where = "this pool" if self.pool == pool else self.pool
        what = "this traffic" if self.workload == workload else self.workload
        return f"{where}, {what} at {self.qps:g} req/s"


@dataclass(slots=True)
class Outcome:
    ttft_p90_ms: float  # of the requests that are not sheddable
    shed: int
    attainment: float | None  # share of the requests with a TTFT SLO served within it
    drift_at_s: float | None  # the first drift of a TTFT model
    distrusted_at_s: float | None


def _outcome(requests: Sequence[BenchRequest], rec: RunRecords, timeline: Timeline | None) -> Outcome:
    kept = np.array([r.priority >= 0 for r in requests])
    ttft_ms = rec.ttft_s * 1000
    p90 = float(np.nanpercentile(np.where(kept, ttft_ms, np.nan), 90))
    slo = rec.slo_ttft_ms
    with_slo = np.isfinite(slo)
    attainment = None
    if with_slo.any():
        met = (rec.status == OK) & (np.nan_to_num(ttft_ms, nan=np.inf) <= slo)
        attainment = float(met[with_slo].mean())
    drift = distrusted = None
    if timeline is not None:
        drift = next((t for t, kinds in timeline.drifting if "ttft" in kinds), None)
        distrusted = next((p[0] for p in timeline.points if p[4]), None)
    return Outcome(p90, int((rec.status == SHED).sum()), attainment, drift, distrusted)


def broken(
    seeds: Sequence[int],
    pool: str,
    workload: str,
    qps: float,
    duration_s: float,
    policy_name: str,
    sources: Sequence[Source],
    ledger_settings: LedgerSettings,
    fallback_after_s: float,
) -> None:
    profiles = parse_pool(pool)
    policy = resolve_policy(policy_name)
    own = Source(pool, workload, qps)
    print(
        f"{workload} at {qps:g} req/s on {pool} for {duration_s:g} s, {policy.name}; models trained in a run "
        f"before (120 s), loaded by hand, never retrained; coverage band {ledger_settings.coverage_low:g}-"
        f"{ledger_settings.coverage_high:g}, fallback after {fallback_after_s:g} s (guard on) or never "
        "(guard off)"
    )
    cases: list[tuple[str, Source | None, float | None]] = [(own.label(pool, workload, qps), own, None)]
    for source in sources:
        label = source.label(pool, workload, qps)
        cases.append((f"{label}, guard on", source, fallback_after_s))
        cases.append((f"{label}, guard off", source, None))
    cases.append((f"{HEURISTIC.name} (no model)", None, None))
    results: dict[str, list[Outcome]] = {label: [] for label, _, _ in cases}
    for seed in seeds:
        requests = generate(workload, qps=qps, duration_s=duration_s, seed=seed)
        trained: dict[Source, list[tuple[bytes, ModelMetadata]]] = {}
        for label, case_source, fallback in cases:
            if case_source is None:
                with ClusterSimulator.of_policy(profiles, HEURISTIC, seed=seed) as sim:
                    results[label].append(_outcome(requests, sim.run(requests), None))
                continue
            source = case_source
            if source not in trained:
                trained[source] = _models(source.pool, policy, source.workload, source.qps, 120.0, seed)
                if not any(metadata.kind == "ttft" for _, metadata in trained[source]):
                    # Served nothing, the run would measure the warm-up profile, not a model.
                    raise SystemExit(
                        f"no TTFT model was trained on {source.pool} ({source.workload} at {source.qps:g} "
                        f"req/s, seed {seed}) in 120 s: give it a higher rate"
                    )
            ledger = dataclasses.replace(ledger_settings, fallback_after_s=fallback)
            settings = ClusterSettings(ledger=ledger, training=False)
            with ClusterSimulator.of_policy(profiles, policy, settings=settings, seed=seed) as sim:
                sim.load_models(trained[source])
                stack = sim.pickers[0]
                assert stack.ledger is not None
                timeline = Timeline(stack.ledger)
                results[label].append(_outcome(requests, sim.run(requests), timeline))
    print(
        "\n| models served | TTFT p90 ms, not sheddable (median; per seed) | shed | TTFT SLO attainment "
        "| TTFT drift from s | distrusted from s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for label, _, _ in cases:
        outcomes = results[label]
        p90 = [o.ttft_p90_ms for o in outcomes]
        print(
            f"| {label} | {statistics.median(p90):,.0f} ({' / '.join(f'{v:,.0f}' for v in p90)}) "
            f"| {_fmt(_median([float(o.shed) for o in outcomes]), ',.0f')} "
            f"| {_fmt(_median([o.attainment for o in outcomes]), '.3f')} "
            f"| {_times([o.drift_at_s for o in outcomes])} "
            f"| {_times([o.distrusted_at_s for o in outcomes])} |"
        )


def _band(text: str) -> tuple[float, float]:
    """``LOW,HIGH`` with 0 <= LOW < HIGH <= 1 (the ``--coverage-band`` argument)."""
    try:
        low, high = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH, got {text!r}") from None
    if not 0.0 <= low < high <= 1.0:
        raise argparse.ArgumentTypeError(f"the band must have 0 <= LOW < HIGH <= 1, got {text!r}")
    return low, high


def _times(values: Sequence[float | None]) -> str:
    return " / ".join("—" if v is None else f"{v:.0f}" for v in values)


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
    broken_parser.add_argument("--pool", default=POOL)
    broken_parser.add_argument("--workload", default="new-user")
    broken_parser.add_argument("--qps", type=float, default=25.0)
    broken_parser.add_argument("--duration-s", type=float, default=180.0)
    broken_parser.add_argument("--policy", default=POLICY.name)
    broken_parser.add_argument("--fallback-after-s", type=float, default=60.0, help="the guard's setting")
    broken_parser.add_argument(
        "--coverage-band",
        type=_band,
        default=(LEDGER.coverage_low, LEDGER.coverage_high),
        metavar="LOW,HIGH",
        help="the ledger's coverage band (default: the router's)",
    )
    broken_parser.add_argument(
        "--model-from",
        action="append",
        type=Source.parse,
        metavar="POOL:WORKLOAD:QPS",
        help="a model trained there (repeat); default: this pool in a quiet hour, and a slower pool's",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.what == "change":
        change(seeds, args.qps, args.qps_after, args.switch_s, args.duration_s, args.step_s)
    else:
        sources = args.model_from or [
            Source(args.pool, args.workload, args.qps / 8),
            Source(OTHER_POOL, args.workload, args.qps * 0.6),
        ]
        low, high = args.coverage_band
        settings = dataclasses.replace(LEDGER, coverage_low=low, coverage_high=high)
        broken(
            seeds,
            args.pool,
            args.workload,
            args.qps,
            args.duration_s,
            args.policy,
            sources,
            settings,
            args.fallback_after_s,
        )


if __name__ == "__main__":
    main()
