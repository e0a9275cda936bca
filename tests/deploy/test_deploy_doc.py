"""docs/deploy.md as a reader uses it: the `helm upgrade --install` line of step 5, read from the page's
shell blocks, renders (as `helm template`) valid manifests whose every container runs the image that step 1
builds and pushes; and the values the page documents are the chart's, none of them also listed as refused."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from slorouter.config import parse_config
from tests.helpers.chart import CHART, CRD_DIRS, CRDS, ROOT, SEED_LINE, one, validate
from tests.helpers.doc_commands import Command, commands

DOC = ROOT / "docs" / "deploy.md"
# What the reader's shell holds after step 1's `export`s: values of the test's own, not the page's examples,
# so that the image can only match if the page carries it from one step to the other through the variable.
EXAMPLE_ENV = {"REGISTRY": "registry.example.test/llm-team"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _variables(word: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in VARIABLE.finditer(word)]


def _expand(word: str) -> str:
    return VARIABLE.sub(lambda m: EXAMPLE_ENV[m.group(1) or m.group(2)], word)


def _documented(program: str, *subcommand: str) -> list[Command]:
    """The page's commands that start with `program subcommand...`, in page order."""
    prefix = (program, *subcommand)
    return [c for c in commands(DOC) if c.words[: len(prefix)] == prefix]


def _pairs(flags: list[str]) -> Iterator[tuple[str, str]]:
    """(`--set`, `key=value`) pairs of a helm line's flags; every flag here takes a value."""
    assert len(flags) % 2 == 0, flags
    yield from zip(flags[::2], flags[1::2], strict=True)


def _install_lines() -> list[Command]:
    lines = _documented("helm", "upgrade", "--install")
    assert lines, f"no `helm upgrade --install` in {DOC.name}'s shell blocks"
    return lines


def _pushed_image() -> str:
    """The image step 1 builds (`docker build -t IMAGE .`) and pushes, with EXAMPLE_ENV's values."""
    (build,) = _documented("docker", "build")
    (push,) = _documented("docker", "push")
    words = list(build.words)
    assert words[-1] == "." and words.count("-t") == 1, build.where()  # at the repository's root
    tag = words[words.index("-t") + 1]
    assert list(push.words[2:]) == [tag], f"{push.where()} pushes another image than {build.where()} builds"
    return _expand(tag)


def test_every_variable_of_the_install_steps_is_exported_before_it_is_used():
    exported: set[str] = set()
    used = 0
    for command in commands(DOC):
        if command.words[0] == "export":
            exported.update(word.split("=", 1)[0] for word in command.words[1:])
            continue
        if command.words[0] not in ("docker", "helm"):
            continue
        for word in command.words:
            for name in _variables(word):
                used += 1
                assert name in exported, f"{command.where()}: ${name} is not exported before"
                assert name in EXAMPLE_ENV, f"{command.where()}: give ${name} an example value in this test"
    assert used, "the install steps use no variable: is the extraction broken?"


def test_the_install_line_is_the_gke_guides_with_the_image_values():
    """The GKE guide's line with this chart as <chart>, its four `--set` flags as they are, and then only
    the image values."""
    seed = shlex.split(SEED_LINE.replace("\\\n", " "))
    for line in _install_lines():
        words = list(line.words)
        assert words[: len(seed)] == seed, line.where()
        added = list(_pairs(words[len(seed) :]))
        assert {flag for flag, _ in added} == {"--set"}, line.where()
        assert {value.split("=", 1)[0] for _, value in added} == {
            "inferenceExtension.image.registry",
            "inferenceExtension.image.repository",
            "inferenceExtension.image.tag",
        }, line.where()


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.processes
def test_the_install_line_renders_the_image_the_build_step_pushed(helm):
    pushed = _pushed_image()
    assert pushed.startswith(EXAMPLE_ENV["REGISTRY"] + "/"), "step 1 does not push to $REGISTRY"
    for line in _install_lines():
        words = [_expand(word) for word in line.words]
        release, chart, *flags = words[3:]
        assert (ROOT / chart).resolve() == CHART, line.where()
        args = [release, str(CHART), *flags]
        assert "0 chart(s) failed" in helm("lint", "--strict", *args[1:]).stdout
        manifests = [doc for doc in yaml.safe_load_all(helm("template", *args).stdout) if doc]
        pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in _containers(pod)}
        assert images == dict.fromkeys(images, pushed), line.where()
        assert {"epp", "training-server", "prediction-server-1"} <= set(images)
        for manifest in manifests:
            group = manifest["apiVersion"].rpartition("/")[0]
            crd = CRDS.get((group, manifest["kind"]))
            if crd is not None and not crd.is_file():
                # A gateway's or monitoring product's CRD not at hand (CRD_DIRS): the same objects of the
                # GKE guide's values are validated, or reported as skipped, by test_helm_chart's "seed" case.
                assert crd.parent in CRD_DIRS
                continue
            validate(manifest)


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _expand_value(span: str) -> list[str]:
    """The value paths a Values-table name stands for: `…x` is inferenceExtension.x, `a.{b,c}` a.b and a.c."""
    span = re.sub(r"^…", "inferenceExtension.", span)
    match = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", span)
    if match is None:
        return [span]
    head, names, tail = match.groups()
    return [f"{head}{name}{tail}" for name in names.split(",")]


def _documented_values() -> list[str]:
    rows = [line for line in _section("Values").splitlines() if line.startswith("| `")]
    return [
        path
        for row in rows
        for span in re.findall(r"`([^`]+)`", row.split("|")[1])
        for path in _expand_value(span)
    ]


def _refused_values() -> list[str]:
    paragraph = _section("Values").split("these are refused because nothing here would honour them:")[1]
    # Without its asides, such as "(use `provider.istio`)".
    paragraph = re.sub(r"\([^)]*\)", "", paragraph.split("\n\n")[0])
    return re.findall(r"`([^`]+)`", paragraph)


def test_every_documented_value_is_in_the_schema_and_none_is_also_refused():
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    documented = _documented_values()
    assert len(documented) > 50, "the Values table was not found: is the extraction broken?"
    for path in documented:
        node = schema
        for part in path.split("."):
            assert part in node.get("properties", {}), f"{path}: documented, but not in values.schema.json"
            node = node["properties"][part]
    refused = _refused_values()
    assert "sidecar" in refused and "istio" in refused
    contradictions = [
        (path, name) for name in refused for path in documented if path == name or path.endswith(f".{name}")
    ]
    assert contradictions == [], "documented in the Values table and listed as refused"


@pytest.mark.processes
def test_the_deadlines_values_reach_the_router_config_beside_the_objectives_priorities(render, tmp_path):
    (block,) = re.findall(r"```yaml\n(.*?)```", _section("Deadlines and hedges"), re.DOTALL)
    values = tmp_path / "deadlines.yaml"
    values.write_text(block, encoding="utf-8")
    config = parse_config(yaml.safe_load(one(render({}, values), "ConfigMap")["data"]["config.yaml"]))
    assert config.objective_priorities() == {"batch": -1, "chat": 5}
    assert config.objectives["batch"].deadline.action == "cancel" and config.objectives["batch"].deadline.tpot
    assert config.objectives["chat"].deadline.action == "hedge"
    assert (config.hedging.max_share, config.hedging.burst) == (0.05, 20)
