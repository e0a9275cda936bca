"""API keys at the gateway: every configured key works, anything else gets 401, and the key stays here."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import start_router


@pytest.fixture
async def keyed_router(cluster):
    router = await start_router(list(cluster.addresses), gateway={"api_keys": ["sk-one", "sk-two"]})
    try:
        yield router
    finally:
        await router.stop()


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        ("Bearer sk-one", 200),
        ("Bearer sk-two", 200),
        ("bearer sk-two", 200),
        ("Bearer sk-on", 401),
        ("Bearer sk-one2", 401),
        ("Basic sk-one", 401),
        (None, 401),
    ],
)
async def test_keys(keyed_router, cluster, http, authorization, status):
    headers = {} if authorization is None else {"Authorization": authorization}
    body = {"model": cluster.model, "prompt": "hi", "max_tokens": 2}
    url = f"http://{keyed_router.address}"
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == status
        if status == 401:
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert (await resp.json())["error"]["type"] == "AuthenticationError"
    async with http.get(f"{url}/v1/models", headers=headers) as resp:
        assert resp.status == status


async def test_probes_and_metrics_need_no_key(keyed_router, http):
    for path in ("/health", "/ready", "/metrics"):
        async with http.get(f"http://{keyed_router.address}{path}") as resp:
            assert resp.status == 200, path
