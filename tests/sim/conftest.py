from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

from slorouter.sim.engine import Engine, Finished, FirstToken


@dataclass
class Run:
    """What driving an engine to idle produced."""

    finished: dict[object, Finished] = field(default_factory=dict)
    first: dict[object, FirstToken] = field(default_factory=dict)
    token_times: dict[object, list[float]] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    max_waiting: int = 0
    max_running: int = 0
    end: float = 0.0


# (request id, prompt ids, max_tokens, arrival time[, priority])
Arrival = tuple[object, list[int] | bytes, int, float] | tuple[object, list[int] | bytes, int, float, int]


def drive(engine: Engine, arrivals: Iterable[Arrival], max_steps: int = 200_000) -> Run:
    """Run the engine in virtual time until every arrival has finished (like the discrete-event simulator)."""
    pending = sorted(arrivals, key=lambda arrival: arrival[3])
    run = Run()
    now = 0.0
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i][3] <= now:
            request_id, prompt, max_tokens, at, *priority = pending[i]
            engine.add_request(request_id, prompt, max_tokens, at, *priority)
            i += 1
        if i == len(pending) and not engine.has_work():
            run.end = now
            return run
        step = engine.plan_step(now)
        if step is None:
            wakeups = [
                t for t in (engine.next_ready_time(), pending[i][3] if i < len(pending) else None) if t
            ]
            now = min(wakeups)
            continue
        run.max_waiting = max(run.max_waiting, engine.num_waiting)
        run.max_running = max(run.max_running, engine.num_running)
        output = engine.commit_step(step)
        run.durations.append(step.duration)
        now = step.end
        for request_id in output.tokens:
            run.token_times.setdefault(request_id, []).append(output.time)
        for event in output.first_tokens:
            run.first[event.request_id] = event
        for event in output.finished:
            run.finished[event.request_id] = event
    raise AssertionError("the engine did not go idle")


@pytest.fixture
def drive_engine() -> Callable[..., Run]:
    return drive


def distinct_prompt(tag: int, length: int) -> list[int]:
    """A prompt sharing no block with another tag's."""
    return [tag * 1_000_003 + i for i in range(length)]


@pytest.fixture
def prompt() -> Callable[[int, int], list[int]]:
    return distinct_prompt
