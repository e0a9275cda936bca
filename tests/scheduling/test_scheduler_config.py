"""The EndpointPickerConfig loader: defaulting, validation errors that name the field, producer wiring."""

from __future__ import annotations

import re

import pytest

from slorouter.scheduling.config_schema import (
    SchedulerConfig,
    SchedulerConfigError,
    load_scheduler_config_file,
)
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.pipelines import DEFAULT_SCHEDULER_CONFIG
from slorouter.scheduling.plugins.inflight import InflightLoadProducer
from slorouter.scheduling.plugins.pickers import MaxScorePicker
from slorouter.scheduling.plugins.prefix.approx import ApproxPrefixCacheProducer
from slorouter.scheduling.plugins.profile_handlers import SingleProfileHandler
from tests.helpers.scheduling import make_ctx

from . import fake_plugins  # noqa: F401  (registers the test-* plugin types)


def build(config):
    return build_scheduler_setup(config, make_ctx())


def profile_summary(setup, name="default"):
    profile = setup.scheduler.profiles[name]
    return (
        [f.name for f in profile.filters],
        [(s.scorer.name, s.weight) for s in profile.scorers],
        profile.picker.name,
    )


def fails(config, message):
    with pytest.raises(SchedulerConfigError, match=re.escape(message)):
        build(config)


# --- the built-in default ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config", [None, {}, {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}]
)
def test_default_config(config):
    setup = build(config)
    assert setup.scheduler.profile_names == ["default"]
    assert profile_summary(setup) == (
        [],
        [("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)],
        "max-score-picker",
    )
    assert isinstance(setup.scheduler.profile_handler, SingleProfileHandler)
    assert setup.auto_created == [
        "single-profile-handler",
        "max-score-picker",
        "approx-prefix-cache-producer",
    ]
    (producer,) = setup.data_producers
    assert isinstance(producer, ApproxPrefixCacheProducer)
    assert setup.pre_request == [producer]
    assert setup.admitters == [] and setup.response_body_processors == [producer]  # it indexes replies
    assert list(setup.plugins) == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "single-profile-handler",
        "max-score-picker",
        "approx-prefix-cache-producer",
    ]


def test_default_config_constant_matches_the_original():
    weights = {
        r["pluginRef"]: r["weight"] for r in DEFAULT_SCHEDULER_CONFIG["schedulingProfiles"][0]["plugins"]
    }
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}


def test_effective_config_rebuilds_the_same_setup():
    setup = build(None)
    effective = setup.effective_config.to_dict()
    assert {p["name"] for p in effective["plugins"]} == set(setup.plugins)
    rebuilt = build(effective)
    assert profile_summary(rebuilt) == profile_summary(setup)
    assert rebuilt.auto_created == []


def test_accepts_a_parsed_config():
    parsed = SchedulerConfig.model_validate({"plugins": [{"type": "queue-scorer"}]})
    assert profile_summary(build(parsed)) == ([], [("queue-scorer", 1.0)], "max-score-picker")


# --- defaulting ----------------------------------------------------------------------------------------


