"""API keys from the config, a file or an environment variable; never in a dump, a repr or an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slorouter.config import ConfigError, GatewayConfig, parse_config
from tests.gateway.conftest import start_router

SECRET = "sk-Xq7-secret-marker"


def gateway(**keys: object) -> GatewayConfig:
    return parse_config({"gateway": keys}).gateway


def test_keys_from_a_file_with_comments_and_blank_lines(tmp_path: Path):
    path = tmp_path / "keys"
    path.write_text("# the gateway's keys\n\n  sk-a  \n# sk-old\nsk-b\n")
    assert gateway(api_keys_file=str(path)).accepted_api_keys == ("sk-a", "sk-b")


def test_keys_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEST_GW_KEYS", " sk-a, sk-b,,")
    assert gateway(api_keys_env="TEST_GW_KEYS").accepted_api_keys == ("sk-a", "sk-b")


def test_all_three_sources_are_merged_without_duplicates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "keys").write_text("sk-b\nsk-c\n")
    monkeypatch.setenv("TEST_GW_KEYS", "sk-c,sk-d")
    config = gateway(
        api_keys=["sk-a", "sk-b"], api_keys_file=str(tmp_path / "keys"), api_keys_env="TEST_GW_KEYS"
    )
    assert config.accepted_api_keys == ("sk-a", "sk-b", "sk-c", "sk-d")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "api_keys_file: cannot read"),
        ("", "holds no token"),
        ("# only a comment\n\n", "holds no token"),
        (f"sk-ok\n{SECRET} with a space\n", "line 2: the token holds a character"),
        (b"sk-\xc3\xa9\n", "byte 3 is not ASCII"),
        (b"x" * ((1 << 20) + 1), "larger than"),
    ],
)
def test_a_key_file_that_gives_no_keys_is_a_clear_error(tmp_path: Path, content, needle):
    path = tmp_path / "keys"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        gateway(api_keys_file=str(path))
    message = str(caught.value)
    assert "gateway: api_keys_file: " in message and str(path) in message
    assert needle in message
    assert SECRET not in message


def test_a_directory_is_not_a_key_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        gateway(api_keys_file=str(tmp_path))


@pytest.mark.parametrize("value", [None, "", " , ,"])
def test_an_unset_or_empty_key_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value):
    if value is None:
        monkeypatch.delenv("TEST_GW_KEYS", raising=False)
    else:
        monkeypatch.setenv("TEST_GW_KEYS", value)
    with pytest.raises(ConfigError, match="api_keys_env: the environment variable TEST_GW_KEYS"):
        gateway(api_keys_env="TEST_GW_KEYS")


def test_a_bad_inline_key_is_named_by_position_not_quoted():
    with pytest.raises(ConfigError) as caught:
        gateway(api_keys=["sk-ok", f"{SECRET}\n"])
    assert "api_keys[1]: the key holds" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_no_dump_or_repr_shows_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "keys").write_text(f"{SECRET}-file\n")
    monkeypatch.setenv("TEST_GW_KEYS", f"{SECRET}-env")
    config = parse_config(
        {
            "gateway": {
                "api_keys": [SECRET],
                "api_keys_file": str(tmp_path / "keys"),
                "api_keys_env": "TEST_GW_KEYS",
            }
        }
    )
    assert len(config.gateway.accepted_api_keys) == 3
    for text in (repr(config), str(config), config.model_dump_json(), str(config.model_dump())):
        assert SECRET not in text


@pytest.mark.processes
def test_a_bad_key_file_stops_serve_with_exit_2_and_no_key_printed(tmp_path: Path):
    (tmp_path / "keys").write_text(f"{SECRET} two words\n")
    (tmp_path / "gw.yaml").write_text(
        f"gateway:\n  api_keys_file: {tmp_path / 'keys'}\npool:\n  endpoints: ['127.0.0.1:9']\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "slorouter.cli", "serve", "--config", str(tmp_path / "gw.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
    )
    assert done.returncode == 2, done.stderr
    assert "api_keys_file" in done.stderr and "line 1" in done.stderr
    assert SECRET not in done.stderr + done.stdout


async def test_a_key_from_the_file_opens_the_gateway(tmp_path: Path, cluster, http):
    (tmp_path / "keys").write_text("# one key\nsk-from-file\n")
    router = await start_router(list(cluster.addresses), gateway={"api_keys_file": str(tmp_path / "keys")})
    try:
        body = {"model": cluster.model, "prompt": "hi", "max_tokens": 2}
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=body) as resp:
            assert resp.status == 401
        async with http.post(url, json=body, headers={"Authorization": "Bearer sk-from-file"}) as resp:
            assert resp.status == 200
    finally:
        await router.stop()
