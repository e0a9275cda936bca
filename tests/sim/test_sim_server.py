from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slorouter.sim.profiles import get_profile
from slorouter.sim.server import POD_HEADER, SimCluster, start_pods
from slorouter.sim.text import output_text
from slorouter.sim.variants import apply_variant
from slorouter.tokenizer import chat_to_prompt, count_tokens

MODEL = "sim-llama3-8b"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    cluster = await start_pods(2, 0, "llama3-8b-h100")
    yield cluster
    await cluster.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


@pytest.fixture
def url(cluster: SimCluster) -> str:
    return f"http://{cluster.addresses[0]}"


async def sse_events(response: aiohttp.ClientResponse) -> list:
    """Decoded ``data:`` payloads of an SSE response, the final "[DONE]" kept as a string."""
    events = []
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of the pod's /metrics page by name (cache_config_info keeps its labels)."""
    async with session.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                samples[sample.name] = sample.labels
            elif "le" not in sample.labels:
                samples[sample.name] = sample.value
    return samples


async def wait_for_metric(session, url, name, predicate, timeout=5.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        current = await metrics(session, url)
        if predicate(current[name]):
            return current
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{name} stayed at {current[name]}")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------------------------------- completions


async def test_completion(session, url, cluster):
    prompt = "The quick brown fox jumps over the lazy dog. " * 10
    async with session.post(
        f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 7}
    ) as r:
        assert r.status == 200
        assert r.headers[POD_HEADER] == cluster.pods[0].name
        body = await r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == output_text(0, 7)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": count_tokens(prompt),
        "total_tokens": count_tokens(prompt) + 7,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_completion_defaults_to_16_tokens_and_the_served_model(session, url):
    async with session.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3]}) as r:
        body = await r.json()
    assert r.status == 200 and body["model"] == MODEL
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 16


async def test_chat_completion(session, url):
    request = {"model": MODEL, "messages": CHAT, "max_completion_tokens": 5}
    async with session.post(f"{url}/v1/chat/completions", json=request) as r:
        assert r.status == 200
        body = await r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": output_text(0, 5),
        "tool_calls": [],
    }
    assert body["usage"]["prompt_tokens"] == count_tokens(chat_to_prompt(CHAT))
    assert body["usage"]["completion_tokens"] == 5


async def test_streamed_completion_has_one_chunk_per_token(session, url):
    request = {"prompt": "Hello", "max_tokens": 12, "stream": True}
    async with session.post(f"{url}/v1/completions", json=request) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 12 and all("usage" not in chunk for chunk in chunks)
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == output_text(0, 12)
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None] * 11 + ["length"]
    assert len({chunk["id"] for chunk in chunks}) == 1


