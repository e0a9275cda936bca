"""A twin of the pool: one simulated engine per pod, fitted to what the router observes of it.

Every pod's twin is one generic engine model (``BASE``: the step-time terms of docs/simulator.md) with two
scales fitted to the pod, one on the prefill terms (per scheduled token, per attention pair) and one on the
decode terms (weight reads, per context token read, per request, per step), and three sizes read from the
pod: its KV capacity (scraped ``cache_config_info``), its batch cap (the most requests it ran while it
reported requests waiting) and its block size. Nothing else of the pod is known to the twin: its scheduler,
chunking, metric delays and API overheads are the base's, so a twin is always wrong somewhere, and the
tuner measures by how much before it trusts one (``tuner.py``).

Fitting starts from the window directly (``initial``): the decode scale from the median TPOT against the
base's decode step at the median batch, the prefill scale from the lightest TTFTs against the base's prefill
of the prompt alone. Those are rough (a pod of exactly the base's speed came out at 1.75× decode: the TPOT
holds prefill chunks too), so the scales are then fitted by replay (``fit_to_placements``): each pod alone
serves the requests the router sent it, and its scales move until its replayed TTFT and TPOT match the
observed ones (median ratio 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.tuning.figures import MIN_POD_REQUESTS
from slorouter.bench.workloads.request import WorkloadRequests
from slorouter.serving.traffic_window import WindowEntry
from slorouter.sim.profiles import LLAMA3_8B_H100, Profile

if TYPE_CHECKING:
    from slorouter.bench.tuning.replay import Traffic

BASE = LLAMA3_8B_H100
MIN_SCALE, MAX_SCALE = 1e-3, 1e4
FIT_LIMIT = 4.0  # most a scale moves in one fitting iteration
# The router of a one-pod replay: every request to the one pod.
ONE_POD_ROUTER: dict[str, Any] = {
    "plugins": [{"type": "random-picker"}],
    "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "random-picker"}]}],
}


@dataclass(frozen=True, slots=True)
class PodTwin:
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    num_gpu_blocks: int | None = None  # None: the base's
    block_size: int | None = None
    max_num_seqs: int | None = None  # None: never seen at its cap; the base's

    def profile(self, name: str, max_model_len: int) -> Profile:
        p, d = self.prefill_scale, self.decode_scale
        return dataclasses.replace(
            BASE,
            name=name,
            description="a twin of a pod, fitted to what the router observed",
            c_lin_ms=BASE.c_lin_ms * p,
            c_attn_ms=BASE.c_attn_ms * p,
            w_ms=BASE.w_ms * d,
            c_kv_ms=BASE.c_kv_ms * d,
            c_req_ms=BASE.c_req_ms * d,
            c_step_ms=BASE.c_step_ms * d,
            num_gpu_blocks=self.num_gpu_blocks or BASE.num_gpu_blocks,
            block_size=self.block_size or BASE.block_size,
            max_num_seqs=self.max_num_seqs or BASE.max_num_seqs,
            max_model_len=max_model_len,
        )


@dataclass(frozen=True, slots=True)
class PoolTwin:
    addresses: tuple[str, ...]
    pods: tuple[PodTwin, ...]

    def profiles(self, max_model_len: int) -> list[Profile]:
        return [pod.profile(f"twin-{i}", max_model_len) for i, pod in enumerate(self.pods)]

    @property
    def pod_of(self) -> dict[str, int]:
        return {address: i for i, address in enumerate(self.addresses)}

    def with_sizes(self, entries: Sequence[WindowEntry], capacity: Mapping[str, tuple[int, int]]) -> PoolTwin:
        """The twin with each pod's KV capacity and block size (``capacity``: scraped, 0 when unknown) and
        batch cap (from the window's scraped queues) brought up to date."""
        caps = batch_caps(entries)
        pods = []
        for address, pod in zip(self.addresses, self.pods, strict=True):
            blocks, block_size = capacity.get(address, (0, 0))
            cap = max(caps.get(address, 0), pod.max_num_seqs or 0)
            pods.append(
                dataclasses.replace(
                    pod,
                    num_gpu_blocks=blocks or pod.num_gpu_blocks,
                    block_size=block_size or pod.block_size,
                    max_num_seqs=cap or None,
                )
            )
        return PoolTwin(self.addresses, tuple(pods))


def fit_to_placements(
    twin: PoolTwin, traffic: Traffic, *, iterations: int, settings: ClusterSettings | None = None
) -> PoolTwin:
    """Each pod's scales fitted to its own requests: the pod's twin alone serves the requests the router sent
    it, at their times, and its scales move by the median ratio of observed to replayed TTFT (prefill) and
    TPOT (decode) over those requests, ``iterations`` times. Pods are fitted independently, free of routing:
    what the replay gets wrong here is the engine model's error, not the router's."""
    pod_of = twin.pod_of
    placed: list[list[int]] = [[] for _ in twin.pods]
    for j, entry in enumerate(traffic.entries):
        i = pod_of.get(entry.endpoint)
        if i is not None and entry.ttft_ms is not None:
            placed[i].append(j)
    base = settings or ClusterSettings()
    single = ClusterSettings(
        scrape_interval_s=base.scrape_interval_s,
        network_s=base.network_s,
        drain_s=base.drain_s,
        training=False,
    )
    pods = list(twin.pods)
    for i, indices in enumerate(placed):
        if len(indices) < MIN_POD_REQUESTS:
            continue
        requests = WorkloadRequests("pod", [traffic.requests[j] for j in indices])
        seen_ttft = np.array([traffic.entries[j].ttft_ms for j in indices], dtype=np.float64)
        seen_tpot = np.array(
            [math.nan if (t := traffic.entries[j].tpot_ms) is None else t for j in indices], dtype=np.float64
        )
        pod = pods[i]
        prefill, decode = _Secant(pod.prefill_scale), _Secant(pod.decode_scale)
        for _ in range(iterations):
            with ClusterSimulator(
                [pod.profile("twin", traffic.max_model_len)],
                ONE_POD_ROUTER,
                use_predictor=False,
                settings=single,
            ) as sim:
                rec = sim.run(requests)
            ttft = rec.ttft_s * 1000.0
            with np.errstate(invalid="ignore", divide="ignore"):
                tpot = np.where(
                    rec.output_tokens > 1,
                    (rec.e2e_s - rec.ttft_s) * 1000.0 / (rec.output_tokens - 1),
                    math.nan,
                )
            pod = dataclasses.replace(
                pod,
                prefill_scale=prefill.step(_median_ratio(seen_ttft, ttft)),
                decode_scale=decode.step(_median_ratio(seen_tpot, tpot)),
            )
        pods[i] = pod
    return PoolTwin(twin.addresses, tuple(pods))


class _Secant:
    """One scale's search for the value at which the replay's median ratio to what was observed is 1, in
    log space: the first step assumes the replayed figure is proportional to the scale, later ones use the
    slope measured between the last two steps (kept within [0.2, 2] of proportional, each move within
    ``FIT_LIMIT``)."""

    def __init__(self, scale: float) -> None:
        self.log_scale = math.log(scale)
        self._last: tuple[float, float] | None = None  # (log scale, log ratio) of the previous step

    def step(self, ratio: float | None) -> float:
        if ratio is not None:
            error = math.log(ratio)
            slope = 1.0
            if self._last is not None and self.log_scale != self._last[0]:
                measured = (self._last[1] - error) / (self.log_scale - self._last[0])
                slope = min(max(measured, 0.2), 2.0)
            self._last = (self.log_scale, error)
            move = min(max(error / slope, -math.log(FIT_LIMIT)), math.log(FIT_LIMIT))
            self.log_scale += move
        return _clipped(math.exp(self.log_scale))


def _median_ratio(observed: np.ndarray, replayed: np.ndarray) -> float | None:
    both = np.isfinite(observed) & np.isfinite(replayed) & (observed > 0) & (replayed > 0)
    if both.sum() < MIN_POD_REQUESTS:
        return None
    return float(np.exp(np.median(np.log(observed[both] / replayed[both]))))


def initial(addresses: Sequence[str], entries: Sequence[WindowEntry]) -> PoolTwin:
    """A first twin from the window alone (see the module docstring); scales 1 where nothing was seen."""
    pods = []
    for address in addresses:
        mine = [e for e in entries if e.endpoint == address and e.ttft_ms is not None]
        pods.append(PodTwin(prefill_scale=_prefill_scale(mine), decode_scale=_decode_scale(mine)))
    return PoolTwin(tuple(addresses), tuple(pods))


def batch_caps(entries: Sequence[WindowEntry]) -> dict[str, int]:
    """Per pod, the most requests it ran while it reported requests waiting (absent: never seen waiting)."""
    caps: dict[str, int] = {}
    for e in entries:
        if e.waiting > 0 and e.running > 0 and math.isfinite(e.running):
            caps[e.endpoint] = max(caps.get(e.endpoint, 0), int(e.running))
    return caps


def _decode_scale(entries: Sequence[WindowEntry]) -> float:
    streamed = [e for e in entries if e.tpot_ms is not None]
    if len(streamed) < MIN_POD_REQUESTS:
        return 1.0
    batch = max(
        float(np.median([max(e.running, 1.0) for e in streamed if math.isfinite(e.running)] or [1.0])), 1.0
    )
    context = float(np.median([e.prompt_tokens + e.output_tokens / 2 for e in streamed]))
    base_ms = BASE.step_ms(int(batch), 0.0, int(batch * context), int(batch))
    tpot = float(np.median([e.tpot_ms for e in streamed if e.tpot_ms is not None]))
    return _clipped(tpot / base_ms)


def _prefill_scale(entries: Sequence[WindowEntry]) -> float:
    if len(entries) < MIN_POD_REQUESTS:
        return 1.0
    fixed_ms = BASE.api_pre_ms
    ratios = []
    for e in entries:
        n = e.prompt_tokens
        base_ms = BASE.step_ms(n, n * n / 2.0, 0, 0)
        assert e.ttft_ms is not None
        ratios.append(max(e.ttft_ms - fixed_ms, 0.1) / base_ms)
    return _clipped(float(np.quantile(ratios, 0.25)))  # the lightest quarter: the least queueing


def _clipped(scale: float) -> float:
    return min(max(scale, MIN_SCALE), MAX_SCALE)
