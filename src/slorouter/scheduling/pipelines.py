"""The built-in scheduler configurations: the original's default, and the predicted-latency pipeline.

Why the predicted-latency pipeline is shaped as it is, setting by setting and with the measurements behind
each choice, is in docs/plugins.md ("The built-in predicted-latency pipeline").
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
# After the original's Helm pipeline (latencyPredictor.enabled=true): strict 0.99 affinity gate → SLO tier
# filter → loose 0.80 gate → latency-scorer → picker, with the producer and the SLO admitter; requests without
# predictions run the heuristic default profile. Its five differences from the original, and the measurements
# that chose them, are in docs/plugins.md ("Predicted-latency plugins").
AFFINITY_TTFT_PENALTY_MS = 5000.0  # the original's; 1,000 ms was tried and lost on the mixed pool
PREDICTED_LATENCY_SCHEDULER_CONFIG: dict[str, Any] = {
    "plugins": [
        {"type": "prediction-profile-handler"},
        {"type": "token-load-scorer", "parameters": {"countDecodeTokens": True}},
        {"type": "max-score-picker"},
        {"type": "predicted-latency-producer"},
        {"type": "latency-slo-admitter"},
        {
            "name": "strict-affinity-filter",
            "type": "prefix-cache-affinity-filter",
            "parameters": {"affinityThreshold": 0.99, "maxTTFTPenaltyMs": AFFINITY_TTFT_PENALTY_MS},
        },
        {"type": "slo-headroom-tier-filter"},
        {
            "name": "loose-affinity-filter",
            "type": "prefix-cache-affinity-filter",
            "parameters": {"affinityThreshold": 0.80},
        },
        {
            "type": "latency-scorer",
            "parameters": {"headroomSelectionStrategy": "most", "ttftWeight": 1.0, "tpotWeight": 0.0},
        },
        {"type": "prefix-cache-scorer"},
    ],
    "schedulingProfiles": [
        {
            "name": DEFAULT_PROFILE_NAME,
            "plugins": [
                {"pluginRef": "loose-affinity-filter"},
                {"pluginRef": "token-load-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        },
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
