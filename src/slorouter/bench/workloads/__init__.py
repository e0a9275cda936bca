"""Workload generators of ``slorouter bench``: timed requests with realistic lengths and prefix sharing.

``generate(name, qps=..., duration_s=..., seed=...)`` gives a ``WorkloadRequests`` (a list of
``BenchRequest`` in arrival order that also counts the requests clipped or dropped to fit
``max_model_len``); ``workload_names()`` and ``workload_defaults(name)`` describe what exists;
``summarize(requests)`` measures a list. See docs/workloads.md.
"""

from slorouter.bench.workloads.registry import (
    generate,
    workload_defaults,
    workload_description,
    workload_names,
)
from slorouter.bench.workloads.request import BenchRequest, WorkloadRequests
from slorouter.bench.workloads.summary import WorkloadSummary, prefix_reuse, summarize

__all__ = [
    "BenchRequest",
    "WorkloadRequests",
    "WorkloadSummary",
    "generate",
    "prefix_reuse",
    "summarize",
    "workload_defaults",
    "workload_description",
    "workload_names",
]
