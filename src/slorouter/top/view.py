"""One frame of ``slorouter top``, drawn with rich from a ``Reading`` (and the one before it, for rates)."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from slorouter.pool.kv_trust import TrustState
from slorouter.serving.regret import RegretStatus
from slorouter.serving.status import KVIndexStatus, LedgerStatus, TuningStatus
from slorouter.top.source import Reading

ROUTES = ("predicted", "explore", "heuristic", "fallback")  # the x-slorouter-route values, in this order


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"


_TRUST_STYLE = {TrustState.EXACT: "green", TrustState.DEGRADED: "red", TrustState.REBUILDING: "yellow"}


def _kv_index(status: KVIndexStatus | None) -> Text:
    """``exact``, or the state, why and for how long (``degraded lag 12s``)."""
    if status is None:
        return Text("—", "dim")
    if status.state is TrustState.EXACT:
        return Text("exact", _TRUST_STYLE[status.state])
    label = f"{status.state.value} {status.reason.value} {_duration(status.for_s)}"
    return Text(label, _TRUST_STYLE[status.state])


def _share(part: float, whole: float) -> str:
    return "—" if whole <= 0 else f"{100 * part / whole:.1f}%"


def _rate(now: float, before: float | None, seconds: float | None) -> str:
    if before is None or not seconds or seconds <= 0:
        return ""
    return f" ({max(0.0, now - before) / seconds:,.1f}/s)"


def render(reading: Reading, previous: Reading | None = None) -> RenderableType:
    """The frame: a header (front-end, uptime, request and error rates, sheds, SLO attainment, routes,
    predictor), then a table of the pool's endpoints."""
    status = reading.status
    counters = reading.counters
    seconds = None if previous is None else reading.at - previous.at
    before = None if previous is None else previous.counters

    title = Text.assemble(
        ("slorouter top", "bold"),
        f" · {status.front_end} {reading.url} · up {_duration(status.uptime_s)} · ",
        time.strftime("%H:%M:%S"),
    )

    def counted(name: str, now: float, then: float | None, style: str = "") -> Text:
        label = f"{name} " if name else ""
        return Text.assemble(label, (f"{now:,.0f}{_rate(now, then, seconds)}", style if now else ""))

    requests = Text.assemble(
        ("requests ", "bold"),
        counted("", counters.requests, None if before is None else before.requests),
        " · ",
        counted("5xx", counters.answered("5"), None if before is None else before.answered("5"), "red"),
        " · ",
        counted("4xx", counters.answered("4"), None if before is None else before.answered("4")),
        " · ",
        counted("sheds", counters.sheds, None if before is None else before.sheds, "yellow"),
        " · queued ",
        "off" if status.queued is None else str(status.queued),
    )
    slo = status.slo
    attainment = slo.attainment
    slo_line = Text.assemble(
        ("SLO attainment ", "bold"),
        (
            "— (no request with an SLO)"
            if attainment is None
            else f"{100 * attainment:.1f}% ({slo.met:,} of {slo.requests:,} met)",
            "" if attainment is None or attainment >= 0.9 else "red",
        ),
    )
    routed = sum(status.routes.values())
    names = [r for r in ROUTES if r in status.routes] + sorted(set(status.routes) - set(ROUTES))
    routes = Text.assemble(
        ("routes ", "bold"),
        " · ".join(f"{name} {_share(status.routes[name], routed)}" for name in names) or "— (none yet)",
    )
    predictor = status.predictor
    if predictor.mode == "off":
        state = "off (heuristic routing)"
    else:
        state = f"{predictor.mode}, " + (
            "ready" if predictor.ready else "not ready: heuristics until trained"
        )
        versions = [f"{kind} {version}" for kind, version in sorted(predictor.versions.items()) if version]
        if versions:
            state += " · models " + ", ".join(versions)
    ledger = status.ledger
    drift = ""
    if ledger is not None and ledger.drifting:
        drift = f" · drifting on {len(ledger.drifting)} endpoint{'s' if len(ledger.drifting) > 1 else ''}"
        if ledger.distrusted:
            drift += f", {len(ledger.distrusted)} routed by heuristics"
    predictor_line = Text.assemble(("predictor ", "bold"), state, (drift, "red"))
    lines = [title, requests, slo_line, routes, predictor_line]
    if status.tuning is not None:
        lines.append(Text.assemble(("tuning ", "bold"), tuning_summary(status.tuning)))
    if status.regret is not None:
        lines.append(Text.assemble(("regret ", "bold"), regret_summary(status.regret)))

    table = Table(expand=False, header_style="bold")
    table.add_column("endpoint", no_wrap=True)
    table.add_column("up", justify="center")
    table.add_column("in-flight", justify="right")
    table.add_column("queue", justify="right")
    table.add_column("running", justify="right")
    table.add_column("KV", justify="right")
    table.add_column("TTFT pred", justify="right")
    table.add_column("TTFT obs", justify="right")
    table.add_column("TTFT cov", justify="right")
    table.add_column("picks", justify="right")
    kv_events = any(e.kv_index is not None for e in status.endpoints)
    if kv_events:
        table.add_column("prefix index", no_wrap=True)
    total_picks = sum(e.picks for e in status.endpoints)
    for endpoint in status.endpoints:
        stale = endpoint.metrics_age_s is None or endpoint.metrics_age_s > 5
        extra = [_kv_index(endpoint.kv_index)] if kv_events else []
        table.add_row(
            endpoint.address,
            Text("●", "green") if endpoint.healthy else Text("✕", "red"),
            str(endpoint.inflight_requests),
            Text(str(endpoint.waiting), "dim" if stale else ""),
            Text(str(endpoint.running), "dim" if stale else ""),
            Text(f"{100 * endpoint.kv_usage:.0f}%", "dim" if stale else ""),
            _ms(endpoint.predicted_ttft_ms),
            _ms(endpoint.observed_ttft_ms),
            _coverage(ledger, endpoint.address),
            _share(endpoint.picks, total_picks),
            *extra,
        )
    notes = "queue, running, KV: the last scrape (dim: older than 5 s)\n"
    notes += (
        f"TTFT: mean over each endpoint's last {status.window} requests · picks: since the router started\n"
        "TTFT cov: share of the TTFTs of the ledger's window under their predicted quantile (red: drifting)"
    )
    if kv_events:
        notes += "\nprefix index: its KV-event index's trust; not exact: routed on the approximate estimate"
    caption = Text(notes, "dim")
    return Group(*lines, table, caption)