def test_no_profiles_gives_a_default_profile_with_every_filter_scorer_and_the_first_picker():
    setup = build(
        {
            "plugins": [
                {"type": "test-keep-filter", "name": "f"},
                {"type": "queue-scorer"},
                {"type": "random-picker"},
                {"type": "weighted-random-picker"},
                {"type": "kv-cache-utilization-scorer"},
                {"type": "test-hooks"},
            ]
        }
    )
    assert setup.scheduler.profile_names == ["default"]
    assert profile_summary(setup) == (
        ["f"],
        [("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 1.0)],
        "random-picker",
    )
    assert setup.auto_created == ["single-profile-handler"]


def test_name_defaults_to_type_and_names_allow_two_instances():
    setup = build(
        {
            "plugins": [
                {"type": "queue-scorer"},
                {"type": "queue-scorer", "name": "second-queue"},
            ],
            "schedulingProfiles": [
                {
                    "name": "p",
                    "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "second-queue", "weight": 4}],
                }
            ],
        }
    )
    assert profile_summary(setup, "p")[1] == [("queue-scorer", 1.0), ("second-queue", 4.0)]
    assert setup.plugins["second-queue"].type_name == "queue-scorer"


def test_missing_picker_is_added_to_every_profile_lacking_one():
    setup = build(
        {
            "plugins": [{"type": "test-prefill-decode-handler"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "prefill", "plugins": [{"pluginRef": "queue-scorer"}]},
                {"name": "decode", "plugins": []},
            ],
        }
    )
    assert setup.auto_created == ["max-score-picker"]
    pickers = {name: p.picker for name, p in setup.scheduler.profiles.items()}
    assert isinstance(pickers["prefill"], MaxScorePicker) and pickers["prefill"] is pickers["decode"]


def test_profile_without_picker_gets_the_first_configured_picker():
    setup = build(
        {
            "plugins": [
                {"type": "test-prefill-decode-handler"},
                {"type": "weighted-random-picker", "name": "wr"},
                {"type": "random-picker", "name": "rnd"},
            ],
            "schedulingProfiles": [
                {"name": "prefill", "plugins": [{"pluginRef": "rnd"}]},
                {"name": "decode", "plugins": []},
            ],
        }
    )
    assert setup.scheduler.profiles["prefill"].picker.name == "rnd"
    assert setup.scheduler.profiles["decode"].picker.name == "wr"
    assert setup.auto_created == []


def test_non_scheduling_plugins_in_a_profile_are_ignored():
    setup = build(
        {
            "plugins": [
                {"type": "test-hooks"},
                {"type": "approx-prefix-cache-producer"},
                {"type": "queue-scorer"},
            ],
            "schedulingProfiles": [
                {
                    "name": "default",
                    "plugins": [
                        {"pluginRef": "test-hooks"},
                        {"pluginRef": "approx-prefix-cache-producer", "weight": 5},
                        {"pluginRef": "queue-scorer", "weight": 2},
                    ],
                }
            ],
        }
    )
    assert profile_summary(setup) == ([], [("queue-scorer", 2.0)], "max-score-picker")


def test_request_control_lists_are_in_declaration_order():
    setup = build(
        {
            "plugins": [
                {"type": "test-hooks", "name": "h2"},
                {"type": "approx-prefix-cache-producer"},
                {"type": "test-hooks", "name": "h1"},
            ]
        }
    )
    assert [p.name for p in setup.admitters] == ["h2", "h1"]
    assert [p.name for p in setup.pre_request] == ["h2", "approx-prefix-cache-producer", "h1"]
    assert [p.name for p in setup.response_header_processors] == ["h2", "h1"]
    assert [p.name for p in setup.response_body_processors] == ["h2", "approx-prefix-cache-producer", "h1"]


# --- data producers --------------------------------------------------------------------------------------


def test_token_load_scorer_gets_the_inflight_load_and_prefix_producers():
    """The in-flight counts, and the prefix match for the request's own uncached prompt (the prefix producer
    also makes the in-flight prefill counts uncached, through its pre-request hook)."""
    setup = build({"plugins": [{"type": "token-load-scorer"}]})
    assert setup.auto_created[-2:] == ["inflight-load-producer", "approx-prefix-cache-producer"]
    assert [type(p) for p in setup.data_producers] == [InflightLoadProducer, ApproxPrefixCacheProducer]


def test_declared_producer_is_not_duplicated():
    setup = build(
        {
            "plugins": [
                {"type": "prefix-cache-scorer"},
                {"type": "approx-prefix-cache-producer", "name": "apc"},
            ]
        }
    )
    assert [p.name for p in setup.data_producers] == ["apc"]
    assert "approx-prefix-cache-producer" not in setup.auto_created


def test_auto_created_producers_are_created_transitively_and_ordered():
    setup = build({"plugins": [{"type": "test-consumer-scorer"}]})
    assert setup.auto_created[-2:] == ["test-producer-a", "test-producer-b"]
    assert [p.name for p in setup.data_producers] == ["test-producer-b", "test-producer-a"]


def test_declared_producers_are_ordered_producer_first():
    setup = build(
        {
            "plugins": [
                {"type": "test-producer-a"},
                {"type": "approx-prefix-cache-producer"},
                {"type": "test-producer-b"},
            ]
        }
    )
    assert [p.name for p in setup.data_producers] == [
        "approx-prefix-cache-producer",
        "test-producer-b",
        "test-producer-a",
    ]


def test_producer_cycle_is_an_error():
    fails(
        {"plugins": [{"type": "test-producer-x"}, {"type": "test-producer-y"}]},
        "scheduler.plugins: data producers depend on each other in a cycle: "
        "test-producer-x/test-producer-x, test-producer-y/test-producer-y",
    )


def test_consumed_key_without_producer_is_an_error():
    fails(
        {"plugins": [{"type": "test-orphan-consumer"}]},
        "scheduler.plugins: plugin 'test-orphan-consumer' consumes 'test-nobody-produces', which no "
        "configured plugin produces and which has no default producer",
    )


def test_auto_created_name_taken_by_another_type_is_an_error():
    fails(
        {"plugins": [{"type": "queue-scorer", "name": "max-score-picker"}]},
        "needs a 'max-score-picker' plugin, but the name 'max-score-picker' is taken by a 'queue-scorer' "
        "plugin",
    )


# --- validation errors -----------------------------------------------------------------------------------


def test_parameter_errors_name_the_plugin_and_field():
    fails(
        {
            "plugins": [
                {"type": "queue-scorer", "name": "q"},
                {"type": "max-score-picker"},
                {"type": "queue-scorer", "parameters": {"foo": 1}},
            ]
        },
        "scheduler.plugins[2] (queue-scorer): parameters.foo: extra inputs are not permitted",
    )
    fails(
        {
            "plugins": [
                {"type": "max-score-picker", "name": "mp", "parameters": {"maxNumOfEndpoints": "many"}}
            ]
        },
        "scheduler.plugins[0] (mp/max-score-picker): parameters.maxNumOfEndpoints: "
        "input should be a valid integer",
    )
    fails(
        {"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 0}}]},
        "parameters.blockSizeTokens: input should be greater than 0",
    )
    fails(
        {"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"blockSize": 64}}]},
        "scheduler.plugins[0] (approx-prefix-cache-producer): parameters: "
        "blockSize (in characters) is no longer supported: set blockSizeTokens instead",
    )


def test_deprecated_block_size_is_ignored_next_to_block_size_tokens():
    setup = build(
        {
            "plugins": [
                {
                    "type": "approx-prefix-cache-producer",
                    "parameters": {"blockSize": 64, "blockSizeTokens": 8},
                }
            ]
        }
    )
    assert setup.plugins["approx-prefix-cache-producer"].params.block_size_tokens == 8


def test_unknown_type_is_an_error_listing_known_types():
    fails(
        {"plugins": [{"type": "queue-scorer"}, {"type": "nope"}]},
        "scheduler.plugins[1].type: unknown plugin type 'nope' (known types: ",
    )


def test_shape_errors_name_the_field():
    fails({"plugins": [{"name": "x"}]}, "scheduler.plugins[0].type: field required")
    fails(
        {"plugins": [{"type": "queue-scorer", "param": {}}]},
        "scheduler.plugins[0].param: extra inputs are not permitted",
    )
    fails({"featureGates": ["flowControl"]}, "scheduler.featureGates: extra inputs are not permitted")
    fails({"plugins": "queue-scorer"}, "scheduler.plugins: input should be a valid list")
    fails(["queue-scorer"], "scheduler: must be a mapping, got list")
    fails(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}]}],
        },
        "scheduler.schedulingProfiles[0].plugins[0].weight: input should be greater than or equal to 0",
    )
    fails(
        {"schedulingProfiles": [{"name": "", "plugins": []}]},
        "scheduler.schedulingProfiles[0].name: string should have at least 1 character",
    )


