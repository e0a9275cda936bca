"""The ``slorouter`` command.

Each subcommand lives in its own module, which exposes ``register(subparsers)``: it adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "slorouter.gateway.command",  # serve
    "slorouter.extproc.command",  # epp
    "slorouter.sim.command",  # sim
    "slorouter.predictor.command",  # predictor training-server | prediction-server
    "slorouter.bench.command",  # bench
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slorouter", description="Predicted-latency router for LLM inference pools."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