def _coverage(ledger: LedgerStatus | None, address: str) -> Text:
    accuracy = None if ledger is None else ledger.endpoints.get(address, {}).get("ttft")
    if ledger is None or accuracy is None:
        return Text("—")
    drifting = "ttft" in ledger.drifting.get(address, ())
    return Text(f"{100 * accuracy.coverage:.0f}%", "red" if drifting else "")


def render_error(url: str, message: str, retry_s: float) -> RenderableType:
    """The frame while the router cannot be read: the reason on one line, and the retry."""
    return Group(
        Text.assemble(("slorouter top", "bold"), f" · {url} · ", time.strftime("%H:%M:%S")),
        Text(message, "red"),
        Text(f"retrying every {retry_s:g} s · Ctrl-C to quit", "dim"),
    )


def tuning_summary(tuning: TuningStatus) -> str:
    """The tuning line: the active candidate, the last round's verdict, the twin's error, the switches."""
    text = f"{tuning.active} · {tuning.switches} switches in {tuning.rounds} rounds"
    last = tuning.last_round
    if last is not None:
        error = last.get("twin_error")
        text += f" · last: {last.get('reason', '')}"
        if error is not None:
            text += f" (twin error {100 * error:.0f}%)"
    if tuning.worker != "running":
        text += f" · tuner {tuning.worker}"
    return text


def regret_summary(regret: RegretStatus) -> str:
    """The regret line (audit.regret): reuse achieved, avoidable prefill, TTFT regret, picks by reason."""
    if not regret.picks:
        return "— (no pick yet)"
    reuse = "—" if regret.reuse_achieved is None else f"{100 * regret.reuse_achieved:.1f}%"
    text = f"reuse achieved {reuse} · avoidable prefill {regret.avoidable_prefill_tokens:,} tokens"
    if regret.mean_ttft_regret_ms is not None:
        text += f" · TTFT regret {regret.mean_ttft_regret_ms:.1f} ms"
    reasons = sorted(regret.by_reason.items(), key=lambda item: -item[1].picks)
    return text + " · " + ", ".join(f"{reason} {_share(t.picks, regret.picks)}" for reason, t in reasons)
