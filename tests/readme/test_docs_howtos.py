"""The how-to commands of ``docs/`` that run on one machine in bounded time, run as written in the README's
install (the base package), as ``test_readme_walkthrough.py`` runs the README's: the simulator's
(``docs/simulator.md``: its pods, engines and fault injection) and a workload summary
(``docs/workloads.md``). The rest of the docs' commands are checked against the parser by
``tests/test_doc_commands.py``: they need a cluster, a registry, the dev extras or minutes of simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.readme.shell import CHECKOUT, DocCommands, Namespace

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        not CHECKOUT, reason="the docs' how-tos run in the README's own install: `make test-readme`"
    ),
]


def _doc(name: str) -> DocCommands:
    return DocCommands.read(Path(CHECKOUT) / "docs" / name)


@pytest.mark.parametrize(
    ("beginning", "last_port"),
    [
        ("slorouter sim --pods 4 --port 8000 --profile llama3-8b-h100", 8003),
        ("slorouter sim --pods 16 --port 0", None),
        ("slorouter sim --pods 4 --engine-variant", 8003),
        ("slorouter sim --pods 4 --port 0 --engine", None),
        ("slorouter sim --pods 4 --fault", 8003),
    ],
)
def test_the_simulators_commands_start_their_pods(
    shell: Namespace, beginning: str, last_port: int | None
) -> None:
    sim = shell.start(_doc("simulator.md").line(beginning))
    if last_port is not None:
        shell.wait_until_answers(f"http://127.0.0.1:{last_port}/metrics", sim)
    else:
        shell.wait_for_output(sim, "slorouter sim: ")
    shell.interrupt(sim)


def test_fault_injection_commands_add_list_and_clear_a_fault(shell: Namespace) -> None:
    doc = _doc("simulator.md")
    sim = shell.start(doc.line("slorouter sim --pods 4 --port 8000"))
    shell.wait_until_answers("http://127.0.0.1:8000/metrics", sim)
    added = shell.run(doc.line("curl -s localhost:8000/admin/faults -d"))
    assert added.returncode == 0 and "kill-mid-stream" in added.stdout, added
    listed = shell.run(doc.line("curl -s localhost:8000/admin/faults #"))
    assert [f["fault"] for f in json.loads(listed.stdout)["faults"]] == ["kill-mid-stream"], listed.stdout
    cleared = shell.run(doc.line("curl -s -X DELETE"))
    assert cleared.returncode == 0, cleared
    shell.interrupt(sim)


def test_a_workload_summary(shell: Namespace) -> None:
    done = shell.run(_doc("workloads.md").line('.venv/bin/python -c "from slorouter.bench.workloads'))
    assert done.returncode == 0 and done.stdout.startswith("WorkloadSummary(requests="), done
