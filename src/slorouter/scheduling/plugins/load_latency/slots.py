"""The wait for a batch slot of a request sent to a pod at its cap of running requests."""

from __future__ import annotations

import math

import numpy as np


class BatchSlotQueue:
    """Per pod: how many requests it runs at once at most, and how long a request takes there, so the wait
    of a request beyond that cap can be estimated: places beyond the cap × service time / cap.

    The cap is learned from the pod's scraped metrics: when it reports requests waiting, the requests it runs
    are as many as it can (its ``max_num_seqs``, or what its KV cache admits then). A pod never seen
    waiting has no known cap and no slot wait. The service time is a moving mean of its requests' dispatch
    to end of stream."""

    def __init__(self, *, service_alpha: float = 0.05) -> None:
        self._alpha = service_alpha
        self._cap: dict[str, float] = {}
        self._service_ms: dict[str, float] = {}

    def learn_caps(self, pods: list[str], waiting: np.ndarray, running: np.ndarray) -> None:
        for i in np.flatnonzero((waiting > 0) & (running > 0)).tolist():
            pod = pods[i]
            seen = float(running[i])
            if seen > self._cap.get(pod, 0.0):
                self._cap[pod] = seen

    def observe_service(self, pod: str, service_ms: float) -> None:
        if not (service_ms > 0 and math.isfinite(service_ms)):
            return
        mean = self._service_ms.get(pod)
        self._service_ms[pod] = service_ms if mean is None else mean + self._alpha * (service_ms - mean)

    def pods(self) -> set[str]:
        return self._cap.keys() | self._service_ms.keys()

    def forget(self, pod: str) -> None:
        self._cap.pop(pod, None)
        self._service_ms.pop(pod, None)

    def wait_ms(self, pods: list[str], inflight_requests: np.ndarray) -> np.ndarray:
        """Expected wait for a slot of a request sent now to each pod (0 where the cap or time is unknown)."""
        cap = np.array([self._cap.get(p, math.inf) for p in pods])
        service = np.array([self._service_ms.get(p, 0.0) for p in pods])
        beyond = np.maximum(np.asarray(inflight_requests, dtype=np.float64) + 1.0 - cap, 0.0)
        return beyond * service / cap
