"""Lower layers never import higher ones (docs/architecture.md).

Every ``import`` in ``src/slorouter`` (``TYPE_CHECKING`` ones included) is checked against the layer order
below: a module may import its own component and components of lower layers only. Components in one layer
(the front-ends) do not import each other. The simulator is imported by the benchmark and the CLI only: the
router's components (the predictor, the front-ends) run against real model servers, and what they share with
the simulator (fault injection, ``faults``) lives below both.

Plugins are leaves: no module outside ``slorouter.scheduling.plugins`` imports one (the registry finds them by
walking the package), and no plugin imports another plugin's module (a plugin is a module or a package
directly under ``plugins``). What several plugins need lives in the framework beside the data keys.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "slorouter"

# Lowest first. A component is a top-level module or sub-package of slorouter.
LAYERS: list[set[str]] = [
    {"children", "clock", "eager", "extras", "validation", "tokenizer", "hftokenizer", "yamlfile"},  # ground
    {"http"},  # HTTP/1.1 server, upstream client, OpenAI-style error bodies
    {"faults"},  # fault injection: fault kinds and descriptions, plans, the /admin/faults API
    {"api"},  # the OpenAI API: request parsing, routing headers, reading responses
    {"kvevents"},  # vLLM's KV-event wire format and publisher, the simulated block hash chain
    {"pool"},  # endpoints, scraping, in-flight accounting
    {"discovery"},  # the pool's membership from Kubernetes (InferencePool, pods: list and watch)
    {"sim"},  # engine model and simulated model servers
    {"predictor"},  # features, samples, training, models, prediction, servers, client
    {"metrics"},  # the router's Prometheus series (the pool's, the predictor's, the pipeline's)
    {"tracing"},  # OpenTelemetry spans of the requests: the YAML section, the tracer (SDK imported lazily)
    {"scheduling"},  # framework and plugins
    {"flowcontrol"},  # queues held while the pool is saturated: bands, fair flows, saturation detection
    {"config"},  # the router's YAML
    {"director"},  # the request lifecycle
    {"serving"},  # what the front-ends share: the router's assembly, requests, outcome metrics
    {"gateway", "extproc"},  # front-ends: the HTTP gateway, the Envoy ext_proc endpoint picker
    {"bench"},  # workloads, discrete-event cluster runner, reports
    {"top"},  # the live view: a terminal client of a running front-end's status page and /metrics
    {"cli"},
]
LAYER_OF = {component: i for i, layer in enumerate(LAYERS) for component in layer}
SIM_IMPORTERS = {"sim", "bench", "cli"}


def _component(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "slorouter" or len(parts) < 2:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(text: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module's source."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                for alias in node.names if node.module is None else [None]:
                    names = [node.module] if alias is None else [alias.name]
                    found.append((node.lineno, ".".join(base + names)))
            else:
                found.append((node.lineno, node.module or ""))
    return found


def _violations(text: str, module: str, is_package: bool = False) -> list[str]:
    own = _component(module)
    if own is None:  # slorouter/__init__.py
        return []
    found = []
    for line, target in _imports(text, module, is_package):
        component = _component(target)
        if component is None or component == own:
            continue
        if component not in LAYER_OF or LAYER_OF[component] >= LAYER_OF[own]:
            found.append(f"line {line}: {own} imports {target} ({component} is not below it)")
        elif component == "sim" and own not in SIM_IMPORTERS:
            found.append(
                f"line {line}: {own} imports {target} (only sim, bench and cli import the simulator)"
            )
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_component_has_a_layer():
    components = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in SOURCES}
    components.discard("__init__")
    assert components - set(LAYER_OF) == set()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_respect_the_layers(path: Path):
    text = path.read_text(encoding="utf-8")
    assert _violations(text, _module_name(path), path.name == "__init__.py") == []


def test_the_check_catches_upward_and_relative_imports():
    assert _violations("from slorouter.director import Director\n", "slorouter.pool.state") == [
        "line 1: pool imports slorouter.director (director is not below it)"
    ]
    assert _violations("from ..gateway import app\n", "slorouter.sim.server") == [
        "line 1: sim imports slorouter.gateway (gateway is not below it)"
    ]
    assert _violations("import slorouter.predictor.features\n", "slorouter.scheduling.types") == []
    assert _violations("from . import state\n", "slorouter.pool.scraper") == []


def test_only_the_benchmark_and_the_cli_import_the_simulator():
    assert _violations("from slorouter.sim.faults import FAULTS\n", "slorouter.predictor.faults") == [
        "line 1: predictor imports slorouter.sim.faults (only sim, bench and cli import the simulator)"
    ]
    assert _violations("from ..sim import server\n", "slorouter.gateway.command") == [
        "line 1: gateway imports slorouter.sim (only sim, bench and cli import the simulator)"
    ]
    assert _violations("from slorouter.sim.server import start_pods\n", "slorouter.cli") == []
    assert _violations("from slorouter.sim.engine import Engine\n", "slorouter.bench.cluster") == []
    assert _violations("from slorouter.faults.plan import FaultPlan\n", "slorouter.sim.server") == []


PLUGINS = "slorouter.scheduling.plugins"


def _plugin_of(module: str) -> str | None:
    """The plugin a module belongs to (``slorouter.scheduling.plugins.prefix.approx`` → ``prefix``)."""
    parts = module.split(".")
    if module.startswith(PLUGINS + ".") and len(parts) > 3:
        return parts[3]
    return None


def _plugin_violations(text: str, module: str, is_package: bool = False) -> list[str]:
    own = _plugin_of(module)
    found = []
    for line, target in _imports(text, module, is_package):
        plugin = _plugin_of(target)
        if plugin is None or plugin == own:
            continue
        who = f"plugin {own}" if own is not None else module
        found.append(f"line {line}: {who} imports {target} (plugin {plugin}'s module)")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_plugins_are_leaves(path: Path):
    text = path.read_text(encoding="utf-8")
    assert _plugin_violations(text, _module_name(path), path.name == "__init__.py") == []


def test_the_plugin_check_catches_framework_and_cross_plugin_imports():
    assert _plugin_violations(
        "from slorouter.scheduling.plugins.latency import X\n", "slorouter.director"
    ) == ["line 1: slorouter.director imports slorouter.scheduling.plugins.latency (plugin latency's module)"]
    assert _plugin_violations(
        "from slorouter.scheduling.plugins.prefix.approx import Y\n", "slorouter.scheduling.plugins.inflight"
    ) == [
        "line 1: plugin inflight imports slorouter.scheduling.plugins.prefix.approx (plugin prefix's module)"
    ]
    assert (
        _plugin_violations("from .index import PrefixIndex\n", "slorouter.scheduling.plugins.prefix.approx")
        == []
    )
    assert (
        _plugin_violations(
            "from slorouter.scheduling.prefix_blocks import prefix_seed\n", "slorouter.serving.recording"
        )
        == []
    )
