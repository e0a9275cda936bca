"""The built-in scheduler configurations: the original's default, the predicted-latency pipeline (the
load-core one) and the ranking pipeline it replaced.

Why the predicted-latency pipeline is shaped as it is, setting by setting, is in docs/plugins.md ("The
built-in predicted-latency pipeline"), and the measurements behind each choice in docs/design/.
"""

from __future__ import annotations

from typing import Any

from slorouter.scheduling.config_schema import DEFAULT_PROFILE_NAME

# The original's built-in configuration (GIE PR #1827 weights); picker and profile handler are auto-added,
# and so is approx-prefix-cache-producer, for the data prefix-cache-scorer consumes.
DEFAULT_SCHEDULER_CONFIG: dict[str, Any] = {
    "plugins": [
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-cache-scorer"},
    ],
    "schedulingProfiles": [
        {
            "name": DEFAULT_PROFILE_NAME,
            "plugins": [
                {"pluginRef": "queue-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
            ],
        }
    ],
}


PREDICTION_PROFILE_NAME = "predicted-latency"


def _prediction_head() -> list[dict[str, Any]]:
    """The plugins both predicted pipelines start with: the profile handler, the warm-up profile's scorer and
    picker, the XGBoost producer and the SLO admitter (fresh dicts, so no two configs share one)."""
    return [
        {"type": "prediction-profile-handler"},
        {"type": "token-load-scorer", "parameters": {"countDecodeTokens": True}},
        {"type": "max-score-picker"},
        {"type": "predicted-latency-producer"},
        {"type": "latency-slo-admitter"},
    ]


def _loose_affinity_filter() -> dict[str, Any]:
    return {
        "name": "loose-affinity-filter",
        "type": "prefix-cache-affinity-filter",
        "parameters": {"affinityThreshold": 0.80},
    }


def _warm_up_profile() -> dict[str, Any]:
    """Requests without predictions (warm-up, predictor down, opted out): llm-d's token-aware profile."""
    return {
        "name": DEFAULT_PROFILE_NAME,
        "plugins": [
            {"pluginRef": "loose-affinity-filter"},
            {"pluginRef": "token-load-scorer"},
            {"pluginRef": "max-score-picker"},
        ],
    }


# The ranking pipeline (built in before the load-core one, opt-in now: examples/predicted-ranking.yaml), after
# the original's Helm pipeline (latencyPredictor.enabled=true): strict 0.99 affinity gate → SLO tier filter →
# loose 0.80 gate → latency-scorer ranking by the XGBoost TTFT prediction → picker, with the producer and the
# SLO admitter; requests without predictions run the token-aware default profile. Its five differences from
# the original, and why it is no longer the default, are in docs/plugins.md ("The ranking pipeline").
AFFINITY_TTFT_PENALTY_MS = 5000.0  # the original's; 1,000 ms was tried and lost on the mixed pool
PREDICTION_RANKING_SCHEDULER_CONFIG: dict[str, Any] = {
    "plugins": [
        *_prediction_head(),
        {
            "name": "strict-affinity-filter",
            "type": "prefix-cache-affinity-filter",
            "parameters": {"affinityThreshold": 0.99, "maxTTFTPenaltyMs": AFFINITY_TTFT_PENALTY_MS},
        },
        {"type": "slo-headroom-tier-filter"},
        _loose_affinity_filter(),
        {
            "type": "latency-scorer",
            "parameters": {"headroomSelectionStrategy": "most", "ttftWeight": 1.0, "tpotWeight": 0.0},
        },
        {"type": "prefix-cache-scorer"},
    ],
    "schedulingProfiles": [
        _warm_up_profile(),
        {
            "name": PREDICTION_PROFILE_NAME,
            "plugins": [
                {"pluginRef": "strict-affinity-filter"},
                {"pluginRef": "slo-headroom-tier-filter"},
                {"pluginRef": "loose-affinity-filter"},
                {"pluginRef": "latency-scorer", "weight": 1},
                {"pluginRef": "prefix-cache-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"},
            ],
        },
    ],
}


# The built-in predicted-latency pipeline (the load-core pipeline, spelled out in
# examples/predicted-latency.yaml). Why each piece is there, with the measurements, is in docs/plugins.md
# ("The built-in predicted-latency pipeline"). A deterministic load core — llm-d's token-aware
# routing: prefix affinity, then the prefill work ahead of the request on each pod — turned into expected
# milliseconds by an online fit of the pool's own first tokens, with each pod's learned speed and the decode
# streams its prefill would stall (load-latency-producer, expected-latency-scorer). The XGBoost predictor
# (predicted-latency-producer) decides where absolute latencies matter: which pods meet the request's TTFT
# SLO (slo-headroom-tier-filter) and which sheddable requests to drop (latency-slo-admitter). Requests without
# predictions (warm-up, predictor down, x-prediction-based-scheduling: false) run the token-aware default
# profile.
INTERFERENCE_WEIGHT = 0.1  # docs/design/interference-weight.md
# llm-d's token-aware affinity ("Sticky Until Saturated"): 0.8, its throughput gate at 18 s, no exploration
# (the token-aware benchmark policy).
TOKEN_AWARE_AFFINITY: dict[str, Any] = {
    "affinityThreshold": 0.8,
    "explorationProbability": 0.0,
    "ttftSource": "peakPrefillThroughput",
    "peakPrefillThroughput": 15928,
    "maxTTFTPenaltyMs": 18000,
}
# The prediction profile's affinity: 0.8 as llm-d's, the original's 1 % exploration (it seeds other pods with
# a session's prefix; without it chat TTFT p90 was 1.5-3x higher), and a gate on the load model's expected
# TTFT: a warm pod is left when a cold one is expected to answer 500 ms sooner, its own prefill included.
STICKY_AFFINITY: dict[str, Any] = {
    "affinityThreshold": 0.8,
    "explorationProbability": 0.01,
    "ttftSource": "expectedLatency",
    "maxTTFTPenaltyMs": 500,
}


def _load_core_plugins() -> list[dict[str, Any]]:
    """The built-in pipeline's plugins after its head: the load core, the prefix index, the affinity gates,
    the SLO tiers and the expected-latency scorer (fresh dicts)."""
    return [
        {"type": "load-latency-producer"},
        # Prompts only: indexing replies as the next turn's prefix (slorouter's addition) cost this pipeline
        # 10-20 % of TTFT p90 (docs/design/prefix-index.md).
        {"type": "approx-prefix-cache-producer", "parameters": {"indexResponses": False}},
        _loose_affinity_filter(),
        {
            "name": "sticky-affinity-filter",
            "type": "prefix-cache-affinity-filter",
            "parameters": STICKY_AFFINITY,
        },
        # TTFT tiers only: pruning on the predicted TPOT (the pod's decode batch now, where the request's TPOT
        # is set by the batches of its whole stream, i.e. by routing yet to come) cost TTFT p90 and did not
        # buy TPOT (docs/design/slo-tier-ttft-only.md).
        {"type": "slo-headroom-tier-filter", "parameters": {"dimensions": ["ttft"]}},
        # No decode term (decodeWeight, opt-in): it won on every engine variant of new-user and realtime-mix
        # and lost 2-3x TTFT p90 on maas-mix (docs/design/decode-term.md).
        {"type": "expected-latency-scorer", "parameters": {"interferenceWeight": INTERFERENCE_WEIGHT}},
    ]


def _predicted_profile(name: str, scorer: str) -> dict[str, Any]:
    """The prediction profile: SLO tiers, the sticky affinity gate, then ``scorer``."""
    return {
        "name": name,
        "plugins": [
            {"pluginRef": "slo-headroom-tier-filter"},
            {"pluginRef": "sticky-affinity-filter"},
            {"pluginRef": scorer},
            {"pluginRef": "max-score-picker"},
        ],
    }


PREDICTED_LATENCY_SCHEDULER_CONFIG: dict[str, Any] = {
    "plugins": [*_prediction_head(), *_load_core_plugins()],
    "schedulingProfiles": [
        _warm_up_profile(),
        _predicted_profile(PREDICTION_PROFILE_NAME, "expected-latency-scorer"),
    ],
}


# The self-tuning pipeline: every candidate the tuner may choose, as profiles of one configuration sharing its
# data producers (the prefix index of prompts, the load core, the XGBoost predictor and the SLO admitter), so
# that whichever candidate routes, the others' inputs follow all the traffic. The candidates are the built-in
# pipeline at three settings of its scorer (as shipped; without the interference term; with the decode term
# of docs/design/decode-term.md) and the benchmark's static policies of the same names. The tuner
# (docs/self-tuning.md) picks the active one from the pool's own recent traffic.
LEAN_SCORER = "expected-latency-scorer-lean"
DECODE_SCORER = "expected-latency-scorer-decode"
DECODE_WEIGHT = 0.02  # docs/design/decode-term.md
SELF_TUNING_CANDIDATES: tuple[str, ...] = (
    PREDICTION_PROFILE_NAME,
    "predicted-latency-lean",
    "predicted-latency-decode",
    "token-aware",
    "least-request",
    "round-robin",
    "heuristic",
    "heuristic-tuned",
)
_PREDICTED_CANDIDATES = {
    PREDICTION_PROFILE_NAME: "expected-latency-scorer",
    "predicted-latency-lean": LEAN_SCORER,
    "predicted-latency-decode": DECODE_SCORER,
}


def heuristic_blend_profile(name: str, queue: float, kv: float, prefix: float) -> dict[str, Any]:
    """The queue, KV-cache and prefix-cache scorers at these weights, then the max-score picker."""
    return {
        "name": name,
        "plugins": [
            {"pluginRef": "queue-scorer", "weight": queue},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": kv},
            {"pluginRef": "prefix-cache-scorer", "weight": prefix},
            {"pluginRef": "max-score-picker"},
        ],
    }


SELF_TUNING_SCHEDULER_CONFIG: dict[str, Any] = {
    "plugins": [
        {
            "type": "candidate-profile-handler",
            "parameters": {
                "candidates": [
                    {"name": name, "profile": name, "fallbackProfile": DEFAULT_PROFILE_NAME}
                    if name in _PREDICTED_CANDIDATES
                    else {"name": name, "profile": name}
                    for name in SELF_TUNING_CANDIDATES
                ]
            },
        },
        *_prediction_head()[1:],
        *_load_core_plugins(),
        {"name": LEAN_SCORER, "type": "expected-latency-scorer"},
        {
            "name": DECODE_SCORER,
            "type": "expected-latency-scorer",
            "parameters": {"interferenceWeight": INTERFERENCE_WEIGHT, "decodeWeight": DECODE_WEIGHT},
        },
        {
            "name": "token-aware-affinity-filter",
            "type": "prefix-cache-affinity-filter",
            "parameters": TOKEN_AWARE_AFFINITY,
        },
        {"name": "prefill-load-scorer", "type": "token-load-scorer"},
        {"type": "least-request-scorer"},
        {"type": "round-robin-picker"},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-cache-scorer"},
    ],
    "schedulingProfiles": [
        _warm_up_profile(),
        *[_predicted_profile(name, scorer) for name, scorer in _PREDICTED_CANDIDATES.items()],
        {
            "name": "token-aware",
            "plugins": [
                {"pluginRef": "token-aware-affinity-filter"},
                {"pluginRef": "prefill-load-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        },
        {
            "name": "least-request",
            "plugins": [{"pluginRef": "least-request-scorer"}, {"pluginRef": "max-score-picker"}],
        },
        {"name": "round-robin", "plugins": [{"pluginRef": "round-robin-picker"}]},
        heuristic_blend_profile("heuristic", 2, 2, 3),
        heuristic_blend_profile("heuristic-tuned", 3, 2, 2),
    ],
}
