"""The YAML examples in docs/configuration-scheduler.md build as documented."""

from __future__ import annotations

import re
from pathlib import Path

from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.yamlfile import parse_yaml_mapping
from tests.helpers.scheduling import make_ctx

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration-scheduler.md"


def test_every_yaml_example_builds():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    for i, block in enumerate(blocks):
        document = parse_yaml_mapping(block, f"{DOC.name} example {i + 1}", "example")  # duplicate keys fail
        assert document is not None
        setup = build_scheduler_setup(document["scheduler"], make_ctx())
        assert setup.scheduler.profile_names == ["default"]
