"""The configuration loader on generated files: the YAML text (cut, with bytes changed, random YAML-looking
text), the config's sections with values replaced or unknown keys, and scheduler sections of random plugins,
parameters and weights. A valid file loads and its scheduler builds; anything else is a ``YAMLFileError``,
``ConfigError`` or ``SchedulerConfigError`` naming the file and the key; nothing else is raised
(``tests/test_yamlfile.py`` fuzzes the YAML reader alone)."""

from __future__ import annotations

from hypothesis import given, settings

from tests.fuzz.strategies import CONFIG_CASES, TextCase, check_config


@settings(max_examples=200, deadline=None)
@given(CONFIG_CASES)
def test_generated_config_files(case: TextCase) -> None:
    check_config(case)
