"""Profile handlers: which profiles run, and which result is primary."""

from __future__ import annotations

from pydantic import Field

from slorouter.scheduling.plugin import Plugin, PluginParams, ProfileHandler
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import (
    CycleState,
    InferenceRequest,
    NoEndpointPickedError,
    ProfileRunResult,
    Route,
    SchedulingResult,
)


def only_result(handler: str, results: dict[str, ProfileRunResult | None]) -> SchedulingResult:
    """The one profile result as the primary result; a profile that found no endpoint is a 429."""
    if len(results) != 1:
        raise ValueError(f"{handler} expects one profile result, got {len(results)}")
    (name, result), *_ = results.items()
    if result is None:
        raise NoEndpointPickedError(f"profile {name!r} found no target endpoint")
    return SchedulingResult(profile_results={name: result}, primary_profile=name)


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
        predicted = request.use_prediction and request.prediction_unavailable is None
        return [p.prediction_profile if predicted else p.heuristic_profile]

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        result = only_result(self.type_name, results)
        if request.use_prediction and request.prediction_unavailable is not None:
            result.primary.route = Route.FALLBACK
        return result
