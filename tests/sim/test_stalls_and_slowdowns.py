"""Stalls and slow periods (engine variants stall-every-s/stall-ms and slow-factor/slow-for-s/slow-every-s;
slorouter.sim.disruptions): their schedule, and what they do to the engine's steps."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field, replace

import pytest

from slorouter.sim.disruptions import Disruptions
from slorouter.sim.engine import Engine, Step
from slorouter.sim.profiles import LLAMA3_8B_H100, Profile
from slorouter.sim.variants import parse_variant
from tests.sim.conftest import distinct_prompt, drive

# Every step's time is exactly profile.step_ms of its batch: no jitter, no attention or KV-read terms, no API
# overheads.
FLAT = replace(
    LLAMA3_8B_H100,
    api_pre_ms=0.0,
    api_post_ms=0.0,
    api_per_token_ms=0.0,
    jitter_sigma=0.0,
    c_attn_ms=0.0,
    c_kv_ms=0.0,
)
STALLS = parse_variant("stall-every-s=0.05,stall-ms=20:40").apply(FLAT)
SLOW = parse_variant("slow-factor=3,slow-for-s=0.2,slow-every-s=0.3").apply(FLAT)


def normal_duration(profile: Profile, step: Step) -> float:
    tokens = step.num_decodes + step.num_prefill_tokens
    return profile.step_ms(tokens, 0.0, 0, step.num_decodes) / 1000.0


@dataclass
class Steps:
    steps: list[Step] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)


def run_one(engine: Engine, max_tokens: int = 200, at: float = 0.0) -> Steps:
    """One request from ``at`` to its end, every step kept."""
    engine.add_request("r", distinct_prompt(1, 64), max_tokens, at)
    out = Steps()
    now = at
    while engine.has_work():
        step = engine.plan_step(now)
        if step is None:
            ready = engine.next_ready_time()
            assert ready is not None and ready > now
            now = ready
            continue
        out.steps.append(step)
        out.token_times.append(engine.commit_step(step).time)
        now = step.end
    return out


def fresh_schedule(profile: Profile, seed: int = 0, until: float = 60.0):
    return Disruptions(profile, seed).schedule(until)


# ------------------------------------------------------------------------------------------------ stalls


def test_no_step_starts_in_a_pause_and_a_step_is_delayed_by_the_pauses_it_meets():
    pauses, _ = fresh_schedule(STALLS)
    run = run_one(Engine(STALLS))
    assert len(run.steps) == 200
    stretched = 0
    for step in run.steps:
        assert not any(start <= step.start < end for start, end in pauses), step
        met = sum(end - start for start, end in pauses if step.start <= start < step.end)
        assert step.duration == pytest.approx(normal_duration(STALLS, step) + met, abs=1e-12)
        stretched += met > 0
    assert stretched >= 5
    # Nothing comes out during a pause, and the run took its steps plus every pause it met.
    for t in run.token_times:
        assert not any(start < t < end for start, end in pauses)
    end = run.steps[-1].end
    met_all = sum(end_ - start for start, end_ in pauses if start < end)
    assert end == pytest.approx(sum(normal_duration(STALLS, s) for s in run.steps) + met_all, abs=1e-9)


def test_a_request_arriving_during_a_pause_waits_for_its_end():
    pauses, _ = fresh_schedule(STALLS)
    start, end = pauses[0]
    engine = Engine(STALLS)
    engine.add_request("r", distinct_prompt(1, 64), 4, (start + end) / 2)
    assert engine.plan_step((start + end) / 2) is None
    assert engine.next_ready_time() == end and engine.has_work()
    step = engine.plan_step(end)
    assert step is not None and step.start == end


def test_the_stall_schedule_follows_its_parameters():
    profile = parse_variant("stalls").apply(FLAT)  # every 15 s, 300..3000 ms
    pauses, slow = fresh_schedule(profile, until=15 * 4000)
    assert not slow
    lengths = [end - start for start, end in pauses]
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(pauses)]
    assert all(0.3 <= length <= 3.0 for length in lengths)
    assert statistics.mean(gaps) == pytest.approx(15, rel=0.1)
    assert statistics.mean(lengths) == pytest.approx(1.65, rel=0.1)


# ---------------------------------------------------------------------------------------------- slowdowns


def test_a_slow_period_multiplies_step_time_only_within_it():
    _, periods = fresh_schedule(SLOW)
    run = run_one(Engine(SLOW), max_tokens=300)
    kinds = set()
    for step in run.steps:
        slow = any(start <= step.start < end for start, end in periods)
        factor = 3.0 if slow else 1.0
        assert step.duration == pytest.approx(normal_duration(SLOW, step) * factor, rel=1e-12)
        kinds.add(slow)
    assert kinds == {True, False}


def test_the_slowdowns_variant():
    profile = parse_variant("slowdowns").apply(FLAT)
    assert (profile.slow_factor, profile.slow_for_s, profile.slow_every_s) == (3.0, 60.0, 90.0)
    _, periods = fresh_schedule(profile, until=90 * 2000)
    assert all(end - start == pytest.approx(60.0) for start, end in periods)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(periods)]
    assert statistics.mean(gaps) == pytest.approx(90, rel=0.1)


# ------------------------------------------------------------------------------------------- determinism


BOTH = parse_variant("stall-every-s=0.05,stall-ms=20:40,slow-factor=3,slow-for-s=0.2,slow-every-s=0.3")


def busy(seed: int) -> dict[object, tuple[float, float]]:
    engine = Engine(BOTH.apply(LLAMA3_8B_H100), seed=seed)
    arrivals = [(i, distinct_prompt(i, 200 + 30 * i), 50, 0.02 * i) for i in range(40)]
    run = drive(engine, arrivals)
    return {rid: (done.first_token_time, done.done_time) for rid, done in run.finished.items()}


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    assert busy(3) == busy(3)
    assert busy(3) != busy(4)


def test_the_schedule_depends_on_the_seed_and_start_only():
    both = BOTH.apply(FLAT)
    assert fresh_schedule(both, 1) == fresh_schedule(both, 1)
    assert fresh_schedule(both, 1)[0] != fresh_schedule(both, 2)[0]
    assert fresh_schedule(both, 1)[1] != fresh_schedule(both, 2)[1]
    # Each process has its own generator: adding slow periods leaves the stalls where they were.
    assert fresh_schedule(STALLS, 1)[0] == fresh_schedule(both, 1)[0]
    assert fresh_schedule(SLOW, 1)[1] == fresh_schedule(both, 1)[1]
    # A later start shifts the schedule.
    shifted = [t + 100 for pause in fresh_schedule(both, 1)[0] for t in pause]
    assert [t for pause in Disruptions(both, 1, 100.0).schedule(160.0)[0] for t in pause] == pytest.approx(
        shifted
    )


def test_without_stalls_or_slowdowns_the_engine_is_unchanged():
    arrivals = [(i, distinct_prompt(i, 300), 40, 0.01 * i) for i in range(30)]
    default = drive(Engine(LLAMA3_8B_H100, seed=7), arrivals)
    spelled = drive(Engine(parse_variant("queue=fcfs").apply(LLAMA3_8B_H100), seed=7), arrivals)
    assert default.durations == spelled.durations
    assert default.finished == spelled.finished
