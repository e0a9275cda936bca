"""Reading test modules' source: the module a ``from ... import`` names, made absolute."""

from __future__ import annotations

import ast


def imported_from(node: ast.ImportFrom, module: str) -> str:
    """The absolute name of the module that ``node``, in module ``module`` (``tests.x.test_y``), imports
    from: ``from .conftest import a`` in ``tests.x.test_y`` is ``tests.x.conftest``."""
    base = node.module or ""
    if not node.level:
        return base
    parts = module.split(".")[: -node.level]
    return ".".join(parts + ([base] if base else []))