def test_kind_must_be_endpoint_picker_config():
    fails({"kind": "Pod"}, "scheduler.kind: must be 'EndpointPickerConfig'")


def test_location_prefix_is_configurable():
    with pytest.raises(SchedulerConfigError, match=re.escape("epp.plugins[0].type: field required")):
        build_scheduler_setup({"plugins": [{}]}, make_ctx(), location="epp")


def test_two_unnamed_instances_of_a_type():
    fails(
        {"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}]},
        "scheduler.plugins[1].name: duplicate plugin name 'queue-scorer' "
        "(plugins[0] has it too; name each instance of a type)",
    )


def test_duplicate_plugin_name():
    fails(
        {
            "plugins": [
                {"type": "queue-scorer"},
                {"type": "kv-cache-utilization-scorer", "name": "queue-scorer"},
            ]
        },
        "scheduler.plugins[1].name: duplicate plugin name 'queue-scorer' (plugins[0] has it too)",
    )


def test_unknown_plugin_ref():
    fails(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "max-score-picker"}]}],
        },
        "scheduler.schedulingProfiles[0].plugins[0].pluginRef: "
        "no plugin named 'max-score-picker' (declared: queue-scorer)",
    )


def test_plugin_referenced_twice_in_a_profile():
    fails(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "p", "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "queue-scorer"}]}
            ],
        },
        "scheduler.schedulingProfiles[0].plugins[1].pluginRef: "
        "plugin 'queue-scorer' is referenced twice in profile 'p'",
    )


