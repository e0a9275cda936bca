"""Every bad input gets an OpenAI-style JSON error that names the problem."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import start_router


@pytest.fixture
async def small_router(cluster):
    router = await start_router(
        list(cluster.addresses), gateway={"max_body_bytes": 4096, "api_keys": ["secret"]}
    )
    try:
        yield router
    finally:
        await router.stop()


AUTH = {"Authorization": "Bearer secret"}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", b"", 400, "empty"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", b'{"prompt": "hi"}', 400, "'model'"),
        ("/v1/completions", b'{"model": "", "prompt": "hi"}', 400, "'model'"),
        ("/v1/completions", b'{"model": "m"}', 400, "'prompt'"),
        ("/v1/completions", b'{"model": "m", "prompt": 5}', 400, "'prompt'"),
        ("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": 0}', 400, "'max_tokens'"),
        ("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": "9"}', 400, "'max_tokens'"),
        ("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": true}', 400, "'max_tokens'"),
        ("/v1/completions", b'{"model": "m", "prompt": "hi", "stream": "yes"}', 400, "'stream'"),
        ("/v1/chat/completions", b'{"model": "m"}', 400, "'messages'"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', 400, "'messages'"),
        ("/v1/chat/completions", b'{"model": "m", "messages": ["hi"]}', 400, "messages[0]"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "x"}]}', 400, "role"),
    ],
)
async def test_bad_bodies_get_400(small_router, http, path, body, status, needle):
    url = f"http://{small_router.address}{path}"
    async with http.post(url, data=body, headers={**AUTH, "Content-Type": "application/json"}) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert needle in error["message"]
    assert error["type"] == "BadRequestError"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/octet-stream"]
)
async def test_a_body_not_declared_json_gets_415_naming_the_header(small_router, http, content_type):
    url = f"http://{small_router.address}/v1/completions"
    body = b'{"model": "m", "prompt": "hi"}'
    async with http.post(url, data=body, headers={**AUTH, "Content-Type": content_type}) as resp:
        assert resp.status == 415
        error = (await resp.json())["error"]
    assert error["type"] == "UnsupportedMediaTypeError" and error["param"] == "content-type"
    assert error["message"] == (
        f"Content-Type {content_type!r} is not supported: send the body as JSON with "
        "Content-Type: application/json"
    )


async def test_body_over_the_limit_gets_413(small_router, http):
    body = b'{"model": "m", "prompt": "' + b"x" * 8000 + b'"}'
    async with http.post(f"http://{small_router.address}/v1/completions", data=body, headers=AUTH) as resp:
        assert resp.status == 413
        assert "larger than the limit" in (await resp.json())["error"]["message"]


async def test_unknown_route_and_method(small_router, http):
    async with http.get(f"http://{small_router.address}/v1/nothing") as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["type"] == "NotFoundError"
        assert error["message"].startswith("no route for GET /v1/nothing (known: POST /v1/completions, ")
        assert "GET /v1/models" in error["message"] and "HEAD" not in error["message"]
    async with http.get(f"http://{small_router.address}/v1/completions", headers=AUTH) as resp:
        assert resp.status == 405
        assert (await resp.json())["error"]["type"] == "MethodNotAllowedError"


async def test_api_key_is_required_when_configured(small_router, http, cluster):
    url = f"http://{small_router.address}/v1/completions"
    body = {"model": cluster.model, "prompt": "hi", "max_tokens": 1}
    async with http.post(url, json=body) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["type"] == "AuthenticationError"
    async with http.post(url, json=body, headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401
    async with http.post(url, json=body, headers=AUTH) as resp:
        assert resp.status == 200


async def test_unknown_model_is_answered_by_the_model_server(small_router, http):
    body = {"model": "no-such-model", "prompt": "hi", "max_tokens": 1}
    async with http.post(f"http://{small_router.address}/v1/completions", json=body, headers=AUTH) as resp:
        assert resp.status == 404
        assert "error" in await resp.json()


async def test_health_ready_models(small_router, http, cluster):
    async with http.get(f"http://{small_router.address}/health") as resp:
        assert resp.status == 200
    async with http.get(f"http://{small_router.address}/ready") as resp:
        assert resp.status == 200
    async with http.get(f"http://{small_router.address}/v1/models", headers=AUTH) as resp:
        assert resp.status == 200
        assert cluster.model in [m["id"] for m in (await resp.json())["data"]]
