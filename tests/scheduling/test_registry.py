"""The plugin registry: lookup by type name, errors that list the known types, default producers."""

from __future__ import annotations

import pytest

from slorouter.scheduling import registry
from slorouter.scheduling.datakeys import INFLIGHT_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.plugin import DataProducer, Plugin, Scorer
from slorouter.scheduling.plugins.pickers import MaxScorePicker
from slorouter.scheduling.registry import UnknownPluginTypeError, plugin_class, register_plugin

BUILTIN_TYPES = {
    "queue-scorer",
    "running-requests-size-scorer",
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
    "token-load-scorer",
    "inflight-load-producer",
    "approx-prefix-cache-producer",
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "single-profile-handler",
}


def test_builtin_plugins_are_registered():
    assert set(registry.registered_types()) >= BUILTIN_TYPES
    assert plugin_class("max-score-picker") is MaxScorePicker


def test_unknown_type_lists_known_types():
    with pytest.raises(UnknownPluginTypeError) as info:
        plugin_class("queue-scorrer")
    message = str(info.value)
    assert "unknown plugin type 'queue-scorrer'" in message
    assert "queue-scorer" in message and "max-score-picker" in message


def test_default_producers():
    assert registry.default_producer_type(PREFIX_MATCH_BLOCKS) == "approx-prefix-cache-producer"
    assert registry.default_producer_type(PREFIX_TOTAL_BLOCKS) == "approx-prefix-cache-producer"
    assert registry.default_producer_type(INFLIGHT_TOKENS) == "inflight-load-producer"
    assert registry.default_producer_type("nobody-makes-this") is None


def test_kinds_of_class():
    assert registry.kinds_of_class(MaxScorePicker) == ["Picker"]


def test_registration_errors():
    class Nameless(Plugin, Scorer):
        def score(self, cycle, request, candidates):
            return candidates.column("waiting")

    with pytest.raises(ValueError, match="no type_name"):
        register_plugin(Nameless)

    class NoKind(Plugin):
        type_name = "test-no-kind"

    with pytest.raises(ValueError, match="implements no plugin kind"):
        register_plugin(NoKind)

    class Impostor(Plugin, Scorer):
        type_name = "queue-scorer"

        def score(self, cycle, request, candidates):
            return candidates.column("waiting")

    with pytest.raises(ValueError, match="already registered"):
        register_plugin(Impostor)

    class ProducesNothing(Plugin, DataProducer):
        type_name = "test-produces-nothing"

        def produce(self, request, candidates):
            pass

    with pytest.raises(ValueError, match="produces no data key"):
        register_plugin(default_producer=True)(ProducesNothing)
