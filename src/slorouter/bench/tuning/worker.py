"""The tuner's process (``slorouter tune-worker``), started by a router that tunes itself.

The router never imports the simulator; it runs this process at low priority and talks to it in JSON lines
on its standard input and output:

- first, the setup: ``{"pipeline": <scheduler config>, "settings": {<TuningSettings fields>}, "cluster":
  {"scrape_interval_s": ..., "network_s": ...}}``;
- then one request per round: ``{"round": N, "now": T, "active": NAME, "addresses": [...], "capacity":
  {ADDRESS: [BLOCKS, BLOCK_SIZE]}, "window": PATH, "models": PATH | null, "reverted": [[T, NAME], ...],
  "copies": N}``,
  where ``window`` is a file of the window's entries (``traffic_window.encode_entries``) and ``models``
  the directory of the router's predictor models (its embedded predictor's), and ``copies`` the number of
  pickers whose traffic the window stands for;
- answered by ``{"round": N, "result": {...}, "cpu_s": S}`` or ``{"round": N, "error": MESSAGE}``.

A bad line gets an error answer and the process goes on; end of input ends it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from slorouter.bench.cluster import ClusterSettings
from slorouter.bench.tuning.tuner import Tuner, TuningRound, TuningSettings
from slorouter.predictor.model_store import ModelMetadata, ModelStore
from slorouter.serving.traffic_window import decode_entries

NICENESS = 10


def round_summary(result: TuningRound) -> dict[str, Any]:
    """What the router shows of a round: metrics, status page, log."""
    return {
        "outcome": result.outcome.value,
        "at": result.at,
        "active": result.active,
        "requests": result.requests,
        "twin_error": None if not math.isfinite(result.twin_error) else round(result.twin_error, 4),
        "errors": {k: (round(v, 4) if math.isfinite(v) else None) for k, v in result.errors.items()},
        "observed_ttft_p90_ms": None if result.observed is None else _finite(result.observed.ttft_p90_ms),
        "twin_ttft_p90_ms": {c: _finite(f.ttft_p90_ms) for c, f in result.replayed.items()},
        "best": result.best,
        "predicted_gain": round(result.predicted_gain, 4),
        "switch_to": result.switch_to,
        "reason": result.reason,
    }


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


class Worker:
    def __init__(self, setup: dict[str, Any]) -> None:
        settings = setup.get("settings") or {}
        settings["candidates"] = tuple(settings.get("candidates") or ())
        cluster = setup.get("cluster") or {}
        self.tuner = Tuner(setup["pipeline"], TuningSettings(**settings), cluster=ClusterSettings(**cluster))

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        start = time.process_time()
        for at, back_to in request.get("reverted") or ():
            self.tuner.reverted(float(at), str(back_to))
        entries = decode_entries(Path(request["window"]).read_bytes())
        models: list[tuple[bytes, ModelMetadata]] = []
        if request.get("models"):
            store = ModelStore(Path(request["models"]))
            models = [m for m in (store.load("ttft"), store.load("tpot")) if m is not None]
        capacity = {a: (int(v[0]), int(v[1])) for a, v in (request.get("capacity") or {}).items()}
        result = self.tuner.tune(
            entries,
            now=float(request["now"]),
            active=str(request["active"]),
            addresses=list(request["addresses"]),
            capacity=capacity,
            models=models,
            copies=int(request.get("copies") or 1),
        )
        return {"result": round_summary(result), "cpu_s": round(time.process_time() - start, 3)}


def serve(stdin: IO[str], stdout: IO[str]) -> int:
    """Answer the router's requests until its end of input (see the module docstring)."""
    line = stdin.readline()
    if not line:
        return 0
    try:
        worker = Worker(json.loads(line))
    except Exception as exc:  # a bad setup: say why, and end (the router reports it)
        stdout.write(json.dumps({"error": f"setup: {exc}"}) + "\n")
        stdout.flush()
        return 2
    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        answer: dict[str, Any]
        number = None
        try:
            request = json.loads(line)
            number = request.get("round")
            answer = {"round": number, **worker.handle(request)}
        except Exception as exc:
            answer = {"round": number, "error": f"{type(exc).__name__}: {exc}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


def main() -> int:
    with contextlib.suppress(OSError):  # already as low as it goes
        os.nice(NICENESS)
    return serve(sys.stdin, sys.stdout)
