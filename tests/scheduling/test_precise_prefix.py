"""precise-prefix-cache-producer / -scorer: every rule (events per pod, the pod's block size and hashes,
the approximate fallback, speculative entries, cached tokens at dispatch, the loader's wiring)."""

from __future__ import annotations

import json

import numpy as np

from slorouter.api.replies import CHAT
from slorouter.clock import ManualClock
from slorouter.kvevents.sim_hash import block_hashes
from slorouter.kvevents.wire import BlockStored, KVEventBatch
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason
from slorouter.pool.state import MetricsSnapshot, PoolState
from slorouter.scheduling.datakeys import (
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_MATCH_FROM_EVENTS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, ResponseInfo, Termination
from slorouter.scheduling.plugins.prefix.pod_hashing import pod_token_bytes
from slorouter.scheduling.plugins.prefix.precise import (
    PrecisePrefixCacheParams,
    PrecisePrefixCacheProducer,
    PrecisePrefixCacheScorer,
)
from slorouter.scheduling.types import CycleState, InferenceRequest
from slorouter.tokenizer import chat_to_prompt, encode_bytes
from tests.helpers.scheduling import addresses, candidates_of, make_pool, make_request, result_for

PROMPT = "system prompt " * 40 + "question"  # 568 bytes: 8 blocks of 16 tokens, 2 of 64 tokens


def setup(
    n: int = 3, **params: object
) -> tuple[PrecisePrefixCacheProducer, PoolState, KVBlockIndex, ManualClock]:
    pool = make_pool(n, block_size=[16] * n)
    index = KVBlockIndex()
    clock = ManualClock(0.0)
    ctx = PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool, kv_index=index)
    producer = PrecisePrefixCacheProducer("p", PrecisePrefixCacheParams.model_validate(params), ctx)
    return producer, pool, index, clock


def store(index: KVBlockIndex, address: str, hashes: list[int], block_size: int = 16) -> None:
    index.apply(address, KVEventBatch(0.0, [BlockStored(hashes, None, [], block_size, None, "GPU", None)]))


def produce(producer: PrecisePrefixCacheProducer, pool: PoolState, request: InferenceRequest):  # type: ignore[no-untyped-def]
    candidates = candidates_of(pool)
    producer.produce(request, candidates)
    return candidates


def test_publishing_pods_match_their_real_blocks_with_their_hash_chain() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    hashes = block_hashes(encode_bytes(PROMPT), 16)
    assert len(hashes) == 8
    store(index, a[0], hashes[:5])
    store(index, a[1], [*hashes[:5], 123])  # diverges at block 6
    candidates = produce(producer, pool, make_request(PROMPT))
    attrs = candidates.attrs
    assert attrs[PREFIX_MATCH_BLOCKS].tolist()[:2] == [5, 5]
    assert attrs[PREFIX_TOTAL_BLOCKS].tolist()[:2] == [8, 8]
    assert attrs[PREFIX_BLOCK_SIZE_TOKENS].tolist()[:2] == [16, 16]
    assert attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [True, True, False]


def test_pods_that_publish_nothing_keep_the_approximate_estimate() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    store(index, a[0], [1])  # publishes, holds nothing of this prompt
    request = make_request(PROMPT)
    producer.index.insert(a[0], producer._request_state(request, 16).hashes, 100)  # the approximate index
    producer.index.insert(a[2], producer._request_state(request, 16).hashes, 100)  # thinks both hold it
    attrs = produce(producer, pool, request).attrs
    approx_total = len(producer._request_state(request, 16).hashes)
    assert attrs[PREFIX_MATCH_BLOCKS].tolist() == [0, 0, approx_total]  # a[0]: the real figure wins
    assert attrs[PREFIX_TOTAL_BLOCKS].tolist() == [8, approx_total, approx_total]
    assert attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [True, False, False]


def test_pods_whose_index_is_not_exact_keep_the_approximate_estimate_until_it_is() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    hashes = block_hashes(encode_bytes(PROMPT), 16)
    for address in a:
        store(index, address, hashes[:3])
    request = make_request(PROMPT)
    approx = producer._request_state(request, 16).hashes
    producer.index.insert(a[1], approx, 100)
    producer.index.insert(a[2], approx, 100)
    index.pod_trust(a[1]).gap_opened(0.0)  # degraded: a gap not yet replayed
    index.clear_pod(a[2], TrustReason.UNRECOVERED_GAP)  # rebuilding
    attrs = produce(producer, pool, request).attrs
    assert attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [True, False, False]
    assert attrs[PREFIX_MATCH_BLOCKS].tolist() == [3, len(approx), len(approx)]
    index.pod_trust(a[1]).gap_closed(0.1)
    assert produce(producer, pool, request).attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [True, True, False]


def test_without_an_index_everything_is_approximate() -> None:
    pool = make_pool(2, block_size=[16, 16])
    producer = PrecisePrefixCacheProducer("p", PrecisePrefixCacheParams(), PluginContext(pool=pool))
    attrs = produce(producer, pool, make_request(PROMPT)).attrs
    assert attrs[PREFIX_MATCH_FROM_EVENTS].tolist() == [False, False]
    assert attrs[PREFIX_TOTAL_BLOCKS].tolist() == [9, 9]  # the approximate chain: 64-character blocks


