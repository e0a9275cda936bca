"""Scheduling profiles and the scheduler that runs them (the original's ``scheduler.go`` and
``scheduler_profile.go``).

A profile filters the candidates, sums the weighted, clamped scores of its scorers and lets its picker choose.
The profile handler decides which profiles run and turns their results into the scheduling result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slorouter.scheduling.datakeys import PREDICTED_TTFT_MS
from slorouter.scheduling.pick_record import PickRecord, record_pick
from slorouter.scheduling.plugin import Filter, ListPicker, ListScorer, Picker, Plugin, ProfileHandler, Scorer
from slorouter.scheduling.types import (
    Candidates,
    CycleState,
    InferenceRequest,
    NoCandidatesError,
    NoEndpointPickedError,
    PickReason,
    ProfileRunResult,
    Route,
    SchedulingError,
    SchedulingResult,
)

# Up to this many candidates, a profile whose scorers and picker all have plain-Python twins (ListScorer,
# ListPicker) runs those: on a few candidates numpy's per-call overhead dominates. Both paths give identical
# results; beyond this size numpy is the faster one.
LIST_PATH_MAX_CANDIDATES = 16


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


def _label(plugin: object) -> str:
    if isinstance(plugin, Plugin):
        return plugin.name if plugin.name == plugin.type_name else repr(plugin)
    return type(plugin).__name__


def _predicted_ttft(candidates: Candidates, chosen: list[int]) -> list[float] | None:
    predicted = candidates.attrs.get(PREDICTED_TTFT_MS)
    return None if predicted is None else [float(predicted[i]) for i in chosen]


class SchedulerProfile:
    """Filters (in order), weighted scorers and one picker."""

    __slots__ = ("_list_picker", "_list_scorers", "filters", "name", "picker", "scorers")

    def __init__(
        self, name: str, filters: list[Filter], scorers: list[WeightedScorer], picker: Picker
    ) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.picker = picker
        # (list twin, weight) per scorer and the picker's twin when the small-set path can run; None when some
        # plugin has no twin.
        self._list_scorers: list[tuple[ListScorer, float]] | None = None
        self._list_picker: ListPicker | None = None
        list_scorers = [(w.scorer, w.weight) for w in scorers if isinstance(w.scorer, ListScorer)]
        if isinstance(picker, ListPicker) and len(list_scorers) == len(scorers):
            self._list_scorers = list_scorers
            self._list_picker = picker

    def __repr__(self) -> str:
        parts = [_label(f) for f in self.filters]
        parts += [f"{_label(s.scorer)}×{s.weight:g}" for s in self.scorers]
        parts.append(_label(self.picker))
        return f"SchedulerProfile({self.name}: {', '.join(parts)})"

    def run(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates
    ) -> ProfileRunResult | None:
        """The picked targets, or None when the filters removed every candidate."""
        outcome = self.run_or_explain(cycle, request, candidates)
        return outcome if isinstance(outcome, ProfileRunResult) else None

    def run_or_explain(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates
    ) -> ProfileRunResult | str:
        """The picked targets, or why there are none."""
        cycle.route = None
        cycle.reason = None
        given = candidates
        for filt in self.filters:
            candidates = filt.filter(cycle, request, candidates)
            if len(candidates) == 0:
                return f"filter {_label(filt)} removed every candidate"
        if self._list_picker is not None and len(candidates) <= LIST_PATH_MAX_CANDIDATES:
            return self._run_list(cycle, request, given, candidates, self._list_picker)
        total = self.total_scores(cycle, request, candidates)
        chosen = self.picker.pick(cycle, request, candidates, total)
        if len(chosen) == 0:
            return f"picker {_label(self.picker)} chose nothing"
        chosen_list = chosen.tolist()
        return ProfileRunResult(
            targets=[candidates.endpoint(i) for i in chosen_list],
            scores=total[chosen].tolist(),
            route=cycle.route or Route.HEURISTIC,
            predicted_ttft_ms=_predicted_ttft(candidates, chosen_list),
            record=self._record(cycle, request, given, candidates, total, chosen_list[0]),
        )

    def _run_list(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        given: Candidates,
        candidates: Candidates,
        picker: ListPicker,
    ) -> ProfileRunResult | str:
        """The small-set path of ``run_or_explain`` after the filters: the same result, in plain Python."""
        total = self.total_scores_list(cycle, request, candidates)
        chosen = picker.pick_list(cycle, request, candidates, total)
        if not chosen:
            return f"picker {_label(picker)} chose nothing"
        return ProfileRunResult(
            targets=[candidates.endpoint(i) for i in chosen],
            scores=[total[i] for i in chosen],
            route=cycle.route or Route.HEURISTIC,
            predicted_ttft_ms=_predicted_ttft(candidates, chosen),
            record=self._record(cycle, request, given, candidates, total, chosen[0]),
        )

    def _record(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        given: Candidates,
        scored: Candidates,
        total: np.ndarray | list[float],
        chosen: int,
    ) -> PickRecord | None:
        if not cycle.record:
            return None
        reason = PickReason.EXPLORATION if cycle.explored else cycle.reason
        return record_pick(self.name, request, given, scored, total, chosen, reason)

    def total_scores_list(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates
    ) -> list[float]:
        """``total_scores`` in plain Python, for profiles whose scorers are all ``ListScorer``s."""
        if self._list_scorers is None:
            raise TypeError(f"{self!r} has a scorer or picker without a list twin")
        n = len(candidates)
        total = [0.0] * n
        for scorer, weight in self._list_scorers:
            raw = scorer.score_list(cycle, request, candidates)
            if len(raw) != n:
                raise ValueError(f"scorer {_label(scorer)} returned {len(raw)} scores for {n} candidates")
            for i, value in enumerate(raw):
                # Exactly fmax(value, 0) then minimum(·, 1) as in total_scores: NaN and negatives count as 0.
                if value > 0.0:
                    total[i] += (value if value < 1.0 else 1.0) * weight
                else:
                    total[i] += 0.0 * weight
        return total

    def total_scores(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates
    ) -> np.ndarray:
        """Σ weight · clamp(score, 0, 1) per candidate; NaN scores count as 0. Not divided by Σ weight."""
        n = len(candidates)
        total = np.zeros(n)
        clamped = np.empty(n)
        for weighted in self.scorers:
            raw = weighted.scorer.score(cycle, request, candidates)
            if np.shape(raw) != (n,):
                raise ValueError(
                    f"scorer {_label(weighted.scorer)} returned {np.shape(raw)} scores for {n} candidates"
                )
            # fmax(NaN, 0) is 0, so this clamps and zeroes NaN in two cheap ufunc calls (np.clip and
            # np.nan_to_num cost several times more per call on arrays this small).
            np.fmax(raw, 0.0, out=clamped)
            np.minimum(clamped, 1.0, out=clamped)
            clamped *= weighted.weight
            total += clamped
        return total


class Scheduler:
    """Runs the profiles the profile handler asks for, in a deterministic order, until it asks for none."""

    __slots__ = ("profile_handler", "profile_names", "profiles")

    def __init__(self, profiles: list[SchedulerProfile], profile_handler: ProfileHandler) -> None:
        if not profiles:
            raise ValueError("a scheduler needs at least one profile")
        self.profiles: dict[str, SchedulerProfile] = {p.name: p for p in profiles}
        if len(self.profiles) != len(profiles):
            raise ValueError("profile names must be unique")
        self.profile_names = list(self.profiles)
        self.profile_handler = profile_handler

    def schedule(
        self, request: InferenceRequest, candidates: Candidates, cycle: CycleState | None = None
    ) -> SchedulingResult:
        """Pick the target endpoint(s) for one request.

        Raises ``NoCandidatesError`` (503) for an empty candidate set and ``NoEndpointPickedError`` (429)
        when no profile produced a result.
        """
        if len(candidates) == 0:
            raise NoCandidatesError("no candidate endpoints")
        cycle = CycleState() if cycle is None else cycle
        handler = self.profile_handler
        results: dict[str, ProfileRunResult | None] = {}
        failures: list[str] = []
        while True:
            to_run = handler.pick_profiles(cycle, request, self.profile_names, results)
            if not to_run:
                break
            for name in to_run:
                if name in results:
                    raise RuntimeError(f"profile handler {_label(handler)} asked to rerun profile {name!r}")
                profile = self.profiles.get(name)
                if profile is None:
                    raise RuntimeError(
                        f"profile handler {_label(handler)} asked for unknown profile {name!r}"
                    )
                try:
                    outcome = profile.run_or_explain(cycle, request, candidates)
                except SchedulingError as exc:
                    outcome = exc.message
                if isinstance(outcome, ProfileRunResult):
                    results[name] = outcome
                else:
                    results[name] = None
                    failures.append(f"{name}: {outcome}")
        if not any(result is not None for result in results.values()):
            reason = "; ".join(failures) if failures else "no profile ran"
            raise NoEndpointPickedError(f"failed to find a target endpoint ({reason})")
        result = handler.process_results(cycle, request, results)
        if result.route is Route.FALLBACK:
            result.fallback_reason = request.prediction_unavailable
        return result
