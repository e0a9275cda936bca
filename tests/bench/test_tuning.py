"""The tuner: its twin's fit, its decision rule, and rounds in the discrete-event cluster."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES, resolve_policy
from slorouter.bench.records import RunRecords
from slorouter.bench.results import post_switch_worst_ratio
from slorouter.bench.tuning.figures import Figures
from slorouter.bench.tuning.replay import Traffic
from slorouter.bench.tuning.tuner import Tuner, TuningSettings, pinned, settled
from slorouter.bench.tuning.twin import PodTwin, PoolTwin, batch_caps, fit_to_placements
from slorouter.bench.workloads import generate
from slorouter.scheduling.pipelines import SELF_TUNING_SCHEDULER_CONFIG
from slorouter.serving.traffic_window import TrafficWindow, WindowEntry


def served_window(profiles, config, *, qps, duration_s, seed=0):
    """The window of a run of ``sharegpt`` on ``profiles`` routed by ``config``, and the simulator's pods."""
    requests = generate(
        "sharegpt", qps=qps, duration_s=duration_s, seed=seed, params={}, max_model_len=32_768
    )
    with ClusterSimulator(profiles, config, use_predictor=False, seed=seed) as sim:
        window = TrafficWindow(span_s=10_000)
        sim.pickers[0].front.window = window
        sim.run(requests)
        return window.entries(), sim.addresses


def entry(arrival, *, ttft_ms=50.0, tpot_ms=10.0, output=10, endpoint="a", waiting=0.0, running=1.0):
    return WindowEntry(
        arrival,
        100,
        output,
        output,
        (),
        True,
        None,
        None,
        0,
        200,
        endpoint,
        "p",
        ttft_ms,
        tpot_ms,
        waiting,
        running,
    )


def test_a_twin_fitted_to_placements_finds_each_pods_speed():
    slow = PodTwin(prefill_scale=2.5, decode_scale=1.6)
    profiles = [slow.profile("slow", 32_768), PodTwin().profile("base", 32_768)]
    entries, addresses = served_window(profiles, BUILTIN_POLICIES["least-request"], qps=6, duration_s=40)
    traffic = Traffic.of(entries)
    start = PoolTwin(tuple(addresses), (PodTwin(), PodTwin()))
    fitted = fit_to_placements(start, traffic, iterations=4)
    pod_slow, pod_base = fitted.pods
    assert pod_slow.prefill_scale == pytest.approx(2.5, rel=0.2)
    assert pod_slow.decode_scale == pytest.approx(1.6, rel=0.1)
    assert pod_base.prefill_scale == pytest.approx(1.0, rel=0.2)
    assert pod_base.decode_scale == pytest.approx(1.0, rel=0.1)


def test_batch_caps_are_learned_only_from_pods_seen_waiting():
    entries = [
        entry(0.0, endpoint="a", waiting=0.0, running=30.0),
        entry(1.0, endpoint="a", waiting=3.0, running=4.0),
        entry(2.0, endpoint="a", waiting=1.0, running=3.0),
        entry(3.0, endpoint="b", waiting=0.0, running=12.0),
    ]
    assert batch_caps(entries) == {"a": 4}


def test_the_window_is_cut_where_answers_have_settled():
    entries = [entry(float(t), ttft_ms=100.0, tpot_ms=10.0, output=301) for t in range(100)]  # 3.1 s each
    kept = settled(entries, now=100.0, window_s=90.0)
    assert max(e.arrival for e in kept) == 96.0
    assert settled([], now=1.0, window_s=1.0) == []


def figures(p90, *, p99=None, tpot=10.0, slo=None):
    return Figures(100, p90 / 2, p90, p99 or p90 * 1.5, tpot, tpot * 1.5, p90 * 3, slo, {})


