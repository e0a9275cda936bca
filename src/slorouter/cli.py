"""The ``slorouter`` command.

Each subcommand lives in its own module, which exposes ``register(subparsers)``: it adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code). A command that
needs a layer it may not import gets it here, as a keyword of ``register`` (``COMMAND_NEEDS``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slorouter.sim.server import SimCluster

SUBCOMMAND_MODULES = (
    "slorouter.gateway.command",  # serve
    "slorouter.extproc.command",  # epp
    "slorouter.sim.command",  # sim
    "slorouter.predictor.command",  # predictor training-server | prediction-server
    "slorouter.bench.command",  # bench
    "slorouter.bench.tuning.command",  # tune-worker
    "slorouter.top.command",  # top
)


async def start_simulated_pods(count: int, profile: str) -> SimCluster:
    """``count`` simulated pods of ``profile`` on free ports: the pool of ``slorouter serve``'s embedded
    default."""
    from slorouter.sim.server import start_pods  # imported when used: the other commands start faster

    return await start_pods(count, 0, profile)


COMMAND_NEEDS: dict[str, dict[str, Any]] = {
    "slorouter.gateway.command": {"start_pods": start_simulated_pods},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slorouter", description="Predicted-latency router for LLM inference pools."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers, **COMMAND_NEEDS.get(module_name, {}))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # Ctrl-C while the subcommands load (seconds on a busy machine) ends quietly too
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
