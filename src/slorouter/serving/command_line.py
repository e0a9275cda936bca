"""What the front-ends' commands share: a port argument, logging, and configuration errors as exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from slorouter.config import ConfigError
from slorouter.scheduling.config_schema import SchedulerConfigError

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
