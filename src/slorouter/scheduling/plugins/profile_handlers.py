"""Profile handlers: which profiles run, and which result is primary."""

from __future__ import annotations

from slorouter.scheduling.plugin import Plugin, ProfileHandler
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import (
    CycleState,
    InferenceRequest,
    NoEndpointPickedError,
    ProfileRunResult,
    SchedulingResult,
)


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
        if len(results) != 1:
            raise ValueError(f"{self.type_name} expects one profile result, got {len(results)}")
        (name, result), *_ = results.items()
        if result is None:
            raise NoEndpointPickedError(f"profile {name!r} found no target endpoint")
        return SchedulingResult(profile_results={name: result}, primary_profile=name)