def test_the_best_eligible_candidate_wins_by_ttft_p90():
    tuner = Tuner(SELF_TUNING_SCHEDULER_CONFIG, TuningSettings(tolerance=0.02))
    replayed = {
        "predicted-latency": figures(100.0),
        "token-aware": figures(80.0, tpot=14.0),  # better p90, worse TPOT: not eligible
        "least-request": figures(85.0, p99=400.0),  # worse p99: not eligible
        "round-robin": figures(90.0, tpot=10.1),
        "heuristic": figures(95.0),
    }
    assert tuner._best("predicted-latency", replayed) == ("round-robin", pytest.approx(0.10))
    with_slo = {"predicted-latency": figures(100.0, slo=0.95), "round-robin": figures(90.0, slo=0.90)}
    assert tuner._best("predicted-latency", with_slo) == ("predicted-latency", 0.0)


def test_pinned_fixes_the_active_candidate_and_refuses_a_pipeline_without_a_switch():
    config = pinned(SELF_TUNING_SCHEDULER_CONFIG, "token-aware")
    handler = next(p for p in config["plugins"] if p["type"] == "candidate-profile-handler")
    assert handler["parameters"]["active"] == "token-aware"
    assert "active" not in SELF_TUNING_SCHEDULER_CONFIG["plugins"][0]["parameters"]
    with pytest.raises(ValueError, match="candidate-profile-handler"):
        pinned(BUILTIN_POLICIES["least-request"], "x")


def test_unknown_candidates_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown candidates nope"):
        Tuner(SELF_TUNING_SCHEDULER_CONFIG, TuningSettings(candidates=("nope",)))
    with pytest.raises(ValueError, match="warmup_share"):
        TuningSettings(warmup_share=1.0)


def test_a_round_with_too_few_requests_changes_nothing():
    tuner = Tuner(SELF_TUNING_SCHEDULER_CONFIG)
    result = tuner.tune([entry(1.0)], now=2.0, active="predicted-latency", addresses=["a"])
    assert result.switch_to is None and result.reason == "1 requests in the window"


def mixed_pool():
    return [PodTwin().profile("fast", 32_768), PodTwin(3.0, 3.0).profile("slow", 32_768)] * 2


def test_the_tuner_leaves_a_candidate_its_twin_shows_worse_on_a_mixed_pool():
    config = pinned(SELF_TUNING_SCHEDULER_CONFIG, "round-robin")
    entries, addresses = served_window(mixed_pool(), config, qps=14, duration_s=60)
    settings = TuningSettings(
        window_s=60.0, min_span_s=0.0, candidates=("round-robin", "least-request", "token-aware")
    )
    result = Tuner(config, settings).tune(entries, now=60.0, active="round-robin", addresses=addresses)
    assert result.twin_error <= settings.max_twin_error, result.errors
    assert result.switch_to in ("least-request", "token-aware")
    assert result.predicted_gain > 0.1
    assert result.replayed["round-robin"].ttft_p90_ms > result.replayed[result.switch_to].ttft_p90_ms


def test_an_untrusted_twin_switches_nothing():
    config = pinned(SELF_TUNING_SCHEDULER_CONFIG, "round-robin")
    entries, addresses = served_window(mixed_pool(), config, qps=14, duration_s=40)
    settings = TuningSettings(
        window_s=40.0, min_span_s=0.0, max_twin_error=0.0, candidates=("round-robin", "least-request")
    )
    result = Tuner(config, settings).tune(entries, now=40.0, active="round-robin", addresses=addresses)
    assert result.switch_to is None and result.reason.startswith("twin error")
    assert result.replayed == {} and math.isfinite(result.twin_error)


