"""Which change bought what: variants of the predicted-latency pipeline on one workload and load.

Each variant is the shipped ``predicted-latency`` policy with changes joined by ``+``:

- ``picker=TYPE``: the prediction profile's picker (e.g. ``weighted-random-picker``, the original's);
- ``scorer=TYPE:WEIGHT``: add a scorer to the prediction profile (the latency scorer has weight 1); TYPE
  may also be the name of a plugin declared with ``plugin=``;
- ``plugin=NAME:TYPE[:JSON]``: declare a plugin of that type, named NAME, with JSON parameters;
- ``drop=REF``: remove that plugin reference from the prediction profile;
- ``gate=MS``: both affinity filters' ``maxTTFTPenaltyMs`` (the original: 5000; 0 disables the gate);
- ``param=PLUGIN:KEY:JSON``: set a parameter of the plugins of that type or name, e.g.
  ``param=latency-scorer:headroomSelectionStrategy:"most"``;
- ``trainer=OBJECTIVE``: ``conformal`` (default), ``quantile`` (the original's) or ``mean``;
- ``nobaseline``: train without the linear load baseline;
- ``fallback=Q:K:P[:T]``: the heuristic (warm-up fallback) profile's queue, KV-cache, prefix (and
  token-load) scorer weights; ``fallback=POLICY``: a built-in single-profile policy as that profile;
- a built-in policy name instead runs that policy unchanged.

    .venv/bin/python benchmarks/bench_pipeline_variants.py [WORKLOAD QPS POOL DURATION WARMUP VARIANT...]
        [--seed N] [--param KEY=VALUE ...]

Without arguments: sharegpt at 100 QPS on 8 × qwen3-32b-h100-tp2, 120 s (30 s warm-up), heuristic-tuned vs
the pipeline as first built vs the shipped one.

e.g. ``... maas-mix 150 "4x llama3-8b-h100 + 4x llama3-8b-a100" 120 30 heuristic-tuned
"trainer=quantile+nobaseline+picker=weighted-random-picker+gate=5000" predicted-latency``
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

from slorouter.bench.cluster import ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES, PREDICTOR_PLUGIN
from slorouter.bench.pool import parse_pool
from slorouter.bench.results import summarize_run
from slorouter.bench.workloads import generate
from slorouter.predictor.trainer import TrainerConfig

COLUMNS = [
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p90_ms",
    "e2e_p50_ms",
    "slo_attainment",
    "slo_attainment_admitted",
    "shed",
    "prefix_cache_hit_rate",
    "ttft_mape",
    "ttft_p90_coverage",
    "e2e_mape",
    "sim_wall_s",
]


def variant_config(name: str) -> tuple[dict[str, Any], TrainerConfig]:
    trainer: dict[str, Any] = {"retrain_interval_s": 5.0, "min_samples": 200, "nthread": 1}
    if name in BUILTIN_POLICIES:
        return copy.deepcopy(BUILTIN_POLICIES[name]), TrainerConfig(**trainer)
    config = copy.deepcopy(BUILTIN_POLICIES["predicted-latency"])
    plugins = config["plugins"]
    prediction_profile = next(p for p in config["schedulingProfiles"] if p["name"] == "predicted-latency")
    for change in name.split("+"):
        key, _, value = change.partition("=")
        if key == "picker":
            if not any((p.get("name") or p["type"]) == value for p in plugins):
                plugins.append({"type": value})
            prediction_profile["plugins"][-1] = {"pluginRef": value}
        elif key == "scorer":
            scorer, weight = value.split(":")
            if not any((p.get("name") or p["type"]) == scorer for p in plugins):
                plugins.append({"type": scorer})
            refs = prediction_profile["plugins"]
            refs.insert(len(refs) - 1, {"pluginRef": scorer, "weight": float(weight)})
        elif key == "plugin":
            plugin_name, plugin_type, *raw_params = value.split(":", 2)
            parameters = json.loads(raw_params[0]) if raw_params else {}
            plugins.append({"name": plugin_name, "type": plugin_type, "parameters": parameters})
        elif key == "drop":
            refs = prediction_profile["plugins"]
            if not any(ref["pluginRef"] == value for ref in refs):
                raise SystemExit(f"drop={value}: the prediction profile has no such plugin reference")
            prediction_profile["plugins"] = [ref for ref in refs if ref["pluginRef"] != value]
        elif key == "gate":
            for plugin in plugins:
                if plugin["type"] == "prefix-cache-affinity-filter":
                    plugin.setdefault("parameters", {})["maxTTFTPenaltyMs"] = float(value)
        elif key == "param":
            plugin_type, parameter, raw = value.split(":", 2)
            for plugin in plugins:
                if plugin_type in (plugin["type"], plugin.get("name")):
                    plugin.setdefault("parameters", {})[parameter] = json.loads(raw)
        elif key == "trainer":
            trainer["objective"] = value
        elif key == "fallback" and value in BUILTIN_POLICIES:
            replacement = copy.deepcopy(BUILTIN_POLICIES[value])
            (profile,) = replacement["schedulingProfiles"]
            renamed = {}
            for plugin in replacement["plugins"]:
                renamed[plugin.get("name") or plugin["type"]] = (
                    f"fallback-{plugin.get('name') or plugin['type']}"
                )
                plugins.append({**plugin, "name": renamed[plugin.get("name") or plugin["type"]]})
            heuristic_profile = next(
                p for p in config["schedulingProfiles"] if p["name"] != "predicted-latency"
            )
            heuristic_profile["plugins"] = [
                {**ref, "pluginRef": renamed[ref["pluginRef"]]} for ref in profile["plugins"]
            ]
        elif key == "fallback":
            scorers = (
                "queue-scorer",
                "kv-cache-utilization-scorer",
                "prefix-cache-scorer",
                "token-load-scorer",
            )
            weights = dict(zip(scorers, map(float, value.split(":")), strict=False))
            heuristic_profile = next(
                p for p in config["schedulingProfiles"] if p["name"] != "predicted-latency"
            )
            refs = heuristic_profile["plugins"]
            for ref in refs:
                if ref["pluginRef"] in weights:
                    ref["weight"] = weights.pop(ref["pluginRef"])
            for scorer, weight in weights.items():
                if not any((p.get("name") or p["type"]) == scorer for p in plugins):
                    plugins.append({"type": scorer})
                refs.insert(len(refs) - 1, {"pluginRef": scorer, "weight": weight})
        elif key == "nobaseline":
            trainer["baseline"] = False
        else:
            raise SystemExit(f"unknown change {change!r} in variant {name!r}")
    return config, TrainerConfig(**trainer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?", default="sharegpt")
    parser.add_argument("qps", nargs="?", type=float, default=100.0)
    parser.add_argument("pool", nargs="?", default="8x qwen3-32b-h100-tp2")
    parser.add_argument("duration", nargs="?", type=float, default=120.0)
    parser.add_argument("warmup", nargs="?", type=float, default=30.0)
    parser.add_argument(
        "variants",
        nargs="*",
        default=[
            "heuristic-tuned",
            "trainer=quantile+nobaseline+picker=weighted-random-picker",  # as first built
            "predicted-latency",
        ],
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--param", action="append", default=[], help="workload parameter KEY=VALUE")
    args = parser.parse_args()
    pool = parse_pool(args.pool)
    params = dict(p.split("=", 1) for p in args.param)
    requests = generate(
        args.workload,
        qps=args.qps,
        duration_s=args.duration,
        seed=args.seed,
        params=params,
        max_model_len=min(p.max_model_len for p in pool),
    )
    print(
        f"{args.workload} at {args.qps:g} QPS on {args.pool}, {args.duration:g} s (warm-up {args.warmup:g}), "
        f"seed {args.seed}, {len(requests)} requests\n"
    )
    print("| variant | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for name in args.variants:
        config, trainer = variant_config(name)
        uses_predictor = any(p["type"] == PREDICTOR_PLUGIN for p in config["plugins"])
        with ClusterSimulator(
            pool, config, use_predictor=uses_predictor, seed=args.seed, trainer_config=trainer
        ) as sim:
            rec = sim.run(requests)
        summary = summarize_run(rec, warmup_s=args.warmup, duration_s=args.duration)
        print(f"| {name} | " + " | ".join(str(summary.get(c, "")) for c in COLUMNS) + " |", flush=True)


if __name__ == "__main__":
    main()
