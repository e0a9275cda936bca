"""precise-prefix-cache-producer against real vLLM pods (``hash: vllm``): the model's tokenizer and chat
template, vLLM's block hashes (checked against vLLM's own, ``tests/kvevents/vllm_vectors``), the parameters'
errors, and vLLM-format KV events over ZMQ steering the scorer to the pod that holds the prompt."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from slorouter.api.replies import CHAT
from slorouter.kvevents.wire import BlockStored, KVEventBatch, seq_frame
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import KVEventSubscriber, PublisherAddress
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.scheduling.datakeys import PREFIX_MATCH_BLOCKS, PREFIX_MATCH_FROM_EVENTS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.scheduling.plugins.prefix.precise import (
    PrecisePrefixCacheParams,
    PrecisePrefixCacheProducer,
    PrecisePrefixCacheScorer,
)
from slorouter.scheduling.types import CycleState
from tests.helpers.scheduling import addresses, candidates_of, make_pool, make_request
from tests.helpers.vllm_prompts import (
    COMPLETION,
    MESSAGES,
    chat_request,
    e2e_cases,
    model_dir,
    params,
    producer_of,
)

from ..hftokenizer import tiny
from ..kvevents.vllm_vectors import Case, recorded

CHAT_CASE, SALTED_CASE, COMPLETION_CASE = e2e_cases()


def test_prompts_are_tokenized_with_the_models_tokenizer_and_template() -> None:
    hashing = producer_of().pod_hashing
    assert CHAT_CASE.token_ids == hashing.tokenizer.chat_token_ids(MESSAGES)  # type: ignore[attr-defined]
    assert CHAT_CASE.token_ids[0] == tiny.vocabulary()["<|im_start|>"]  # the template's, no BOS added
    assert COMPLETION_CASE.token_ids[0] == tiny.vocabulary()["<s>"]  # the post-processor's BOS
    assert len(CHAT_CASE.token_ids) >= 80 and len(COMPLETION_CASE.token_ids) == 94


@pytest.mark.parametrize("case", [CHAT_CASE, SALTED_CASE, COMPLETION_CASE], ids=lambda c: c.name)
def test_the_producers_hashes_are_vllms(case: Case) -> None:
    seeds = {"hashAlgorithm": case.algorithm} | ({} if case.seed is None else {"hashSeed": case.seed})
    lora = {"loraAdapters": {case.lora[0]: case.lora[1]}} if case.lora else {}
    producer = producer_of(**seeds, **lora)
    fields: dict[str, Any] = {"cache_salt": case.cache_salt or ""}
    if case.lora:
        fields["model"] = case.lora[0]
    request = (
        chat_request(**fields) if case.name.startswith("e2e-chat") else make_request(COMPLETION, **fields)
    )
    hashes = producer.pod_hashing.prompt(request)
    assert hashes is not None
    assert hashes(case.block_size) == recorded(case).event_hashes


def test_a_prompt_the_pods_tokenize_otherwise_keeps_the_approximate_estimate() -> None:
    index = KVBlockIndex()
    producer = producer_of(index=index, hashAlgorithm="sha256_cbor", hashSeed="0")
    address = addresses(3)[0]
    store_ints(index, address, recorded(CHAT_CASE).event_hashes)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    request = make_request(json.dumps(image), history_form=CHAT)
    candidates = candidates_of(producer.ctx.pool)  # type: ignore[arg-type]
    producer.produce(request, candidates)
    assert candidates.attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [False, False, False]


def store_ints(index: KVBlockIndex, address: str, hashes: list[int]) -> None:
    index.apply(address, KVEventBatch(0.0, [BlockStored(hashes, None, [], 16, None, "GPU", None)]))


# --- parameters -------------------------------------------------------------------------------------------


def scheduler_config(parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "precise-prefix-cache-producer", "parameters": parameters},
            {"type": "precise-prefix-cache-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}],
            }
        ],
    }


def build(parameters: dict[str, Any]) -> None:
    build_scheduler_setup(
        scheduler_config(parameters), PluginContext(pool=make_pool(1), kv_index=KVBlockIndex())
    )


def test_the_config_builds_with_a_tokenizer_file_or_directory() -> None:
    build(params())
    build(params(tokenizer=str(model_dir() / "tokenizer.json"), hashAlgorithm="xxhash_cbor", hashSeed="7"))


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"hash": "vllm"}, "hash: vllm needs tokenizer"),
        ({"tokenizer": "/m"}, "tokenizer only apply with hash: vllm"),
        ({"hash": "vllm", "tokenizer": "/nonexistent/model"}, "tokenizer '/nonexistent/model': cannot load"),
        (params(hashAlgorithm="md5"), "hashAlgorithm"),
        (params(hashAlgorithm="xxhash"), "hashSeed: xxhash pods without PYTHONHASHSEED"),
        (params(chatTemplate="/nonexistent/t.jinja"), "chatTemplate '/nonexistent/t.jinja': cannot load"),
    ],
)
def test_unusable_parameters_are_config_errors_naming_the_key(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchedulerConfigError) as raised:
        build(parameters)
    assert "plugins[0]" in str(raised.value)
    assert message in str(raised.value)


def test_a_broken_tokenizer_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(
        SchedulerConfigError, match=r"tokenizer .*: cannot load: .*tokenizer\.json: not a tokenizer"
    ):
        build(params(tokenizer=str(tmp_path)))


# --- end to end: vLLM-format events over ZMQ ---------------------------------------------------------------


def vllm_batch(block_hashes: list[Any], token_ids: list[int], seq_ts: float) -> bytes:
    """A ``KVEventBatch`` as vLLM 0.33 encodes it: a positional batch of tagged-map events (all fields)."""
    event = {
        "type": "BlockStored",
        "block_hashes": block_hashes,
        "parent_block_hash": None,
        "token_ids": token_ids,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
        "locality": None,
        "ownership": None,
        "session_id": None,
    }
    return msgspec.msgpack.encode([seq_ts, [event], None])


async def test_a_vllm_pods_events_over_zmq_make_the_scorer_prefer_it() -> None:
    case = CHAT_CASE
    vllm = recorded(case)
    total = len(vllm.event_hashes)
    assert total >= 5
    pods = addresses(3)
    # Pod 0 sends vLLM's default int hashes for the whole prompt; pod 1 the digests' bytes
    # (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) for its first two blocks; pod 2 publishes nothing of it.
    # Stamped with the wall clock, as vLLM does: an older timestamp would make the pods' events late.
    payloads = [
        vllm_batch(vllm.event_hashes, case.token_ids[: total * 16], time.time()),
        vllm_batch(vllm.digests[:2], case.token_ids[:32], time.time()),
    ]
    context = zmq.asyncio.Context()
    sockets = []
    index = KVBlockIndex()
    subscribers = []
    try:
        for pod in pods[:2]:
            socket = context.socket(zmq.PUB)
            socket.bind("tcp://127.0.0.1:*")
            sockets.append(socket)
            endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
            subscriber = KVEventSubscriber(pod, PublisherAddress(endpoint), index, reconnect_s=0.05)
            subscriber.start()
            subscribers.append(subscriber)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        seq = 0
        while not (index.num_blocks(pods[0]) == total and index.num_blocks(pods[1]) == 2):
            assert loop.time() < deadline, "the events never reached the index"
            for socket, payload in zip(sockets, payloads, strict=True):
                await socket.send_multipart([f"kv@{seq}@tiny".encode(), seq_frame(seq), payload])
            seq += 1
            await asyncio.sleep(0.05)

        producer = producer_of(index=index, hashAlgorithm=case.algorithm, hashSeed=case.seed)
        request = chat_request()
        candidates = candidates_of(producer.ctx.pool)  # type: ignore[arg-type]
        producer.produce(request, candidates)
        attrs = candidates.attrs
        assert attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [True, True, False]
        assert attrs[PREFIX_MATCH_BLOCKS].tolist()[:2] == [total, 2]
        assert attrs[PREFIX_TOTAL_BLOCKS].tolist()[:2] == [total, total]
        scorer = PrecisePrefixCacheScorer("s", PrecisePrefixCacheScorer.Params(), producer.ctx)
        assert scorer.score(CycleState(), request, candidates).tolist() == [1.0, 2 / total, 0.0]

        # The same pods seen by a router hashing as the simulator does: nothing matches.
        sim = PrecisePrefixCacheProducer("sim", PrecisePrefixCacheParams(), producer.ctx)
        candidates = candidates_of(producer.ctx.pool)  # type: ignore[arg-type]
        sim.produce(request, candidates)
        assert candidates.attrs[PREFIX_MATCH_BLOCKS].tolist()[:2] == [0, 0]
    finally:
        for subscriber in subscribers:
            await subscriber.stop()
        for socket in sockets:
            socket.close(linger=0)
        context.term()
