"""What a front-end does with each pick's record (``audit`` in the router's YAML): routing regret, and the
candidates' scores on the wire."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from slorouter.config import AuditConfig
from slorouter.metrics import RegretMetrics
from slorouter.serving.regret import RegretLedger


@dataclass(frozen=True, eq=False)
class PickAudit:
    regret: RegretLedger | None = None  # audit.regret: each request's first pick is audited
    scores_max_candidates: int | None = None  # audit.scores_header: candidates listed (None: off)

    @classmethod
    def from_config(cls, config: AuditConfig, registry: CollectorRegistry | None) -> PickAudit | None:
        """None when the section asks for nothing (the director then keeps no records)."""
        if not config.records_picks:
            return None
        regret = None
        if config.regret:
            regret = RegretLedger(None if registry is None else RegretMetrics(registry))
        return cls(regret, config.scores_max_candidates if config.scores_header else None)
