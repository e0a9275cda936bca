"""Profile handlers: which profiles run, and which result is primary.

``candidate-profile-handler`` routes by one of several candidate pipelines, switched at run time by the
router's tuner. Each candidate names the profile it runs and, for a candidate that routes by predictions,
the profile its requests run without one (warm-up, predictor down, opted out), marked ``route="fallback"``
as ``prediction-profile-handler`` marks them. The candidates share every data producer of the
configuration, so whichever is active, the prefix index, the in-flight load, the load core's fit and the
predictor's samples follow all the traffic, and a switch finds the next candidate warm.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from slorouter.scheduling.plugin import CandidateSwitch, Plugin, PluginContext, PluginParams, ProfileHandler
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import (
    CycleState,
    InferenceRequest,
    NoEndpointPickedError,
    ProfileRunResult,
    Route,
    SchedulingResult,
)
from slorouter.validation import StrictModel


def only_result(handler: str, results: dict[str, ProfileRunResult | None]) -> SchedulingResult:
    """The one profile result as the primary result; a profile that found no endpoint is a 429."""
    if len(results) != 1:
        raise ValueError(f"{handler} expects one profile result, got {len(results)}")
    (name, result), *_ = results.items()
    if result is None:
        raise NoEndpointPickedError(f"profile {name!r} found no target endpoint")
    return SchedulingResult(profile_results={name: result}, primary_profile=name)


def _went_without_prediction(request: InferenceRequest) -> bool:
    """The request wanted predictions and the predictor could not give them (its result is a fallback)."""
    return request.use_prediction and request.prediction_unavailable is not None


def _predicted(request: InferenceRequest) -> bool:
    """The request wanted predictions and got them."""
    return request.use_prediction and request.prediction_unavailable is None


@register_plugin
class SingleProfileHandler(Plugin, ProfileHandler):
    """Runs the one profile once; its result is primary."""

    type_name = "single-profile-handler"

    def validate_profiles(self, profile_names: list[str]) -> None:
        if len(profile_names) != 1:
            raise ValueError(
                f"{self.type_name} runs exactly one profile, but {len(profile_names)} are configured "
                f"({', '.join(profile_names)}); configure a profile handler for several profiles"
            )

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: list[str],
        results: dict[str, ProfileRunResult | None],
    ) -> list[str]:
        return [] if results else list(profiles)

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        return only_result(self.type_name, results)


class PredictionProfileParams(PluginParams):
    prediction_profile: str = Field("predicted-latency", alias="predictionProfile", min_length=1)
    heuristic_profile: str = Field("default", alias="heuristicProfile", min_length=1)


@register_plugin
class PredictionProfileHandler(Plugin, ProfileHandler):
    """Runs one of two profiles per request: the prediction profile for requests that use prediction
    (``x-prediction-based-scheduling: true``, or every request when prediction is the default) and got
    predictions, the heuristic profile for the others — including requests the predictor could not serve
    (warming up, unreachable, invalid output), whose result is marked ``route="fallback"``. The result of
    the profile that ran is primary."""

    type_name = "prediction-profile-handler"
    Params = PredictionProfileParams
    params: PredictionProfileParams

    def validate_profiles(self, profile_names: list[str]) -> None:
        wanted = {self.params.prediction_profile, self.params.heuristic_profile}
        missing = sorted(wanted - set(profile_names))
        if missing:
            raise ValueError(
                f"{self.type_name} needs the profiles {', '.join(sorted(wanted))}; "
                f"missing: {', '.join(missing)} (configured: {', '.join(profile_names)})"
            )

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: list[str],
        results: dict[str, ProfileRunResult | None],
    ) -> list[str]:
        if results:
            return []
        p = self.params
        return [p.prediction_profile if _predicted(request) else p.heuristic_profile]

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        result = only_result(self.type_name, results)
        if _went_without_prediction(request):
            result.primary.route = Route.FALLBACK
        return result


class Candidate(StrictModel):
    name: str = Field(min_length=1)
    profile: str = Field(min_length=1)
    # The profile of requests without predictions; None: the candidate does not route by predictions.
    fallback_profile: str | None = Field(None, alias="fallbackProfile", min_length=1)


class CandidateProfileParams(PluginParams):
    candidates: list[Candidate] = Field(min_length=1)
    active: str | None = None  # None: the first candidate

    @model_validator(mode="after")
    def _names(self) -> CandidateProfileParams:
        names = [c.name for c in self.candidates]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"candidate names must be unique; repeated: {', '.join(repeated)}")
        if self.active is not None and self.active not in names:
            raise ValueError(
                f"active candidate {self.active!r} is not one of the candidates ({', '.join(names)})"
            )
        return self


@register_plugin
class CandidateProfileHandler(Plugin, ProfileHandler, CandidateSwitch):
    """Runs the active candidate's profile (its fallback profile when the request has no predictions)."""

    type_name = "candidate-profile-handler"
    Params = CandidateProfileParams
    params: CandidateProfileParams

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self._by_name = {c.name: c for c in self.params.candidates}
        self._names = tuple(self._by_name)
        self._active = self._by_name[self.params.active or self._names[0]]

    @property
    def candidates(self) -> tuple[str, ...]:
        return self._names

    @property
    def active(self) -> str:
        return self._active.name

    def activate(self, name: str) -> None:
        candidate = self._by_name.get(name)
        if candidate is None:
            raise ValueError(f"unknown candidate {name!r} (candidates: {', '.join(self._names)})")
        self._active = candidate

    def validate_profiles(self, profile_names: list[str]) -> None:
        wanted = {c.profile for c in self.params.candidates} | {
            c.fallback_profile for c in self.params.candidates if c.fallback_profile is not None
        }
        missing = sorted(wanted - set(profile_names))
        if missing:
            raise ValueError(
                f"the candidates name profiles that are not configured: {', '.join(missing)} "
                f"(configured: {', '.join(profile_names)})"
            )

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: list[str],
        results: dict[str, ProfileRunResult | None],
    ) -> list[str]:
        if results:
            return []
        candidate = self._active
        if candidate.fallback_profile is None:
            return [candidate.profile]
        return [candidate.profile if _predicted(request) else candidate.fallback_profile]

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        result = only_result(self.type_name, results)
        # A candidate that routes by predictions ran its fallback profile (the active one does not change
        # within a cycle).
        if self._active.fallback_profile is not None and _went_without_prediction(request):
            result.primary.route = Route.FALLBACK
        return result
