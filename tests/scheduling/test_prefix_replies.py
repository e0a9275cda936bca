"""The approximate prefix index follows replies (``indexResponses``): a conversation's next turn matches the
whole history on the endpoint that generated the reply."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from slorouter.scheduling.plugin import ResponseInfo, Termination
from slorouter.scheduling.plugins.prefix.approx import ApproxPrefixCacheParams
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_seed
from tests.helpers.scheduling import addresses, candidates_of, make_pool, make_request, producer, result_for

BLOCK = 64  # 16 tokens × 4 characters


def dispatch(prod, pool, prompt: str, target: str):
    request = make_request(prompt)
    prod.produce(request, candidates_of(pool))
    prod.pre_request(request, result_for(pool.get(target)))
    return request


def finish(
    prod,
    pool,
    request,
    target: str,
    history: str | None,
    cause: Termination = Termination.COMPLETE,
    status=200,
) -> None:
    response = ResponseInfo(endpoint=pool.get(target), status=status, cause=cause, history_text=history)
    prod.on_response_body(request, response, start_of_stream=False, end_of_stream=True)


def matched_blocks(prod, pool, prompt: str) -> dict[str, int]:
    request = make_request(prompt)
    prod.produce(request, candidates_of(pool))
    return request.state[prod.state_key].matched


def test_next_turn_matches_the_reply_on_the_endpoint_that_generated_it():
    pool = make_pool(2)
    a = addresses(2)
    prod = producer(pool=pool)
    first = "system prompt and first question. " * 5  # 170 characters: 2 full blocks and a tail
    reply = "the model's answer, long enough to fill blocks. " * 6
    request = dispatch(prod, pool, first, a[1])
    finish(prod, pool, request, a[1], first + reply)

    follow_up = first + reply + "and the second question?"
    blocks = len(prefix_block_hashes(follow_up.encode(), prefix_seed("m"), BLOCK, 256))
    assert matched_blocks(prod, pool, follow_up) == {a[1]: len((first + reply).encode()) // BLOCK}
    assert blocks > len((first + reply).encode()) // BLOCK

    # Without reply indexing only the first prompt's full blocks match.
    plain = producer(pool=pool, indexResponses=False)
    request = dispatch(plain, pool, first, a[1])
    assert plain.reply_chars_wanted(request) == 0
    finish(plain, pool, request, a[1], first + reply)
    assert matched_blocks(plain, pool, follow_up) == {a[1]: len(first) // BLOCK}


def test_history_hashes_equal_hashing_the_history_from_scratch():
    pool = make_pool(1)
    (a,) = addresses(1)
    for prompt_len in (63, 64, 128, 130):  # tail or not, and a history that diverges inside the last block
        for history_suffix in ("", "x" * 10, "y" * 200):
            prod = producer(pool=pool)
            prompt = "p" * (prompt_len - 1) + "]"
            request = dispatch(prod, pool, prompt, a)
            history = prompt[:-1] + ',"reply":"' + history_suffix + '"]'
            finish(prod, pool, request, a, history)
            expected = prefix_block_hashes(history.encode(), prefix_seed("m"), BLOCK, 256)
            assert prod.index.match(expected) == {a: len(expected)}


def test_reply_chars_wanted_is_what_the_hashed_prefix_has_room_for():
    pool = make_pool(1)
    (a,) = addresses(1)
    prod = producer(pool=pool, maxPrefixBlocksToMatch=4)
    for prompt, wanted in (("q" * 100, 4 * BLOCK - 100), ("q" * 300, 0), ("é" * 50, 4 * BLOCK - 100)):
        assert prod.reply_chars_wanted(dispatch(prod, pool, prompt, a)) == wanted  # UTF-8 bytes


def test_the_index_never_records_more_than_the_cap():
    pool = make_pool(1)
    (a,) = addresses(1)
    prod = producer(pool=pool, maxPrefixBlocksToMatch=4)
    request = dispatch(prod, pool, "q" * 100, a)
    finish(prod, pool, request, a, "q" * 100 + "r" * 1000)
    assert prod.index.server_size(a) <= 4 + 2  # the prompt's 2 blocks, then the 4 blocks of the history


@pytest.mark.parametrize(("cause", "status"), [(Termination.COMPLETE, 500), (Termination.CLIENT_GONE, 200)])
def test_failed_responses_and_missing_history_index_nothing_more(cause, status):
    pool = make_pool(1)
    (a,) = addresses(1)
    prod = producer(pool=pool)
    prompt = "s" * 130
    request = dispatch(prod, pool, prompt, a)
    size = prod.index.server_size(a)
    finish(prod, pool, request, a, prompt + "r" * 500, cause, status)
    finish(prod, pool, request, a, None)
    assert prod.index.server_size(a) == size


def test_chat_history_in_the_gateways_form_matches_the_next_turn():
    pool = make_pool(2)
    a = addresses(2)
    prod = producer(pool=pool)
    messages = [
        {"role": "system", "content": "You are terse. " * 10},
        {"role": "user", "content": "Hi " * 30},
    ]
    prompt = json.dumps(messages, separators=(",", ":"), ensure_ascii=False)
    reply = "Hello! " * 40
    request = dispatch(prod, pool, prompt, a[0])
    history = prompt[:-1] + ',{"role":"assistant","content":' + json.dumps(reply, ensure_ascii=False) + "}"
    finish(prod, pool, request, a[0], history)
    follow_up = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}]
    next_prompt = json.dumps(follow_up, separators=(",", ":"), ensure_ascii=False)
    assert next_prompt.startswith(history)
    assert matched_blocks(prod, pool, next_prompt) == {a[0]: len(history.encode()) // BLOCK}


def test_index_responses_must_be_a_boolean():
    with pytest.raises(ValidationError, match="indexResponses"):
        ApproxPrefixCacheParams.model_validate({"indexResponses": "sometimes"})
    assert np.bool_(ApproxPrefixCacheParams().index_responses)


def test_a_hedge_copy_is_recorded_where_it_went_only_once_it_answers():
    """A hedge's copy that lost while it queued computed nothing there: its dispatch records nothing (and so
    evicts nothing the endpoint held). A copy that answered first computed its prompt: recorded then."""
    pool = make_pool(2)
    a = addresses(2)
    prod = producer(pool=pool)
    shared = "a shared system prompt, long enough for blocks. " * 3  # 2 full blocks
    finish(prod, pool, dispatch(prod, pool, shared, a[0]), a[0], None)
    prompt = shared + "and a question of its own, long enough too. " * 3
    held = matched_blocks(prod, pool, prompt)[a[0]]
    assert held == len(shared.encode()) // BLOCK
    whole = len(prefix_block_hashes(prompt.encode(), prefix_seed("m"), BLOCK, 256))

    def copy_to(target: str):
        request = make_request(prompt)
        request.hedge_copy = True
        prod.produce(request, candidates_of(pool))
        prod.pre_request(request, result_for(pool.get(target)))
        return request

    lost = copy_to(a[0])
    assert matched_blocks(prod, pool, prompt) == {a[0]: held}
    response = ResponseInfo(endpoint=pool.get(a[0]), status=0, cause=Termination.CANCELLED)
    prod.on_response_body(lost, response, start_of_stream=False, end_of_stream=True)
    assert matched_blocks(prod, pool, prompt) == {a[0]: held}

    won = copy_to(a[1])
    assert a[1] not in matched_blocks(prod, pool, prompt)
    response = ResponseInfo(endpoint=pool.get(a[1]), status=200, first_token_at=1.0)
    prod.on_response_body(won, response, start_of_stream=True, end_of_stream=False)
    assert matched_blocks(prod, pool, prompt) == {a[0]: held, a[1]: whole}
