"""Pool specifications for the benchmark: ``16``, ``8x llama3-8b-h100``, ``8x A + 8x B`` (profile names),
each term optionally with an engine variant: ``4x llama3-8b-h100 + 4x llama3-8b-h100@slow-gpu``."""

from __future__ import annotations

import re

from slorouter.sim.profiles import PROFILES, Profile
from slorouter.sim.variants import EngineVariant, VariantError, parse_variant

DEFAULT_PROFILE = "llama3-8b-h100"
_TERM = re.compile(r"^(\d+)\s*(?:[x×*]\s*([A-Za-z0-9._-]+))?\s*(?:@(.*))?$")


class PoolSpecError(ValueError):
    pass


def parse_pool(spec: str, variant: EngineVariant | None = None) -> list[Profile]:
    """One profile per pod, in order. A bare count means the default profile (llama3-8b-h100).

    ``variant`` applies to every pod, before the variant of the pod's own term (``@SPEC``).
    """
    profiles: list[Profile] = []
    for term in spec.split("+"):
        match = _TERM.match(term.strip())
        if match is None:
            raise PoolSpecError(
                f"pool spec {spec!r}: cannot read {term.strip()!r}; expected COUNT, COUNTx PROFILE or "
                f"COUNTx PROFILE@VARIANT, terms joined by '+' "
                f"(e.g. '8x llama3-8b-h100 + 8x llama3-8b-a100@decode-priority')"
            )
        count, name = int(match.group(1)), match.group(2) or DEFAULT_PROFILE
        if count < 1:
            raise PoolSpecError(f"pool spec {spec!r}: a count must be at least 1, got {count}")
        profile = PROFILES.get(name)
        if profile is None:
            raise PoolSpecError(
                f"pool spec {spec!r}: unknown profile {name!r} (known: {', '.join(sorted(PROFILES))})"
            )
        term_variant = variant or EngineVariant()
        if match.group(3) is not None:
            if not match.group(3).strip():
                raise PoolSpecError(f"pool spec {spec!r}: {term.strip()!r} has '@' but no variant after it")
            try:
                term_variant = term_variant.then(parse_variant(match.group(3)))
            except VariantError as exc:
                raise PoolSpecError(f"pool spec {spec!r}: {exc}") from None
        try:
            profile = term_variant.apply(profile)
        except VariantError as exc:
            raise PoolSpecError(f"pool spec {spec!r}: {exc}") from None
        profiles += [profile] * count
    if len(profiles) > 10_000:
        raise PoolSpecError(f"pool spec {spec!r}: {len(profiles)} pods is more than the 10,000 supported")
    return profiles


def describe_pool(profiles: list[Profile]) -> str:
    """The canonical spec of a pool: counts of consecutive equal profiles."""
    terms: list[str] = []
    previous, count = None, 0
    for profile in [*profiles, None]:
        name = None if profile is None else profile.name
        if name == previous:
            count += 1
            continue
        if previous is not None:
            terms.append(f"{count}x {previous}")
        previous, count = name, 1
    return " + ".join(terms)
