"""What the front-ends' commands share: a port argument, the recording's arguments, logging, and
configuration errors as exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from slorouter.config import ConfigError
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.serving.record_file import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES
from slorouter.serving.recording import RecordSettings

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


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