def test_the_self_tuning_bench_policy_tunes_in_virtual_time_and_switches_every_picker():
    policy = resolve_policy("self-tuning")
    assert policy.tuning is not None and policy.uses_predictor
    config = pinned(policy.config, "round-robin")
    # tolerance 1: by TTFT p90 alone (this test is about the switch, not the rule)
    settings = TuningSettings(
        interval_s=30.0,
        window_s=30.0,
        min_span_s=0.0,
        tolerance=1.0,
        candidates=("round-robin", "least-request"),
    )
    requests = generate("sharegpt", qps=14, duration_s=65, seed=0, params={}, max_model_len=32_768)
    cluster = ClusterSettings(pickers=2)
    with ClusterSimulator(
        mixed_pool(), copy.deepcopy(config), use_predictor=False, tuning=settings, settings=cluster
    ) as sim:
        rec = sim.run(requests)
        actives = {stack.director.setup.candidate_switch.active for stack in sim.pickers}
    rounds = rec.facts["tuning"]
    assert [r["at"] for r in rounds if "reverted_from_switch_at" not in r] == [30.0, 60.0], rounds
    assert "least-request" in [r["switch_to"] for r in rounds], rounds
    assert actives == {"least-request"}


def test_a_window_stands_for_several_pickers_by_copies():
    entries = [entry(1.0, endpoint="a"), entry(2.0, endpoint="b")]
    traffic = Traffic.of(entries, copies=3)
    assert [e.arrival for e in traffic.entries] == [1.0, 1.001, 1.002, 2.0, 2.001, 2.002]
    assert [e.endpoint for e in traffic.entries] == ["a"] * 3 + ["b"] * 3
    assert len(traffic.requests) == 6 and traffic.requests[0].arrival == 0.0
    with pytest.raises(ValueError, match="copies"):
        Traffic.of(entries, copies=0)


def records(arrival, ttft_s):
    n = len(arrival)
    column = np.full(n, np.nan)
    return RunRecords(
        np.array(arrival, dtype=float), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32),
        np.array(ttft_s, dtype=float), column, np.zeros(n), np.zeros(n), np.zeros(n), column, column,
        np.zeros(n, dtype=bool), column, column, column, column, ["p"],
    )  # fmt: skip


def test_the_worst_post_switch_window_is_measured_against_the_ten_seconds_before():
    arrival = np.arange(0.0, 100.0, 0.5)
    ttft = np.where(arrival < 50, 0.1, np.where(arrival < 60, 0.3, 0.12))  # a bad first window after 50 s
    rec = records(arrival, ttft)
    assert post_switch_worst_ratio(rec, [50.0]) == pytest.approx(3.0)
    assert post_switch_worst_ratio(rec, []) is None
    assert post_switch_worst_ratio(rec, [500.0]) is None  # nothing around it


def test_a_rounds_outcome_says_how_it_ended():
    from slorouter.bench.tuning.tuner import Outcome, TuningRound

    skipped = TuningRound(1.0, "a", 3, reason="3 requests in the window")
    assert skipped.outcome is Outcome.SKIPPED
    observed = figures(100.0)
    assert TuningRound(1.0, "a", 300, observed).outcome is Outcome.UNTRUSTED
    assert TuningRound(1.0, "a", 300, observed, {"a": observed}).outcome is Outcome.KEPT
    assert TuningRound(1.0, "a", 300, observed, {"a": observed}, switch_to="b").outcome is Outcome.SWITCHED


def test_the_tuners_process_answers_bad_requests_with_errors_and_goes_on(tmp_path):
    import io
    import json as jsonlib

    from slorouter.bench.tuning.worker import serve
    from slorouter.serving.traffic_window import encode_entries

    window = tmp_path / "window.json"
    window.write_bytes(encode_entries([entry(1.0)]))
    setup = {"pipeline": SELF_TUNING_SCHEDULER_CONFIG, "settings": {"window_s": 60.0}, "cluster": {}}
    lines = [
        jsonlib.dumps(setup),
        "not json",
        jsonlib.dumps(
            {"round": 2, "now": 5.0, "active": "predicted-latency", "addresses": ["a"], "window": "/nope"}
        ),
        jsonlib.dumps(
            {"round": 3, "now": 5.0, "active": "predicted-latency", "addresses": ["a"], "window": str(window)}
        ),
    ]
    out = io.StringIO()
    assert serve(io.StringIO("\n".join(lines) + "\n"), out) == 0
    ready, bad, missing, answered = (jsonlib.loads(line) for line in out.getvalue().splitlines())
    assert ready == {"ready": True}
    assert bad["round"] is None and bad["error"].startswith("JSONDecodeError")
    assert missing["round"] == 2 and "FileNotFoundError" in missing["error"]
    assert answered["round"] == 3 and answered["result"]["outcome"] == "skipped"


