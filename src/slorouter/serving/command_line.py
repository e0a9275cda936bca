"""What the front-ends' commands share: a port argument, the recording's arguments, logging, and
configuration errors as exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from slorouter.config import Config, ConfigError
from slorouter.http.running import address_in_use
from slorouter.predictor.state_dir import LOCK, StateDirBusyError, StateDirLock
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.serving.record_file import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES
from slorouter.serving.recording import RecordSettings

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
STATE_DIR_CHANGE = "--state-dir DIR, or predictor.embedded.state_dir in the config"


def port(value: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port must be an integer, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"a port must be between 0 and 65535, got {number}")
    return number


def _byte_count(value: str) -> int:
    """An argparse type: a size in bytes, with an optional K, M or G suffix (powers of 1024)."""
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if text and text[-1] in "KMG":
        scale = 1024 ** ("KMG".index(text[-1]) + 1)
        text = text[:-1]
    try:
        number = int(text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes (e.g. 100M), got {value!r}") from None
    if number < 4096:
        raise argparse.ArgumentTypeError(f"must be at least 4096 bytes, got {value!r}")
    return number


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {number}")
    return number


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """``--record FILE`` and its bounds (docs/replay.md)."""
    parser.add_argument(
        "--record",
        metavar="FILE",
        type=Path,
        default=None,
        help="record every inference request to FILE (JSON Lines, no prompt or completion text: token "
        "counts, keyed prefix-block hashes, SLO headers, observed latency), for `slorouter bench --trace`",
    )
    parser.add_argument(
        "--record-max-bytes",
        type=_byte_count,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="with --record: rotate FILE when it would grow past this (K, M, G suffixes; default 100M)",
    )
    parser.add_argument(
        "--record-backups",
        type=_count,
        default=DEFAULT_BACKUPS,
        metavar="N",
        help=f"with --record: rotated files kept, FILE.1 (newest) to FILE.N (default {DEFAULT_BACKUPS})",
    )


def add_state_dir_argument(parser: argparse.ArgumentParser, component: str) -> None:
    """``--state-dir DIR``: the embedded predictor's models and sample window (a second router on the same
    machine needs its own)."""
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the embedded predictor keeps its models and sample window (overrides "
        f"predictor.embedded.state_dir; default under ~/.local/state/slorouter/{component}/); "
        "two routers on one machine need two",
    )


def with_state_dir(config: Config, state_dir: str | None) -> Config:
    """``config`` with ``--state-dir`` applied: a ``ConfigError`` when it has no embedded predictor."""
    if state_dir is None:
        return config
    if config.predictor is None or config.predictor.mode != "embedded":
        why = (
            "no predictor section" if config.predictor is None else f"predictor.mode {config.predictor.mode}"
        )
        raise ConfigError(f"--state-dir: this router has no embedded predictor (its config has {why})")
    embedded = config.predictor.embedded.model_copy(update={"state_dir": state_dir, "persist": True})
    predictor = config.predictor.model_copy(update={"embedded": embedded})
    return config.model_copy(update={"predictor": predictor})


class AddressInUseError(OSError):
    """A port this command must listen on is taken; the message says what to do."""


def port_taken(host: str, port: int, change: str) -> AddressInUseError:
    """The error for ``host:port`` taken, naming ``change`` (the flag or key that moves this command)."""
    return AddressInUseError(
        f"{host}:{port} is already in use by another process (another slorouter?): stop it, or {change}"
    )


def check_port_free(host: str, port: int, change: str) -> None:
    """``AddressInUseError`` when something listens on ``host:port`` now: checked before the slow part of a
    start, so that a taken port is not found after it (the real bind still reports what this misses)."""
    if address_in_use(host, port):
        raise port_taken(host, port, change)


def check_state_dir_free(directory: Path | None) -> None:
    """``StateDirBusyError``, saying what to do, when another process holds ``directory`` now (checked
    before the slow part of a start, like ``check_port_free``)."""
    if directory is None or not (directory / LOCK).exists():
        return
    try:
        StateDirLock(directory).release()
    except StateDirBusyError as exc:
        raise StateDirBusyError(f"{exc} ({STATE_DIR_CHANGE})") from None


def record_settings(args: argparse.Namespace) -> RecordSettings | None:
    """The recording the parsed arguments ask for (None without ``--record``)."""
    if args.record is None:
        return None
    return RecordSettings(args.record, args.record_max_bytes, args.record_backups)


def run_command(log_level: str, main: Callable[[], int]) -> int:
    """Run ``main`` with logging set up; a configuration error exits 2, an OS error (a port in use) 1."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return main()
    except (ConfigError, SchedulerConfigError) as exc:
        print(f"slorouter: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"slorouter: {exc}", file=sys.stderr)
        return 1
