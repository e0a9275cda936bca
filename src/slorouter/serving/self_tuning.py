"""A router that tunes its own pipeline: the window of recent traffic, the tuner's process, and the switch.

Every ``interval_s`` (longer when the last round used more CPU than ``cpu_budget`` allows) the router writes
its window to a private file and asks the tuner's process (``slorouter tune-worker``, at low priority; the
router never imports the simulator) for a round: the process fits the twin, validates it, replays every
candidate and answers with its decision (``slorouter.bench.tuning.tuner``). A switch takes effect at once on
the scheduler's ``candidate-profile-handler``, with one log line, and the switch guard watches it: when TTFT
p90 collapses after it, the router goes back at once. A tuner process that dies or does not answer degrades
nothing but the tuning: the active candidate keeps routing, the round counts as failed, and the next round
starts a new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slorouter.children import stop_with_parent
from slorouter.clock import Clock
from slorouter.config import TuningConfig
from slorouter.pool.inflight_sharing import InFlightSharing
from slorouter.pool.state import PoolState
from slorouter.scheduling.plugin import CandidateSwitch
from slorouter.serving.status import TuningStatus
from slorouter.serving.switch_guard import SwitchGuard
from slorouter.serving.traffic_window import TrafficWindow, WindowEntry, encode_entries

log = logging.getLogger("slorouter.tuning")

WORKER_COMMAND = (sys.executable, "-m", "slorouter.cli", "tune-worker")
WORKER_START_TIMEOUT_S = 60.0
OUTCOMES = ("switched", "kept", "untrusted", "skipped", "failed", "following")
FOLLOW_INTERVAL_S = 1.0
# The tuning section's settings that the router applies itself (the others go to the tuner's process).
ROUTER_ONLY_SETTINGS = {"enabled", "cpu_budget", "round_timeout_s", "guard"}


class _ActiveCandidate(Collector):
    """``slorouter_tuning_active_candidate``, read from the switch at each scrape."""

    def __init__(self, switch: CandidateSwitch) -> None:
        self._switch = switch

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "slorouter_tuning_active_candidate",
            "1 for the candidate pipeline that routes now, 0 for the others",
            labels=["candidate"],
        )
        active = self._switch.active
        for candidate in self._switch.candidates:
            family.add_metric([candidate], 1.0 if candidate == active else 0.0)
        yield family


class TuningMetrics:
    def __init__(self, registry: CollectorRegistry, switch: CandidateSwitch) -> None:
        registry.register(_ActiveCandidate(switch))
        self.predicted_gain = Gauge(
            "slorouter_tuning_predicted_gain",
            "the last round's best candidate's TTFT p90 gain over the active one, in the twin (a share)",
            registry=registry,
        )
        self.twin_error = Gauge(
            "slorouter_tuning_twin_error",
            "the twin's relative error replaying the window under what routed it, by figure",
            ["figure"],
            registry=registry,
        )
        self.rounds = Counter(
            "slorouter_tuning_rounds", "tuning rounds by outcome", ["outcome"], registry=registry
        )
        self.switches = Counter(
            "slorouter_tuning_switches",
            "switches of the active candidate, by candidate and by whom (tuner, guard, leader)",
            ["candidate", "by"],
            registry=registry,
        )
        self.cpu = Counter(
            "slorouter_tuning_cpu_seconds", "CPU time the tuner's rounds used", registry=registry
        )
        self.worker_up = Gauge(
            "slorouter_tuning_worker_up", "1 while the tuner's process runs", registry=registry
        )
        for outcome in OUTCOMES:
            self.rounds.labels(outcome)


class SelfTuning:
    """The router's side of self-tuning (see the module docstring)."""

    def __init__(
        self,
        config: TuningConfig,
        switch: CandidateSwitch,
        pool: PoolState,
        clock: Clock,
        registry: CollectorRegistry,
        *,
        pipeline: dict[str, Any],
        models_dir: Path | None = None,
        cluster: dict[str, float] | None = None,
        worker_command: tuple[str, ...] = WORKER_COMMAND,
    ) -> None:
        unknown = [c for c in config.candidates if c not in switch.candidates]
        if unknown:
            raise ValueError(
                f"tuning.candidates: {', '.join(unknown)} not among the pipeline's candidates "
                f"({', '.join(switch.candidates)})"
            )
        self.config = config
        self.switch = switch
        self.pool = pool
        self.clock = clock
        self.window = TrafficWindow(span_s=config.window_s * 1.5)
        self.guard = SwitchGuard(
            period_s=config.guard.period_s, watch_s=config.guard.watch_s, ratio=config.guard.ratio
        )
        self.metrics = TuningMetrics(registry, switch)
        self._configured = switch.active  # the pipeline's configured candidate
        self._setup = {
            "pipeline": pipeline,
            # The tuner's settings are the section's, but for what only the router uses.
            "settings": config.model_dump(exclude=ROUTER_ONLY_SETTINGS),
            "cluster": cluster or {},
        }
        self._models_dir = models_dir
        self._command = worker_command
        self._process: asyncio.subprocess.Process | None = None
        self._worker_state = "not started"
        self._task: asyncio.Task[None] | None = None
        self._guard_task: asyncio.Task[None] | None = None
        self._dir: Path | None = None
        self._rounds = 0
        self._switches = 0
        self._reverted: list[tuple[float, str]] = []  # guard's switches back, told to the tuner next round
        self._last: dict[str, Any] | None = None
        self._last_at: float | None = None
        self._sharing: InFlightSharing | None = None
        self._follow_task: asyncio.Task[None] | None = None

    # --- agreement between pickers ---------------------------------------------------------------------
    def agree(self, sharing: InFlightSharing) -> None:
        """Agree on one candidate with the pickers this one shares in-flight load with (the workers of its
        pod, picker replicas): each publishes its active candidate with its counts; the picker with the
        smallest id among those that tune leads (it runs the rounds, on its window copied once per tuning
        picker), and the others follow its candidate within ``FOLLOW_INTERVAL_S`` and never start a tuner
        process. When the leader goes, its slot expires and the next one leads from its next round."""
        sharing.view.candidate_of = lambda: self.switch.active
        self._sharing = sharing

    def leader(self) -> tuple[bool, str | None, int]:
        """Whether this picker leads, the leader's candidate (None when this one leads), and how many
        pickers tune."""
        sharing = self._sharing
        if sharing is None:
            return True, None, 1
        sharing.board.expire()
        others = sharing.board.candidates()
        me = sharing.view.picker
        others.pop(me, None)
        if not others or me < min(others):
            return True, None, len(others) + 1
        return False, others[min(others)], len(others) + 1

    def _follow(self) -> bool:
        """Take the leader's candidate; whether this picker follows one."""
        leads, candidate, _ = self.leader()
        if leads or candidate is None:
            return False
        if candidate != self.switch.active and candidate in self.switch.candidates:
            self.switch.activate(candidate)
            self._switched(candidate, "leader")
            log.info("tuning: following the leading picker to %s", candidate)
        return True

    async def _following(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            self._follow()

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="slorouter-tuning-"))
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="slorouter-tuning")
        if self._sharing is not None:
            self._follow_task = loop.create_task(self._following(), name="slorouter-tuning-follow")

    async def stop(self) -> None:
        for task in (self._task, self._guard_task, self._follow_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._guard_task = self._follow_task = None
        await self._stop_worker()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def status(self) -> TuningStatus:
        now = self.clock.now()
        return TuningStatus(
            active=self.switch.active,
            candidates=list(self.switch.candidates),
            rounds=self._rounds,
            switches=self._switches,
            worker=self._worker_state,
            last_round_age_s=None if self._last_at is None else round(now - self._last_at, 3),
            last_round=self._last,
        )

    # --- rounds ----------------------------------------------------------------------------------------
    async def _run(self) -> None:
        delay = self.config.interval_s
        while True:
            await asyncio.sleep(delay)
            started = time.monotonic()
            try:
                cpu_s = await self.round()
            except Exception:  # a bug must not end the tuning for good: logged, counted, next round
                log.exception("tuning round failed")
                self.metrics.rounds.labels("failed").inc()
                cpu_s = 0.0
            # The CPU budget: a round that used c seconds of CPU is followed by c / budget seconds of rest.
            delay = max(self.config.interval_s, cpu_s / self.config.cpu_budget - (time.monotonic() - started))

    async def round(self) -> float:
        """One round now; the CPU time it used (0 when none ran)."""
        now = self.clock.now()
        entries = self.window.entries(since=now - self.config.window_s)
        self._rounds += 1
        if self._follow():
            self.metrics.rounds.labels("following").inc()
            self._last, self._last_at = {"reason": "following the leading picker"}, now
            await self._stop_worker()
            self._worker_state = "not started: following the leading picker"
            return 0.0
        if len(entries) < self.config.min_requests:
            self.metrics.rounds.labels("skipped").inc()
            self._last, self._last_at = {"reason": f"{len(entries)} requests in the window"}, now
            return 0.0
        try:
            answer = await asyncio.wait_for(self._ask(now, entries), self.config.round_timeout_s)
        except (OSError, ValueError, EOFError, TimeoutError) as exc:
            self.metrics.rounds.labels("failed").inc()
            self._worker_state = f"down: {type(exc).__name__}: {exc}"
            log.warning("tuning round failed, the pipeline stays on %s: %s", self.switch.active, exc)
            await self._stop_worker()
            return 0.0
        cpu_s = float(answer.get("cpu_s") or 0.0)
        self.metrics.cpu.inc(cpu_s)
        if "error" in answer:
            self.metrics.rounds.labels("failed").inc()
            log.warning(
                "tuning round failed, the pipeline stays on %s: %s", self.switch.active, answer["error"]
            )
            return cpu_s
        self._apply(answer["result"], now)
        return cpu_s

    def _apply(self, result: dict[str, Any], now: float) -> None:
        self._last, self._last_at = result, now
        for figure, error in (result.get("errors") or {}).items():
            self.metrics.twin_error.labels(figure).set(math.inf if error is None else error)
        self.metrics.predicted_gain.set(float(result.get("predicted_gain") or 0.0))
        target = result.get("switch_to")
        outcome = result.get("outcome")
        if outcome not in OUTCOMES or (outcome == "switched") != (target is not None):
            self.metrics.rounds.labels("failed").inc()
            log.error("tuning: the tuner's process answered a round it did not finish: %.200s", result)
            return
        if target is None:
            self.metrics.rounds.labels(outcome).inc()
            return
        previous = self.switch.active
        try:
            self.switch.activate(target)
        except ValueError as exc:  # the tuner named a candidate this pipeline does not have: a bug, logged
            self.metrics.rounds.labels("failed").inc()
            log.error("tuning: %s", exc)
            return
        self.metrics.rounds.labels("switched").inc()
        self._switched(target, "tuner")
        log.info(
            "tuning: switched from %s to %s: %s (twin error %s)",
            previous,
            target,
            result.get("reason"),
            result.get("twin_error"),
        )
        if target == self._configured:  # going back to the configured candidate is not watched
            self.guard.watch = None
        else:
            self.guard.switched(at=now, previous=previous)
        if self.guard.watch is not None and (self._guard_task is None or self._guard_task.done()):
            self._guard_task = asyncio.get_running_loop().create_task(
                self._watch(), name="slorouter-tuning-guard"
            )

    def _switched(self, target: str, by: str) -> None:
        self._switches += 1
        self.metrics.switches.labels(target, by).inc()

    async def _watch(self) -> None:
        while self.guard.watch is not None:
            await asyncio.sleep(self.guard.period_s)
            watch = self.guard.watch
            now = self.clock.now()
            back = self.guard.check(self.window, now)
            if back is not None and watch is not None:
                left = self.switch.active
                self.switch.activate(back)
                self._switched(back, "guard")
                self._reverted.append((now, back))
                log.warning(
                    "tuning: back from %s to %s: TTFT p90 above %gx the %g s before the switch",
                    left,
                    back,
                    self.guard.ratio,
                    self.guard.period_s,
                )

    # --- the tuner's process ---------------------------------------------------------------------------
    async def _ask(self, now: float, entries: list[WindowEntry]) -> dict[str, Any]:
        process = await self._worker()
        assert process.stdin is not None and process.stdout is not None and self._dir is not None
        path = self._dir / "window.json"
        await asyncio.to_thread(path.write_bytes, encode_entries(entries))
        capacity = {
            e.address: [
                int(self.pool.value(e.address, "num_gpu_blocks")),
                int(self.pool.value(e.address, "block_size")),
            ]
            for e in self.pool.endpoints
        }
        request = {
            "round": self._rounds,
            "now": now,
            "active": self.switch.active,
            "addresses": [e.address for e in self.pool.endpoints],
            "capacity": capacity,
            "window": str(path),
            "models": None if self._models_dir is None else str(self._models_dir),
            "reverted": self._reverted,
            "copies": self.leader()[2],
        }
        self._reverted = []
        process.stdin.write(json.dumps(request).encode() + b"\n")
        await process.stdin.drain()
        return await self._read(process)

    async def _worker(self) -> asyncio.subprocess.Process:
        process = self._process
        if process is not None and process.returncode is None:
            return process
        self._worker_state = "starting"
        process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=stop_with_parent,
        )
        self._process = process
        assert process.stdin is not None
        process.stdin.write(json.dumps(self._setup).encode() + b"\n")
        await process.stdin.drain()
        ready = await asyncio.wait_for(self._read(process), WORKER_START_TIMEOUT_S)
        if not ready.get("ready"):
            raise ValueError(f"the tuner's process refused its setup: {ready.get('error')}")
        self._worker_state = "running"
        self.metrics.worker_up.set(1)
        return process

    @staticmethod
    async def _read(process: asyncio.subprocess.Process) -> dict[str, Any]:
        assert process.stdout is not None
        line = await process.stdout.readline()
        if not line:
            raise EOFError(f"the tuner's process ended (exit status {await process.wait()})")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError(f"the tuner's process answered {line[:200]!r}")
        return answer

    async def _stop_worker(self) -> None:
        process, self._process = self._process, None
        self.metrics.worker_up.set(0)
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            process.kill()
            await process.wait()