async def test_streamed_chat_with_usage(session, url):
    request = {"messages": CHAT, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(f"{url}/v1/chat/completions", json=request) as r:
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    role, *tokens, usage = events[:-1]
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(chunk["choices"][0]["delta"]["content"] for chunk in tokens) == output_text(0, 6)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == count_tokens(chat_to_prompt(CHAT))
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_repeated_prefix_reports_cached_tokens(session, url):
    system = "You are a helpful assistant who answers questions about routing. " * 40
    first = [{"role": "system", "content": system}, {"role": "user", "content": "First question?"}]
    second = [{"role": "system", "content": system}, {"role": "user", "content": "Second question?"}]
    cached = []
    for messages in (first, second):
        async with session.post(
            f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}
        ) as r:
            cached.append((await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[0] == 0
    assert cached[1] >= count_tokens(system) - 32


async def test_multi_turn_chat_hits_the_previous_reply(session, url):
    turn1 = [{"role": "user", "content": "Tell me about batching. " * 20}]
    async with session.post(f"{url}/v1/chat/completions", json={"messages": turn1, "max_tokens": 64}) as r:
        reply = (await r.json())["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    async with session.post(f"{url}/v1/chat/completions", json={"messages": turn2, "max_tokens": 2}) as r:
        usage = (await r.json())["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= count_tokens(chat_to_prompt(turn1)) + 64 - 16


# ----------------------------------------------------------------------------------- other endpoints


async def test_models_and_health(session, url, cluster):
    async with session.get(f"{url}/v1/models") as r:
        body = await r.json()
    assert body["object"] == "list"
    assert [(card["id"], card["object"], card["max_model_len"]) for card in body["data"]] == [
        (MODEL, "model", 32768)
    ]
    async with session.get(f"{url}/health") as r:
        assert r.status == 200 and r.headers[POD_HEADER] == cluster.pods[0].name


async def test_metrics_use_vllm_names_and_move_under_load(session, url):
    before = await metrics(session, url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ):
        assert before[name] == 0.0, name
    assert before["vllm:cache_config_info"]["block_size"] == "16"
    assert before["vllm:cache_config_info"]["num_gpu_blocks"] == "29205"

    async def one(i: int) -> None:
        request = {"prompt": f"request {i} " * 100, "max_tokens": 60}
        async with session.post(f"{url}/v1/completions", json=request) as r:
            assert r.status == 200

    tasks = [asyncio.create_task(one(i)) for i in range(4)]
    busy = await wait_for_metric(session, url, "vllm:num_requests_running", lambda v: v == 4)
    assert busy["vllm:kv_cache_usage_perc"] > 0
    await asyncio.gather(*tasks)
    after = await metrics(session, url)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:generation_tokens_total"] == 240
    assert after["vllm:prompt_tokens_total"] == after["vllm:prefix_cache_queries_total"] > 0
    for histogram in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert after[f"vllm:{histogram}_seconds_count"] == 4
    assert after["vllm:time_to_first_token_seconds_sum"] > 0


async def test_pods_are_independent(session, cluster):
    names = set()
    for address in cluster.addresses:
        async with session.post(
            f"http://{address}/v1/completions", json={"prompt": "hi", "max_tokens": 1}
        ) as r:
            names.add(r.headers[POD_HEADER])
    assert names == {pod.name for pod in cluster.pods} and len(names) == 2
    assert len(set(cluster.addresses)) == 2


# --------------------------------------------------------------------------------------- bad requests


LONG = "x" * (4 * 32768)
BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"\xff\xfe", 400, None),
    ("/v1/completions", json.dumps([1, 2]).encode(), 400, None),
    ("/v1/completions", {"model": 5, "prompt": "hi"}, 400, "model"),
    ("/v1/completions", {"model": "other-model", "prompt": "hi"}, 404, "model"),
    ("/v1/chat/completions", {"model": "other-model", "messages": CHAT}, 404, "model"),
    ("/v1/completions", {"max_tokens": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["two", "prompts"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
    ("/v1/chat/completions", {"max_tokens": 5}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "messages"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (
        "/v1/completions",
        {"prompt": "hi", "stream": True, "stream_options": {"include_usage": 1}},
        400,
        "stream_options",
    ),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "priority": "1"}, 400, "priority"),
    ("/v1/completions", {"prompt": "hi", "priority": 1.5}, 400, "priority"),
    ("/v1/completions", {"prompt": "hi", "priority": True}, 400, "priority"),
    ("/v1/chat/completions", {"messages": CHAT, "priority": [1]}, 400, "priority"),
    ("/v1/completions", {"prompt": "hi", "priority": 3}, 400, "priority"),  # fcfs: only 0
    ("/v1/chat/completions", {"messages": CHAT, "priority": -1}, 400, "priority"),
    ("/v1/completions", {"prompt": LONG}, 400, "prompt"),
    ("/v1/completions", {"prompt": LONG[: 4 * 32000], "max_tokens": 1000}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
async def test_bad_requests_get_openai_errors(session, url, cluster, path, body, status, param):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        assert r.headers[POD_HEADER] == cluster.pods[0].name
        error = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert cluster.pods[0].engine.num_running == 0


async def test_context_length_message_matches_vllm(session, url):
    async with session.post(
        f"{url}/v1/completions", json={"prompt": LONG[: 4 * 32000], "max_tokens": 1000}
    ) as r:
        message = (await r.json())["error"]["message"]
    assert message.startswith(
        "This model's maximum context length is 32768 tokens. However, you requested 33000"
    )


async def test_priority_on_an_fcfs_server_is_refused_with_vllms_message(session, url):
    async with session.post(f"{url}/v1/completions", json={"prompt": "hi", "priority": 3}) as r:
        assert r.status == 400
        message = (await r.json())["error"]["message"]
    assert message == "Got priority 3 but Priority scheduling is not enabled."
    async with session.post(f"{url}/v1/completions", json={"prompt": "hi", "priority": 0}) as r:
        assert r.status == 200  # the default priority is always accepted


async def test_a_priority_queue_server_serves_a_high_priority_request_first(session):
    # One seat: a long request holds it while three low-priority requests queue, then a high-priority one.
    profile = apply_variant(get_profile("llama3-8b-h100"), "priority-queue,max-seqs=1")
    async with await start_pods(1, 0, profile) as pod:
        url = f"http://{pod.addresses[0]}"
        done: list[str] = []

        async def send(name: str, priority: int, max_tokens: int) -> None:
            body = {"prompt": f"request {name}", "max_tokens": max_tokens, "priority": priority}
            async with session.post(f"{url}/v1/completions", json=body) as r:
                assert r.status == 200
                await r.read()
            done.append(name)

        tasks = [asyncio.create_task(send("blocker", 0, 120))]  # ~0.9 s
        await wait_for_metric(session, url, "vllm:num_requests_running", lambda v: v == 1)
        tasks += [asyncio.create_task(send(f"low-{i}", 10, 4)) for i in range(3)]
        await wait_for_metric(session, url, "vllm:num_requests_waiting", lambda v: v == 3)
        tasks.append(asyncio.create_task(send("high", -5, 4)))
        await wait_for_metric(session, url, "vllm:num_requests_waiting", lambda v: v == 4)
        await asyncio.gather(*tasks)
    assert done[:2] == ["blocker", "high"] and sorted(done[2:]) == ["low-0", "low-1", "low-2"]


async def timed_completion(session, url: str, max_tokens: int) -> float:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    async with session.post(
        f"{url}/v1/completions", json={"prompt": "x" * 64, "max_tokens": max_tokens}
    ) as r:
        assert r.status == 200
        assert (await r.json())["usage"]["completion_tokens"] == max_tokens
    return loop.time() - sent


async def test_a_stalling_pod_pauses_in_real_time(session):
    # Pauses of 50 ms after about every millisecond of work: the one ~7 ms step of a 1-token completion
    # (normally ~15 ms in all) meets about seven.
    profile = apply_variant(get_profile("llama3-8b-h100"), "stall-every-s=0.001,stall-ms=50:50")
    async with await start_pods(1, 0, profile) as pod:
        elapsed = await timed_completion(session, f"http://{pod.addresses[0]}", 1)
    assert elapsed >= 0.05


async def test_a_slow_pod_steps_slower_in_real_time(session):
    # A slow period starts about a millisecond after the pod and lasts for the whole test: steps take 20x.
    profile = apply_variant(get_profile("llama3-8b-h100"), "slow-factor=20,slow-for-s=600,slow-every-s=0.001")
    async with await start_pods(1, 0, profile) as pod:
        elapsed = await timed_completion(session, f"http://{pod.addresses[0]}", 3)
    assert elapsed >= 0.25  # two decode steps of ~7 ms at least, times 20


# ----------------------------------------------------------------------------------------- disconnects


async def test_client_disconnect_mid_stream_frees_the_sequence(url, cluster):
    engine = cluster.pods[0].engine
    async with aiohttp.ClientSession() as client:
        request = {"prompt": "long story " * 50, "max_tokens": 5000, "stream": True}
        response = await client.post(f"{url}/v1/completions", json=request)
        first = await response.content.readline()
        assert first.startswith(b"data: ")
        assert engine.num_running == 1 and engine.kv_usage > 0
        response.close()
    async with aiohttp.ClientSession() as session:
        await wait_for_metric(session, url, "vllm:num_requests_running", lambda v: v == 0)
    assert engine.kv_usage == 0 and not engine.has_work()


async def test_client_disconnect_while_waiting_for_json_frees_the_sequence(url, cluster):
    engine = cluster.pods[0].engine
    async with aiohttp.ClientSession() as client:
        request = client.post(f"{url}/v1/completions", json={"prompt": "wait " * 50, "max_tokens": 5000})
        task = asyncio.create_task(request)
        for _ in range(250):
            if engine.num_running:
                break
            await asyncio.sleep(0.02)
        assert engine.num_running == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for _ in range(250):
        if not engine.has_work():
            break
        await asyncio.sleep(0.02)
    assert engine.num_running == 0 and engine.kv_usage == 0


# --------------------------------------------------------------------------------------------- startup


async def test_start_pods_validates_arguments():
    with pytest.raises(ValueError):
        await start_pods(0, 0, "llama3-8b-h100")
    with pytest.raises(ValueError, match="valid profiles"):
        await start_pods(1, 0, "no-such-profile")
    with pytest.raises(ValueError):
        await start_pods(2, 65535, "instant")


async def test_start_pods_on_a_busy_port_fails_cleanly():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError):
            await start_pods(1, port, "instant")


async def test_instant_pods_with_a_custom_model_name(session):
    async with await start_pods(3, 0, "instant", model="tiny", seed=5) as cluster:
        assert [pod.model for pod in cluster.pods] == ["tiny"] * 3
        for address in cluster.addresses:
            request = {"model": "tiny", "prompt": "fast", "max_tokens": 50, "stream": True}
            async with session.post(f"http://{address}/v1/completions", json=request) as r:
                events = await sse_events(r)
            assert len(events) == 51


async def test_close_with_requests_in_flight_aborts_them():
    cluster = await start_pods(1, 0, "llama3-8b-h100")
    engine = cluster.pods[0].engine
    url = f"http://{cluster.addresses[0]}/v1/completions"
    async with aiohttp.ClientSession() as client:
        streamed = await client.post(url, json={"prompt": "a", "max_tokens": 5000, "stream": True})
        await streamed.content.readline()
        waiting = asyncio.create_task(client.post(url, json={"prompt": "b", "max_tokens": 5000}))
        for _ in range(250):
            if engine.num_running == 2:
                break
            await asyncio.sleep(0.02)
        assert engine.num_running == 2
        await asyncio.wait_for(cluster.close(), timeout=10)
        assert not engine.has_work() and engine.kv_usage == 0
        streamed.close()
        with contextlib.suppress(aiohttp.ClientError):
            await waiting


async def test_late_metrics_pod_reports_running_requests_after_the_delay(session):
    profile = apply_variant(get_profile("llama3-8b-h100"), "metrics-delay-ms=300")
    async with await start_pods(1, 0, profile) as late:
        url = f"http://{late.addresses[0]}"
        body = {"prompt": "x" * 400, "max_tokens": 400}  # ~2 s of decoding
        task = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
        loop = asyncio.get_running_loop()
        sent = loop.time()
        while late.pods[0].engine.num_running == 0:
            await asyncio.sleep(0.005)
        assert (await metrics(session, url))["vllm:num_requests_running"] == 0  # not shown yet
        await wait_for_metric(session, url, "vllm:num_requests_running", lambda v: v == 1, timeout=2.0)
        assert loop.time() - sent >= 0.3
        (await task).close()