def test_duplicate_profile_name():
    fails(
        {
            "plugins": [{"type": "test-prefill-decode-handler"}],
            "schedulingProfiles": [{"name": "decode"}, {"name": "decode"}],
        },
        "scheduler.schedulingProfiles[1].name: "
        "duplicate profile name 'decode' (also at schedulingProfiles[0])",
    )


def test_two_pickers_in_a_profile():
    fails(
        {
            "plugins": [{"type": "random-picker"}, {"type": "max-score-picker"}],
            "schedulingProfiles": [
                {"name": "p", "plugins": [{"pluginRef": "random-picker"}, {"pluginRef": "max-score-picker"}]}
            ],
        },
        "scheduler.schedulingProfiles[0]: "
        "profile 'p' has more than one picker: random-picker, max-score-picker",
    )


def test_more_than_one_profile_handler():
    fails(
        {"plugins": [{"type": "single-profile-handler"}, {"type": "test-prefill-decode-handler"}]},
        "scheduler.plugins: "
        "more than one profile handler: single-profile-handler, test-prefill-decode-handler",
    )


def test_several_profiles_need_a_handler():
    fails(
        {"schedulingProfiles": [{"name": "a"}, {"name": "b"}]},
        "scheduler.plugins: 2 scheduling profiles need a profile handler plugin; none is configured",
    )


def test_single_profile_handler_with_two_profiles():
    fails(
        {
            "plugins": [{"type": "single-profile-handler"}],
            "schedulingProfiles": [{"name": "a"}, {"name": "b"}],
        },
        "scheduler.schedulingProfiles: profile handler 'single-profile-handler': single-profile-handler runs "
        "exactly one profile, but 2 are configured (a, b)",
    )


def test_handler_rejecting_its_profiles():
    fails(
        {
            "plugins": [{"type": "test-prefill-decode-handler", "name": "pd"}],
            "schedulingProfiles": [{"name": "a"}, {"name": "b"}],
        },
        "scheduler.schedulingProfiles: "
        "profile handler 'pd': needs exactly the profiles 'prefill' and 'decode'",
    )


# --- files ---------------------------------------------------------------------------------------------


def test_load_file(tmp_path):
    path = tmp_path / "epp.yaml"
    path.write_text(
        "apiVersion: llm-d.ai/v1alpha1\n"
        "kind: EndpointPickerConfig\n"
        "plugins:\n"
        "- type: queue-scorer\n"
        "- type: token-load-scorer\n"
        "  parameters: {queueThresholdTokens: 1000}\n"
        "schedulingProfiles:\n"
        "- name: default\n"
        "  plugins:\n"
        "  - pluginRef: queue-scorer\n"
        "    weight: 2\n"
        "  - pluginRef: token-load-scorer\n"
    )
    setup = build(load_scheduler_config_file(path))
    assert profile_summary(setup) == (
        [],
        [("queue-scorer", 2.0), ("token-load-scorer", 1.0)],
        "max-score-picker",
    )
    assert setup.plugins["token-load-scorer"].params.queue_threshold_tokens == 1000


def test_file_errors(tmp_path):
    path = tmp_path / "epp.yaml"
    with pytest.raises(SchedulerConfigError, match=re.escape(f"{path}: cannot read the scheduler config")):
        load_scheduler_config_file(path)
    path.write_text("plugins:\n  - type: queue-scorer\n   name: x\n")
    with pytest.raises(SchedulerConfigError, match=re.escape(f"{path}: invalid YAML (line 3, column 4)")):
        load_scheduler_config_file(path)
    path.write_text("")
    with pytest.raises(SchedulerConfigError, match="the file is empty"):
        load_scheduler_config_file(path)
    path.write_text("- type: queue-scorer\n")
    with pytest.raises(SchedulerConfigError, match="the scheduler config must be a mapping, got list"):
        load_scheduler_config_file(path)
    path.write_text("plugins:\n- tipe: queue-scorer\n")
    with pytest.raises(SchedulerConfigError) as info:
        load_scheduler_config_file(path)
    assert str(info.value) == (
        f"{path}: plugins[0].type: field required; plugins[0].tipe: extra inputs are not permitted"
    )