def test_a_bad_setup_ends_the_tuners_process_saying_why():
    import io
    import json as jsonlib

    from slorouter.bench.tuning.worker import serve

    out = io.StringIO()
    setup = {"pipeline": SELF_TUNING_SCHEDULER_CONFIG, "settings": {"candidates": ["nope"]}}
    assert serve(io.StringIO(jsonlib.dumps(setup) + "\n"), out) == 2
    assert "unknown candidates nope" in jsonlib.loads(out.getvalue())["error"]


def test_the_requests_running_when_the_window_starts_are_carried_into_the_replay():
    from slorouter.bench.tuning.tuner import running_at

    long = entry(5.0, ttft_ms=100.0, tpot_ms=50.0, output=101)  # ends at 10.1 s
    short = entry(5.0, ttft_ms=100.0, tpot_ms=10.0, output=11)  # ends at 5.2 s
    failed = entry(9.0, ttft_ms=None, tpot_ms=None)
    later = entry(12.0)
    assert running_at([long, short, failed, later], 10.0) == [long]


def test_an_untrusted_twin_sends_the_router_back_to_the_configured_candidate():
    config = pinned(SELF_TUNING_SCHEDULER_CONFIG, "round-robin")
    entries, addresses = served_window(mixed_pool(), config, qps=14, duration_s=40)
    settings = TuningSettings(
        window_s=40.0, min_span_s=0.0, max_twin_error=0.0, candidates=("round-robin", "least-request")
    )
    tuner = Tuner(SELF_TUNING_SCHEDULER_CONFIG, settings)  # configured on predicted-latency
    first = tuner.tune(entries, now=40.0, active="round-robin", addresses=addresses)
    assert first.switch_to is None and first.reason.startswith("twin error")
    second = tuner.tune(entries, now=40.0, active="round-robin", addresses=addresses)
    assert second.switch_to == "predicted-latency" and second.reason.endswith(
        "for 2 rounds: back to predicted-latency"
    )
    assert tuner.tune(entries, now=40.0, active="predicted-latency", addresses=addresses).switch_to is None


def test_a_candidate_replayed_alone_keeps_what_it_reads():
    from slorouter.bench.tuning.tuner import pruned

    def names(config):
        return {p.get("name") or p["type"] for p in config["plugins"]}

    token_aware = names(pruned(SELF_TUNING_SCHEDULER_CONFIG, "token-aware"))
    assert "approx-prefix-cache-producer" in token_aware and "predicted-latency-producer" not in token_aware
    assert "load-latency-producer" not in token_aware and "expected-latency-scorer" not in token_aware
    predicted = names(pruned(SELF_TUNING_SCHEDULER_CONFIG, "predicted-latency"))
    assert {"predicted-latency-producer", "load-latency-producer", "latency-slo-admitter"} <= predicted
    assert names(pruned(SELF_TUNING_SCHEDULER_CONFIG, "round-robin")) == {
        "candidate-profile-handler",
        "round-robin-picker",
    }
    assert "predicted-latency-producer" in names(
        pruned(SELF_TUNING_SCHEDULER_CONFIG, "round-robin", admission=True)
    )


def test_the_routers_tuning_section_reaches_the_tuner_whole():
    import dataclasses

    from slorouter.config import TuningConfig
    from slorouter.serving.self_tuning import ROUTER_ONLY_SETTINGS

    sent = TuningConfig(candidates=["token-aware"], min_gain=0.07).model_dump(exclude=ROUTER_ONLY_SETTINGS)
    assert set(sent) <= {f.name for f in dataclasses.fields(TuningSettings)}
    settings = TuningSettings(**{**sent, "candidates": tuple(sent["candidates"])})
    assert settings.candidates == ("token-aware",) and settings.min_gain == 0.07