def test_each_pod_is_hashed_with_its_own_block_size() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    tokens = encode_bytes(PROMPT)
    store(index, a[0], block_hashes(tokens, 16)[:8])
    store(index, a[1], block_hashes(tokens, 64)[:2], block_size=64)
    store(index, a[2], [])  # published, no block size yet: the scraped one (16)
    attrs = produce(producer, pool, make_request(PROMPT)).attrs
    assert attrs[PREFIX_MATCH_BLOCKS].tolist() == [8, 2, 0]
    assert attrs[PREFIX_TOTAL_BLOCKS].tolist() == [8, 2, 8]
    assert attrs[PREFIX_BLOCK_SIZE_TOKENS].tolist() == [16, 64, 16]


def test_chat_prompts_are_hashed_as_the_server_renders_them() -> None:
    messages = [{"role": "system", "content": "be brief " * 30}, {"role": "user", "content": "hi"}]
    request = make_request(json.dumps(messages), history_form=CHAT)
    assert pod_token_bytes(request) == encode_bytes(chat_to_prompt(messages))
    broken = make_request("[not json", history_form=CHAT)
    assert pod_token_bytes(broken) == encode_bytes("[not json")


def test_pre_request_reports_the_real_cached_tokens_and_speculates() -> None:
    producer, pool, index, clock = setup()
    a = addresses(3)
    hashes = block_hashes(encode_bytes(PROMPT), 16)
    store(index, a[0], hashes[:3])
    store(index, a[1], [])
    request = make_request(PROMPT, prompt_tokens=142)
    produce(producer, pool, request)
    outcome = producer.pre_request(request, result_for(pool.get(a[0])))
    assert outcome is not None and outcome.cached_prompt_tokens == 48  # 3 blocks × 16
    # The dispatched request's blocks now count on a[0] for the next request, before any event.
    assert index.match(hashes, [a[0], a[1]]) == {a[0]: 8, a[1]: 0}
    # Released speculativeGraceMs (1 s) after the first token.
    response = ResponseInfo(endpoint=pool.get(a[0]))
    producer.on_response_body(request, response, start_of_stream=True, end_of_stream=False)
    clock.set(0.5)
    produce(producer, pool, make_request(PROMPT, request_id="r2"))
    assert index.match(hashes, [a[0]]) == {a[0]: 8}
    clock.set(1.0)
    produce(producer, pool, make_request(PROMPT, request_id="r3"))
    assert index.match(hashes, [a[0]]) == {a[0]: 3}
    producer.on_response_body(
        request, response, start_of_stream=False, end_of_stream=True
    )  # no double release
    assert index.speculative_claims == 0


def test_a_failed_request_releases_its_claim_too() -> None:
    producer, pool, index, clock = setup()
    a = addresses(3)
    store(index, a[0], [])
    request = make_request(PROMPT)
    produce(producer, pool, request)
    producer.pre_request(request, result_for(pool.get(a[0])))
    assert index.speculative_claims == 8
    response = ResponseInfo(endpoint=pool.get(a[0]), cause=Termination.UPSTREAM_ERROR, detail="reset")
    producer.on_response_body(request, response, start_of_stream=False, end_of_stream=True)
    clock.set(2.0)
    produce(producer, pool, make_request(PROMPT, request_id="r2"))
    assert index.speculative_claims == 0


def test_speculation_can_be_switched_off() -> None:
    producer, pool, index, _ = setup(speculativeIndexing=False)
    a = addresses(3)
    store(index, a[0], [])
    request = make_request(PROMPT)
    produce(producer, pool, request)
    producer.pre_request(request, result_for(pool.get(a[0])))
    assert index.speculative_claims == 0


def test_a_fallback_target_gets_the_approximate_cached_tokens() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    store(index, a[0], [])
    request = make_request(PROMPT, prompt_tokens=142)
    producer.index.insert(a[2], producer._request_state(request, 16).hashes, 100)
    produce(producer, pool, request)
    outcome = producer.pre_request(request, result_for(pool.get(a[2])))
    assert outcome is not None and outcome.cached_prompt_tokens == 142
    assert index.speculative_claims == 0


def test_the_scorer_is_matched_over_total() -> None:
    producer, pool, index, _ = setup()
    a = addresses(3)
    hashes = block_hashes(encode_bytes(PROMPT), 16)
    store(index, a[0], hashes[:2])
    store(index, a[1], hashes)
    request = make_request(PROMPT)
    candidates = produce(producer, pool, request)
    scorer = PrecisePrefixCacheScorer("s", PrecisePrefixCacheScorer.Params(), producer.ctx)
    assert scorer.score(CycleState(), request, candidates).tolist() == [0.25, 1.0, 0.0]


def test_the_loader_adds_the_precise_producer_for_the_precise_scorer() -> None:
    pool = make_pool(2)
    pool.set_metrics(addresses(2)[0], MetricsSnapshot(block_size=16), at=0.0)
    config = {
        "plugins": [{"type": "precise-prefix-cache-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}],
            }
        ],
    }
    built = build_scheduler_setup(config, PluginContext(pool=pool, kv_index=KVBlockIndex()))
    assert [type(p).type_name for p in built.data_producers] == ["precise-prefix-cache-producer"]
    # ...while prefix-cache-scorer alone still gets the approximate one.
    config["plugins"][0]["type"] = "prefix-cache-scorer"  # type: ignore[index]
    config["schedulingProfiles"][0]["plugins"][0]["pluginRef"] = "prefix-cache-scorer"  # type: ignore[index]
    built = build_scheduler_setup(config, PluginContext(pool=pool))
    assert [type(p).type_name for p in built.data_producers] == ["approx-prefix-cache-producer"]
