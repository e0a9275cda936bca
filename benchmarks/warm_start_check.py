"""The warm start's live check on simulator traffic: how often it drops a good model, and what it drops.

For each case a model is trained (the default trainer) on the samples of a "previous run" and scored, with
the live check's own code (``live_check.score``), on consecutive windows of a "live run" (another seed),
``--window`` samples each (default ``LIVE_SAMPLES``): the median ratio per window, the share of windows
outside the bound (the share of starts that would drop the model), and the share a MAPE > 0.5 rule would
drop instead. Virtual time (``generate_samples``), 4 × llama3-8b-h100.

The target is what the router trains its TTFT model on: the first-token latency in ``streamingMode``, the
end-to-end latency otherwise (the default pipeline's), which depends on the output length, not one of the
TTFT model's features. The script first prints the end-to-end latency of one short prompt on an idle pod by
its output length.

    .venv/bin/python benchmarks/warm_start_check.py [--samples 3000] [--seed 0] [--window 32]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from slorouter.bench.samples import SimSamples, SimWorkload, generate_samples
from slorouter.predictor.live_check import LIVE_SAMPLES, MAX_FACTOR, LiveScore, score
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig
from slorouter.sim.engine import Engine
from slorouter.sim.profiles import get_profile

DEFAULT = SimWorkload()  # output lengths log-normal, median 100 tokens; load 5-110 % of capacity
# A user trying the embedded default by hand: 16-token completions, a nearly idle pool.
BY_HAND = replace(DEFAULT, output_median=16.0, output_sigma=0.0, load_range=(0.02, 0.1))
SLOWER_POOL = replace(DEFAULT, slowdown=(4.5,))  # same KV-cache shape, every step 4.5× longer


@dataclass(frozen=True)
class Case:
    name: str
    previous: SimWorkload
    live: SimWorkload
    streaming: bool  # the target: first-token latency (True) or end-to-end latency


CASES = (
    Case("same traffic, end-to-end target", DEFAULT, DEFAULT, streaming=False),
    Case("same traffic, first-token target", DEFAULT, DEFAULT, streaming=True),
    Case("previous: median 100 output tokens; live: 16 by hand (end-to-end)", DEFAULT, BY_HAND, False),
    Case("previous: a 4.5x slower pool of the same shape (first token)", SLOWER_POOL, DEFAULT, True),
)


def idle_e2e_ms(output_tokens: int) -> float:
    """One 4-token prompt on an idle llama3-8b-h100 engine: arrival to the whole response, ms."""
    engine = Engine(get_profile("llama3-8b-h100"), seed=0)
    engine.add_request(1, [1, 2, 3, 4], output_tokens, 0.0)
    now = 0.0
    while True:
        step = engine.plan_step(now)
        if step is None:
            ready = engine.next_ready_time()
            assert ready is not None
            now = ready
            continue
        now = step.end
        for done in engine.commit_step(step).finished:
            return (done.done_time - done.arrival_time) * 1000.0


def target_ms(samples: SimSamples, streaming: bool) -> np.ndarray:
    if streaming:
        return samples.ttft_ms
    decode = np.nan_to_num(samples.tpot_ms) * np.maximum(samples.columns["num_tokens_generated"] - 1, 0)
    return samples.ttft_ms + decode


def window_scores(case: Case, n: int, seed: int, window: int, directory: Path) -> list[LiveScore]:
    previous = generate_samples(n, seed=seed, workload=case.previous)
    live = generate_samples(n, seed=seed + 1, workload=case.live)
    store = SampleStore()
    x_prev, _ = previous.dataset("ttft")
    store.add("ttft", x_prev, target_ms(previous, case.streaming))
    trainer = Trainer(store, ModelStore(directory / case.name), TrainerConfig(nthread=1))
    report = trainer.train("ttft")
    assert report is not None and report.accepted
    metadata = trainer.current_metadata("ttft")
    assert metadata is not None
    x_live, _ = live.dataset("ttft")
    y_live = target_ms(live, case.streaming)
    point = trainer.point_predictions("ttft", x_live)
    assert point is not None
    holdout = float(metadata.metrics.get("mean_log_ratio", 0.0))
    starts = range(0, len(y_live) - window + 1, window)
    return [score(y_live[i : i + window], point[i : i + window], holdout) for i in starts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=3000, help="requests per run (default 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--window", type=int, default=LIVE_SAMPLES, help=f"live samples per check (default {LIVE_SAMPLES})"
    )
    args = parser.parse_args()
    idle = ", ".join(f"{n} tokens {idle_e2e_ms(n):.1f} ms" for n in (16, 64, 128))
    print(f"end-to-end latency on an idle pod, by output length: {idle}\n")
    print(
        f"| case | windows of {args.window} | median ratio: min / median / max | dropped (ratio outside "
        f"[1/{MAX_FACTOR:g}, {MAX_FACTOR:g}]) | dropped by MAPE > 0.5 instead |"
    )
    print("|---|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as directory:
        for case in CASES:
            scores = window_scores(case, args.samples, args.seed, args.window, Path(directory))
            ratios = np.array([s.ratio for s in scores])
            dropped = np.mean([not s.within(MAX_FACTOR) for s in scores])
            by_mape = np.mean([s.mape > 0.5 for s in scores])
            low, mid, high = np.min(ratios), np.median(ratios), np.max(ratios)
            print(
                f"| {case.name} | {len(scores)} | {low:.2f} / {mid:.2f} / {high:.2f} | {dropped:.0%} | "
                f"{by_mape:.0%} |"
            )


if __name__ == "__main__":
    main()
