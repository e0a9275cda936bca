"""Where the predicted-latency pipeline's TTFT error is, and how it spreads load: one `slorouter bench` run
in virtual time, broken down by request class and by pod (docs/benchmarks.md, "The predictor").

For the chosen pod of every predicted request it compares the actual TTFT with the XGBoost point prediction
and with ``load-latency-producer``'s expected TTFT (the linear load model the scorer ranks by), per class
(chat: prompts up to ``--long-tokens``; long: the rest); it also prints the served p90's TTFT and TPOT
coverage per class and each pod's share of the requests with its TPOT p50 and p90. ``--policy`` takes
``NAME=FILE`` too (e.g. the built-in pipeline with ``coverageStep: 0``).

    .venv/bin/python benchmarks/prediction_error.py [--policy predicted-latency] [--workload realtime-mix]
        [--pool "4x llama3-8b-h100"] [--qps 30.3] [--duration 120] [--warmup 30] [--seed 0]

The load model's expectation is not a field of the run's records: the script wraps the producer's two hooks
for the run (``recording_expected_ttft``) to keep the expectation of the candidate the request went to.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import numpy as np

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import resolve_policy
from slorouter.bench.pool import parse_pool
from slorouter.bench.workloads import generate
from slorouter.scheduling.datakeys import EXPECTED_TTFT_MS
from slorouter.scheduling.plugins.load_latency import LoadLatencyProducer

_STATE_KEY = "prediction_error.expected"


@contextlib.contextmanager
def recording_expected_ttft() -> Iterator[dict[int, float]]:
    """Request index -> the load model's expected TTFT (ms) for the pod it was sent to."""
    expected: dict[int, float] = {}
    produce, pre_request = LoadLatencyProducer.produce, LoadLatencyProducer.pre_request

    def recording_produce(self, request, candidates):  # type: ignore[no-untyped-def]
        produce(self, request, candidates)
        values = candidates.attrs.get(EXPECTED_TTFT_MS)
        if values is not None:
            request.state[_STATE_KEY] = (values, [e.address for e in candidates.endpoints])

    def recording_pre_request(self, request, result):  # type: ignore[no-untyped-def]
        values, pods = request.state.get(_STATE_KEY, (None, []))
        if values is not None and result.target.address in pods:
            expected[int(request.request_id)] = float(values[pods.index(result.target.address)])
        return pre_request(self, request, result)

    LoadLatencyProducer.produce = recording_produce  # type: ignore[method-assign]
    LoadLatencyProducer.pre_request = recording_pre_request  # type: ignore[method-assign]
    try:
        yield expected
    finally:
        LoadLatencyProducer.produce = produce  # type: ignore[method-assign]
        LoadLatencyProducer.pre_request = pre_request  # type: ignore[method-assign]


def _ape(actual: np.ndarray, predicted: np.ndarray) -> tuple[float, float, int]:
    ok = np.isfinite(predicted) & np.isfinite(actual) & (actual > 0)
    error = np.abs(actual[ok] - predicted[ok]) / actual[ok]
    return (float(error.mean()), float(np.median(error)), int(ok.sum())) if ok.any() else (np.nan, np.nan, 0)


def _coverage(actual: np.ndarray, served: np.ndarray) -> float:
    """Share of the requests with a served prediction whose actual latency was at or below it."""
    ok = np.isfinite(served) & np.isfinite(actual) & (served > 0)
    return float(np.mean(actual[ok] <= served[ok])) if ok.any() else np.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--policy", default="predicted-latency")
    parser.add_argument("--workload", default="realtime-mix")
    parser.add_argument("--pool", default="4x llama3-8b-h100")
    parser.add_argument("--qps", type=float, default=30.3)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-tokens", type=int, default=1000, help="prompts above this are 'long'")
    args = parser.parse_args()

    profiles = parse_pool(args.pool)
    policy = resolve_policy(args.policy)
    requests = generate(
        args.workload,
        qps=args.qps,
        duration_s=args.duration,
        seed=args.seed,
        max_model_len=min(p.max_model_len for p in profiles),
    )
    with (
        recording_expected_ttft() as expected,
        ClusterSimulator(
            profiles,
            policy.config,
            use_predictor=policy.uses_predictor,
            kv_events=policy.uses_kv_events,
            settings=ClusterSettings(),
            seed=args.seed,
        ) as sim,
    ):
        rec = sim.run(requests)

    actual = rec.ttft_s * 1000.0
    load_model = np.full(len(actual), np.nan)
    for index, value in expected.items():
        load_model[index] = value
    measured = (rec.arrival >= args.warmup) & np.isfinite(actual)
    long = rec.prompt_tokens > args.long_tokens
    print(f"{args.policy} on {args.workload}, {args.pool}, {args.qps:g} QPS, seed {args.seed}")
    for name, of_class in (("all", measured), ("chat", measured & ~long), ("long", measured & long)):
        routed = of_class & rec.predicted
        xgb, lm = _ape(actual[routed], rec.point_ttft_ms[routed]), _ape(actual[routed], load_model[routed])
        coverage = _coverage(actual[routed], rec.predicted_ttft_ms[routed])
        tpot_coverage = _coverage(rec.tpot_ms[routed], rec.predicted_tpot_ms[routed])
        print(
            f"  {name}: XGBoost point APE mean {xgb[0]:.3f} median {xgb[1]:.3f} | load model APE mean "
            f"{lm[0]:.3f} median {lm[1]:.3f} (n={xgb[2]}) | served p90 coverage TTFT {coverage:.3f} "
            f"TPOT {tpot_coverage:.3f}"
        )
    tpot = rec.tpot_ms
    with_tpot = measured & np.isfinite(tpot)
    for pod, profile in enumerate(profiles):
        on_pod = with_tpot & (rec.pod == pod)
        if not on_pod.any():
            print(f"  pod {pod} {profile.name}: no requests")
            continue
        print(
            f"  pod {pod} {profile.name}: share {on_pod.sum() / with_tpot.sum():.2f}, TPOT p50 "
            f"{np.median(tpot[on_pod]):.1f} p90 {np.percentile(tpot[on_pod], 90):.1f} ms"
        )
    # Where the long-lived streams go: a pod's concurrent streams grow with their durations (Little's law),
    # not with its request count.
    done = np.isfinite(rec.e2e_s) & (rec.pod >= 0)
    window = max(args.duration, 1e-9)
    class_of_pod = np.array([p.name for p in profiles] + [""])  # the last slot: requests served by no pod
    class_of_request = class_of_pod[rec.pod]
    for name in sorted({p.name for p in profiles}):
        of_class = class_of_request == name
        pods = sum(p.name == name for p in profiles)
        shares = [
            np.mean(of_class[done & bucket])
            for bucket in (rec.output_tokens <= 100, (rec.output_tokens > 100) & (rec.output_tokens <= 1000),
                           rec.output_tokens > 1000)
        ]  # fmt: skip
        streams = rec.e2e_s[done & of_class].sum() / window / pods
        print(
            f"  {name}: share of outputs <=100 / 101-1000 / >1000 tokens {shares[0]:.2f} / {shares[1]:.2f} / "
            f"{shares[2]:.2f}; requests per pod {np.sum(done & of_class) / pods:.0f}; mean concurrent "
            f"streams per pod {streams:.0f}"
        )
    ttft_p90 = np.percentile(actual[measured], 90)
    print(f"  TPOT p50 {np.median(tpot[with_tpot]):.1f} ms, TTFT p90 {ttft_p90:.0f} ms")


if __name__ == "__main__":
    main()
