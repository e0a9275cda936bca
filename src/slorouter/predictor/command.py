"""``slorouter predictor training-server|prediction-server``: the predictor sidecars, until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import uvloop

from slorouter.http.auth import TOKEN_ENV, InsecureBindError, is_loopback, read_token_env, read_token_file
from slorouter.http.running import RunningServer, wait_for_signal
from slorouter.predictor.model_store import MAX_MODEL_BYTES
from slorouter.predictor.state_dir import DEFAULT_MAX_AGE_S, MODELS, StateDirBusyError, default_state_dir

PROG = "slorouter predictor"


class _Server(Protocol):
    async def start(self, host: str = ..., port: int = ...) -> RunningServer: ...

    async def stop(self) -> None: ...


def _number(
    kind: type, *, minimum: float | None = None, exclusive: bool = False, maximum: float | None = None
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if minimum is not None and (value <= minimum if exclusive else value < minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if exclusive else '>='} {minimum:g}, got {text}")
        if maximum is not None and (value >= maximum if exclusive else value > maximum):
            raise argparse.ArgumentTypeError(f"must be {'<' if exclusive else '<='} {maximum:g}, got {text}")
        return value

    return parse


_port = _number(int, minimum=0, maximum=65535)
_positive_int = _number(int, minimum=1)
_positive = _number(float, minimum=0, exclusive=True)
_non_negative = _number(float, minimum=0)
_quantile = _number(float, minimum=0, maximum=1, exclusive=True)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text.rstrip("/")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "predictor",
        help="run a latency-predictor sidecar (training or prediction server)",
        description="Run the latency predictor as separate servers (sidecar mode): docs/predictor-api.md.",
    )
    parser.set_defaults(func=lambda _args: _usage(parser))
    servers = parser.add_subparsers(dest="predictor_command", metavar="SERVER")
    _add_training(servers)
    _add_prediction(servers)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _common(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument(
        "--port", type=_port, default=default_port, help="listen port; 0 picks one (default %(default)s)"
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="require Authorization: Bearer TOKEN on every endpoint but /healthz and /readyz; FILE holds the "
        "accepted tokens, one a line (# comments; the first is also sent to the training server). Default: "
        f"${TOKEN_ENV} (comma-separated) if set. Needed to listen on an address other than loopback",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _add_training(servers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = servers.add_parser(
        "training-server",
        help="ingest samples, train the TTFT/TPOT models, publish them",
        description="Ingest latency samples (POST /v1/samples), retrain on a cadence in a background thread, "
        "and publish each model atomically into --model-dir and at GET /v1/models/{ttft,tpot}. Models and "
        "the sample window are kept in --state-dir across restarts.",
    )
    _common(parser, 8000)
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the sample window (and, by default, the models) survive restarts "
        "(default $XDG_STATE_HOME/slorouter/training-server, or ~/.local/state/slorouter/training-server)",
    )
    parser.add_argument(
        "--model-dir", metavar="DIR", help="directory the models are written to (default STATE_DIR/models)"
    )
    parser.add_argument(
        "--save-interval-s",
        type=_positive,
        default=60.0,
        help="seconds between saves of the sample window, also saved at shutdown (default %(default)s)",
    )
    parser.add_argument(
        "--max-state-age-s",
        type=_non_negative,
        default=DEFAULT_MAX_AGE_S,
        help="models and a sample window older than this are refused at start; 0: no limit "
        "(default %(default)s, a day)",
    )
    parser.add_argument(
        "--objective",
        choices=["conformal", "quantile", "mean"],
        default="conformal",
        help="default %(default)s",
    )
    parser.add_argument(
        "--quantile", type=_quantile, default=0.9, help="target quantile, 0..1 (default %(default)s)"
    )
    parser.add_argument(
        "--retrain-interval-s",
        type=_non_negative,
        default=5.0,
        help="seconds between trainings (default %(default)s)",
    )
    parser.add_argument(
        "--min-samples",
        type=_positive_int,
        default=200,
        help="samples needed to train a model (default %(default)s)",
    )
    parser.add_argument("--queue-buckets", type=_positive_int, default=5, help="default %(default)s")
    parser.add_argument("--kv-buckets", type=_positive_int, default=20, help="default %(default)s")
    parser.add_argument("--prefix-buckets", type=_positive_int, default=4, help="default %(default)s")
    parser.add_argument(
        "--samples-per-bucket",
        type=_positive_int,
        default=500,
        help="newest samples kept per bucket (default %(default)s)",
    )
    parser.add_argument(
        "--train-threads",
        type=_positive_int,
        default=2,
        help="XGBoost threads while training (default %(default)s)",
    )
    parser.set_defaults(func=run_training_server)


def _add_prediction(servers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = servers.add_parser(
        "prediction-server",
        help="serve TTFT/TPOT predictions from the newest models",
        description="Serve POST /v1/predict/bulk and /v1/predict from the newest trained models, loaded from "
        "the shared model directory or polled from the training server.",
    )
    _common(parser, 8001)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", metavar="DIR", help="read models from this shared model directory")
    source.add_argument(
        "--training-server", type=_url, metavar="URL", help="download models from this training server"
    )
    parser.add_argument(
        "--poll-interval-s",
        type=_positive,
        default=1.0,
        help="seconds between model checks (default %(default)s)",
    )
    parser.add_argument(
        "--max-rows",
        type=_positive_int,
        default=10_000,
        help="rows allowed per bulk request (default %(default)s)",
    )
    parser.add_argument(
        "--max-model-bytes",
        type=_positive_int,
        default=MAX_MODEL_BYTES,
        help="a model file (or download) larger is refused before it is read (default %(default)s)",
    )
    parser.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="serve /admin/faults to make the prediction endpoints hang, slow down or answer garbage "
        "(tests and drills only; docs/reliability.md)",
    )
    parser.set_defaults(func=run_prediction_server)


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_training_server(args: argparse.Namespace) -> int:
    from slorouter.predictor.store import StoreConfig
    from slorouter.predictor.trainer import TrainerConfig
    from slorouter.predictor.training_server import TrainingServer

    _configure_logging(args.log_level)
    tokens = _tokens(args, "training-server")
    if tokens is None:
        return 2
    state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir("training-server")
    try:
        server = TrainingServer(
            Path(args.model_dir).expanduser() if args.model_dir else state_dir / MODELS,
            state_dir=state_dir,
            save_interval_s=args.save_interval_s,
            max_state_age_s=args.max_state_age_s or None,
            store_config=StoreConfig(
                queue_buckets=args.queue_buckets,
                kv_buckets=args.kv_buckets,
                prefix_buckets=args.prefix_buckets,
                per_bucket=args.samples_per_bucket,
            ),
            trainer_config=TrainerConfig(
                objective=args.objective,
                quantile=args.quantile,
                retrain_interval_s=args.retrain_interval_s,
                min_samples=args.min_samples,
                nthread=args.train_threads,
            ),
            tokens=tokens,
        )
    except (OSError, ValueError) as exc:
        print(f"{PROG} training-server: error: {exc}", file=sys.stderr)
        return 2
    return _serve(server, args, "training-server")


def run_prediction_server(args: argparse.Namespace) -> int:
    from slorouter.predictor.model_sources import make_source
    from slorouter.predictor.prediction_server import PredictionServer

    _configure_logging(args.log_level)
    tokens = _tokens(args, "prediction-server")
    if tokens is None:
        return 2
    try:
        server = PredictionServer(
            make_source(
                model_dir=args.model_dir,
                training_server=args.training_server,
                tokens=tokens,
                max_model_bytes=int(args.max_model_bytes),
            ),
            poll_interval_s=args.poll_interval_s,
            max_rows=args.max_rows,
            tokens=tokens,
            enable_fault_injection=args.enable_fault_injection,
        )
    except (OSError, ValueError) as exc:
        print(f"{PROG} prediction-server: error: {exc}", file=sys.stderr)
        return 2
    return _serve(server, args, "prediction-server")


def _tokens(args: argparse.Namespace, name: str) -> list[str] | None:
    """The server's tokens (none: no token required), or None after printing why they cannot be read or why
    the server must not listen without one."""
    try:
        if args.token_file is not None:
            tokens = read_token_file(str(Path(args.token_file).expanduser()))
        elif os.environ.get(TOKEN_ENV) is not None:
            tokens = read_token_env(TOKEN_ENV, os.environ)
        else:
            tokens = []
    except ValueError as exc:
        where = "--token-file: " if args.token_file is not None else ""
        print(f"{PROG} {name}: error: {where}{exc}", file=sys.stderr)
        return None
    if not tokens and not is_loopback(args.host):
        print(
            f"{PROG} {name}: error: --host {args.host} is not a loopback address: give --token-file FILE (or "
            f"set {TOKEN_ENV}) so that only the router can use this server, or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return None
    return tokens


def _serve(server: _Server, args: argparse.Namespace, name: str) -> int:
    async def main() -> int:
        running = await server.start(args.host, args.port)
        print(f"{PROG} {name}: listening on {running.url}", flush=True)
        try:
            await wait_for_signal()
        finally:
            await server.stop()
        return 0

    try:
        return uvloop.run(main())
    except StateDirBusyError as exc:
        print(f"{PROG} {name}: error: --state-dir: {exc}", file=sys.stderr)
        return 2
    except InsecureBindError as exc:
        print(f"{PROG} {name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG} {name}: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``slorouter predictor ...`` on its own (before or without the main CLI's registration)."""
    parser = argparse.ArgumentParser(prog="slorouter")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["predictor", *(sys.argv[1:] if argv is None else argv)])
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
