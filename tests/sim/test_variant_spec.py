"""The engine-variant spec: parsing, composition, canonical form and errors (slorouter.sim.variants)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slorouter.sim.profiles import LLAMA3_8B_H100, QWEN3_32B_H100_TP2
from slorouter.sim.scheduler import POLICIES
from slorouter.sim.variants import (
    KEYS,
    NAMED_VARIANTS,
    QUEUES,
    SCALE_KEYS,
    EngineVariant,
    VariantError,
    parse_variant,
)

factors = st.floats(min_value=0.01, max_value=100, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=1, max_value=1_000_000)
delays = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)

variants = st.builds(
    EngineVariant,
    scale=st.tuples(*[st.one_of(st.just(1.0), factors)] * len(SCALE_KEYS)),
    scheduler=st.none() | st.sampled_from(sorted(POLICIES)),
    batch_tokens=st.none() | counts,
    max_seqs=st.none() | counts,
    chunk=st.none() | counts,
    kv_blocks=st.none() | counts,
    metrics_delay_ms=st.none() | delays,
    metrics_period_ms=st.none() | delays,
    kv_usage_step=st.none() | st.floats(min_value=0, max_value=1),
    queue=st.none() | st.sampled_from(QUEUES),
    stall_every_s=st.none() | factors,
    stall_ms=st.none() | st.tuples(delays, delays).map(sorted).filter(lambda r: r[1] > 0).map(tuple),
    slow_factor=st.none() | factors,
    slow_for_s=st.none() | factors,
    slow_every_s=st.none() | factors,
)


@given(variants)
def test_the_canonical_spec_parses_back_to_the_same_variant(variant):
    assert parse_variant(variant.spec()) == variant


@given(st.lists(st.sampled_from(sorted(NAMED_VARIANTS)), max_size=5))
def test_a_list_of_named_variants_is_the_composition_of_its_items(names):
    composed = EngineVariant()
    for name in names:
        composed = composed.then(parse_variant(name))
    assert parse_variant(",".join(names)) == composed
    assert parse_variant(" , ".join(names)) == composed  # whitespace does not matter


@given(st.lists(factors, min_size=1, max_size=4), st.sampled_from(SCALE_KEYS))
def test_multipliers_multiply(values, key):
    variant = parse_variant(",".join(f"{key}={v!r}" for v in values))
    product = 1.0
    for v in values:
        product *= v
    assert variant.scale[SCALE_KEYS.index(key)] == pytest.approx(product)


@given(st.sampled_from(["batch-tokens", "max-seqs", "chunk", "kv-blocks"]), counts, counts)
def test_other_keys_take_the_last_value(key, first, second):
    variant = parse_variant(f"{key}={first},{key}={second}")
    assert parse_variant(f"{key}={second}") == variant


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12))
def test_an_unknown_name_or_key_is_named_in_the_error(word):
    if word in NAMED_VARIANTS:
        return
    with pytest.raises(VariantError, match=f"unknown variant '{word}'"):
        parse_variant(word)
    if word not in KEYS:
        with pytest.raises(VariantError, match=f"unknown key '{word}'"):
            parse_variant(f"decode-priority,{word}=1")


@given(st.sampled_from(KEYS), st.sampled_from(["", "x", "-1", "nan", "inf", "1e999", "0x10", "2.5.1"]))
def test_a_bad_value_is_an_error_naming_the_item(key, text):
    valid = {"scheduler": False}.get(key, True)
    try:
        parse_variant(f"{key}={text}")
    except VariantError as exc:
        assert f"{key}={text}" in str(exc)
    else:
        assert valid and key in ("metrics-delay-ms", "metrics-period-ms") and text == "", text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("w=0", "'w=0': must be a finite number > 0"),
        ("kv-usage-step=1.5", "must be between 0 and 1"),
        ("batch-tokens=2.5", "must be a whole number"),
        ("scheduler=sglang", "unknown scheduler (known: vllm, decode-priority, prefill-priority)"),
        ("slow-gpu,,w=2", "empty item between commas"),
        ("queue=lifo", "unknown queue (known: fcfs, priority)"),
        ("stall-ms=300", "'stall-ms=300': must be LO:HI (milliseconds)"),
        ("stall-ms=3000:300", "must be LO:HI with 0 <= LO <= HI and HI > 0"),
        ("stall-ms=0:0", "must be LO:HI with 0 <= LO <= HI and HI > 0"),
        ("stall-ms=a:300", "'stall-ms=a:300': not a number"),
        ("stall-every-s=0", "'stall-every-s=0': must be a finite number > 0"),
        ("slow-factor=-2", "must be a finite number > 0"),
    ],
)
def test_errors_name_the_problem(spec, message):
    with pytest.raises(VariantError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_variant(spec)


def test_apply_checks_what_vllm_would_refuse():
    with pytest.raises(VariantError, match=r"batch-tokens \(128\) must be at least max-seqs \(256\)"):
        parse_variant("batch-tokens=128").apply(LLAMA3_8B_H100)
    with pytest.raises(VariantError, match="cannot hold one request of max_model_len"):
        parse_variant("kv-memory=0.01").apply(QWEN3_32B_H100_TP2)
    assert parse_variant("batch-tokens=128,max-seqs=64").apply(LLAMA3_8B_H100).max_num_seqs == 64


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("stall-every-s=5", "stall-every-s needs stall-ms as well"),
        ("stall-ms=10:20", "stall-ms needs stall-every-s as well"),
        ("slow-factor=2", "slow-factor needs slow-for-s, slow-every-s as well"),
        ("slow-for-s=2,slow-every-s=5", "slow-for-s, slow-every-s needs slow-factor as well"),
    ],
)
def test_apply_wants_the_keys_of_a_stall_or_slowdown_together(spec, message):
    with pytest.raises(VariantError, match=message):
        parse_variant(spec).apply(LLAMA3_8B_H100)


def test_the_queue_stall_and_slowdown_variants_set_their_profile_fields():
    priority = parse_variant("priority-queue").apply(LLAMA3_8B_H100)
    assert priority.scheduling_policy == "priority" and LLAMA3_8B_H100.scheduling_policy == "fcfs"
    stalls = parse_variant("stalls").apply(LLAMA3_8B_H100)
    assert (stalls.stall_every_s, stalls.stall_ms) == (15.0, (300.0, 3000.0))
    slow = parse_variant("slowdowns").apply(LLAMA3_8B_H100)
    assert (slow.slow_factor, slow.slow_for_s, slow.slow_every_s) == (3.0, 60.0, 90.0)
    # Later items win, as for every other setting; named variants compose with keys.
    assert parse_variant("stalls,stall-ms=5:10").apply(LLAMA3_8B_H100).stall_ms == (5.0, 10.0)
    assert parse_variant("stalls,slowdowns,priority-queue").spec() == (
        "queue=priority,stall-every-s=15.0,stall-ms=300.0:3000.0,slow-factor=3.0,slow-for-s=60.0,"
        "slow-every-s=90.0"
    )


def test_kv_blocks_and_kv_memory_replace_each_other():
    assert parse_variant("kv-blocks=5000,kv-memory=0.5").apply(LLAMA3_8B_H100).num_gpu_blocks == 14602
    assert parse_variant("kv-memory=0.5,kv-blocks=5000").apply(LLAMA3_8B_H100).num_gpu_blocks == 5000


def test_named_variants_are_all_valid_on_every_real_profile():
    for name in NAMED_VARIANTS:
        for profile in (LLAMA3_8B_H100, QWEN3_32B_H100_TP2):
            assert parse_variant(name).apply(profile).name == f"{profile.name}@{name}"
