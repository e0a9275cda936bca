"""Run summaries, policies, pool specs and the ``slorouter bench`` command."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from slorouter.bench.policies import POLICY_NAMES, PolicyError, resolve_policies, resolve_policy
from slorouter.bench.pool import PoolSpecError, describe_pool, parse_pool
from slorouter.bench.records import OK, SHED, UNFINISHED, RunRecords
from slorouter.bench.report import markdown_tables
from slorouter.bench.results import summarize_run
from slorouter.cli import main
from slorouter.extras import install_hint
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.sim.profiles import LLAMA3_8B_A100
from slorouter.sim.variants import parse_variant


def records(**columns: list[float]) -> RunRecords:
    n = len(columns["arrival"])
    nan = [math.nan] * n
    defaults = {
        "status": [OK] * n,
        "pod": [0] * n,
        "prompt_tokens": [100] * n,
        "cached_tokens": [0] * n,
        "output_tokens": [11] * n,
        "slo_ttft_ms": nan,
        "slo_tpot_ms": nan,
        "predicted": [False] * n,
        "predicted_ttft_ms": nan,
        "point_ttft_ms": nan,
        "predicted_tpot_ms": nan,
        "point_tpot_ms": nan,
    }
    data = {**defaults, **columns}
    return RunRecords(**{k: np.array(v) for k, v in data.items()}, pod_profiles=["p"])


def test_summary_percentiles_window_unfinished_and_throughput() -> None:
    rec = records(
        arrival=[0.5, 1.0, 2.0, 3.0, 4.0, 9.5],
        ttft_s=[9.0, 0.1, 0.2, 0.3, math.nan, 0.1],
        e2e_s=[10.0, 1.1, 1.2, 1.3, math.nan, 1.1],
        status=[OK, OK, OK, OK, UNFINISHED, OK],
        output_tokens=[11, 11, 11, 11, 0, 11],
    )
    s = summarize_run(rec, warmup_s=1.0, duration_s=9.0)  # the first and last requests are outside
    assert (s["requests"], s["admitted"], s["finished"], s["unfinished"]) == (4, 4, 3, 1)
    assert s["ttft_p50_ms"] == pytest.approx(250.0)  # 100, 200, 300, ∞ → midpoint of 200 and 300
    assert s["ttft_p99_ms"] == math.inf  # the unfinished request counts as infinitely slow
    assert s["tpot_p50_ms"] == pytest.approx(100.0)  # (1.2 − 0.2) s / 10 tokens
    assert s["output_tok_s"] == pytest.approx(33 / 8, abs=0.05)
    assert s["goodput_rps"] == pytest.approx(3 / 8, abs=1e-3)
    assert s["slo_attainment"] is None and s["ttft_mape"] is None


def test_summary_slo_attainment_shedding_and_prediction_quality() -> None:
    rec = records(
        arrival=[1.0, 2.0, 3.0, 4.0],
        ttft_s=[0.1, 0.3, 0.1, math.nan],
        e2e_s=[1.1, 1.3, 3.1, math.nan],
        status=[OK, OK, OK, SHED],
        pod=[0, 1, 0, -1],
        slo_ttft_ms=[200.0, 200.0, 200.0, 200.0],
        slo_tpot_ms=[150.0, 150.0, 150.0, 150.0],
        predicted=[True, True, False, False],
        predicted_ttft_ms=[150.0, 250.0, math.nan, math.nan],
        point_ttft_ms=[80.0, 240.0, math.nan, math.nan],
        point_tpot_ms=[110.0, 90.0, math.nan, math.nan],
    )
    s = summarize_run(rec, warmup_s=0.0, duration_s=10.0)
    # request 0 meets both; 1 misses TTFT; 2 misses TPOT (300 ms/token); 3 was shed
    assert s["shed"] == 1 and s["slo_requests"] == 4
    assert s["slo_attainment"] == pytest.approx(0.25)
    assert s["slo_attainment_admitted"] == pytest.approx(1 / 3, abs=1e-4)
    assert s["goodput_rps"] == pytest.approx(0.1)
    assert s["ttft_mape"] == pytest.approx((0.2 + 0.2) / 2, abs=1e-4)  # |100−80|/100, |300−240|/300
    assert s["ttft_p90_coverage"] == pytest.approx(0.5)  # 100 ≤ 150, 300 > 250
    assert s["predicted_share"] == pytest.approx(2 / 3, abs=1e-4)
    # E2E: 80 + 110 × 10 = 1180 vs 1100; 240 + 90 × 10 = 1140 vs 1300
    assert s["e2e_mape"] == pytest.approx((80 / 1100 + 160 / 1300) / 2, abs=1e-4)


def test_builtin_policies_all_build_and_user_files_load(tmp_path: Path) -> None:
    for name in POLICY_NAMES:
        policy = resolve_policy(name)
        build_scheduler_setup(policy.config, PluginContext())
        assert policy.uses_predictor == (name == "predicted-latency")
    path = tmp_path / "mine.yaml"
    path.write_text(
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
        "  - pluginRef: queue-scorer\n"
    )
    assert resolve_policy(str(path)).name == "mine"
    assert resolve_policy(f"q={path}").config["plugins"] == [{"type": "queue-scorer", "name": ""}]
    with pytest.raises(PolicyError, match="unknown policy 'fastest'"):
        resolve_policy("fastest")
    with pytest.raises(SchedulerConfigError, match="cannot read"):
        resolve_policy("missing.yaml")
    with pytest.raises(PolicyError, match="repeated: random"):
        resolve_policies(["random", "random"])


def test_pool_specs() -> None:
    pool = parse_pool("2x llama3-8b-h100 + 1 × llama3-8b-a100")
    assert [p.name for p in pool] == ["llama3-8b-h100"] * 2 + ["llama3-8b-a100"]
    assert describe_pool(pool) == "2x llama3-8b-h100 + 1x llama3-8b-a100"
    assert describe_pool(parse_pool("3")) == "3x llama3-8b-h100"
    for bad, message in (("0", "at least 1"), ("2x h200", "unknown profile 'h200'"), ("many", "cannot read")):
        with pytest.raises(PoolSpecError, match=message):
            parse_pool(bad)


def test_pool_terms_take_engine_variants() -> None:
    pool = parse_pool("2x llama3-8b-h100 + 2x llama3-8b-h100@slow-gpu")
    assert describe_pool(pool) == "2x llama3-8b-h100 + 2x llama3-8b-h100@slow-gpu"
    assert pool[2].c_lin_ms == pytest.approx(2.2 * pool[0].c_lin_ms)
    assert pool[2].num_gpu_blocks == round(pool[0].num_gpu_blocks / 2)
    # A variant for every pod composes with a term's own (multipliers multiply, settings override).
    mixed = parse_pool("1x llama3-8b-a100@w=2 + 1", parse_variant("w=1.5,decode-priority"))
    assert [p.name for p in mixed] == [
        "llama3-8b-a100@w=1.5,decode-priority,w=2",
        "llama3-8b-h100@w=1.5,decode-priority",
    ]
    assert mixed[0].w_ms == pytest.approx(3 * LLAMA3_8B_A100.w_ms)
    assert {p.scheduler for p in mixed} == {"decode-priority"}
    for bad, message in (
        ("2@", "has '@' but no variant"),
        ("2x llama3-8b-h100@turbo", "unknown variant 'turbo'"),
        ("2@kv-blocks=10", "cannot hold one request"),
        ("2@attn=-1", "'attn=-1': must be a finite number > 0"),
    ):
        with pytest.raises(PoolSpecError, match=message):
            parse_pool(bad)


def test_markdown_ratios_to_the_tuned_heuristic() -> None:
    base = {
        "workload": "w",
        "qps": 1.0,
        "pool": "p",
        "duration_s": 10,
        "warmup_s": 2,
        "seed": 0,
        "requests": 5,
    }
    runs = [
        {
            **base,
            "policy": "heuristic-tuned",
            "ttft_p50_ms": 200.0,
            "ttft_p90_ms": 400.0,
            "e2e_p50_ms": 1000.0,
        },
        {
            **base,
            "policy": "predicted-latency",
            "ttft_p50_ms": 100.0,
            "ttft_p90_ms": 600.0,
            "e2e_p50_ms": 700.0,
        },
    ]
    text = markdown_tables(runs)
    assert "### w at 1 QPS" in text and "| predicted-latency | 0.50× | 1.50× | 0.70× | – |" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--qps", "0"], "must be a finite number > 0"),
        (["--qps", "5", "--workload", "nope"], "unknown workload 'nope'"),
        (["--qps", "5", "--pool", "3x tpu"], "--pool: pool spec"),
        (["--qps", "5", "--engine-variant", "fast"], "--engine-variant: engine variant 'fast': unknown"),
        (["--qps", "5", "--engine-variant", "max-seqs=9000"], "must be at least max-seqs (9000)"),
        (["--qps", "5", "--policies", "best"], "--policies: unknown policy 'best'"),
        (["--qps", "5", "--duration", "10", "--warmup", "10"], "--warmup (10 s) must be shorter"),
        (["--qps", "5", "--workload-param", "colour=red"], "has a parameter 'colour'"),
        (["--qps", "5", "--workload-param", "rate_ratio=-3"], "rate_ratio"),
        ([], "--qps is required"),
    ],
)
def test_bad_arguments_name_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) if "finite" in message else _no_exit():
        code = main(["bench", "--out", str(tmp_path), "--no-progress", *argv])
        assert code == 2
    assert message in capsys.readouterr().err


class _no_exit:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_bench_command_writes_json_markdown_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    code = main(
        [
            "bench",
            "--workload", "shared-prefix-a",
            "--pool", "2",
            "--qps", "4,8",
            "--duration", "20",
            "--warmup", "5",
            "--policies", "round-robin,heuristic-tuned",
            "--out", str(out),
            "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    runs = data["runs"]
    assert [(r["qps"], r["policy"]) for r in runs] == [
        (4.0, "round-robin"),
        (4.0, "heuristic-tuned"),
        (8.0, "round-robin"),
        (8.0, "heuristic-tuned"),
    ]
    for run in runs:
        assert run["workload"] == "shared-prefix-a" and run["requests"] > 0
        assert run["ttft_p50_ms"] <= run["ttft_p90_ms"] <= run["ttft_p99_ms"]
        for key in ("tpot_p90_ms", "e2e_p50_ms", "output_tok_s", "slo_attainment", "prefix_cache_hit_rate"):
            assert key in run
    assert (out / "results.md").read_text().count("### shared-prefix-a") == 2
    assert (out / "shared-prefix-a-ttft-p90-vs-qps.png").stat().st_size > 1000
    assert any(p.name.startswith("shared-prefix-a-ttft-cdf") for p in out.iterdir())
    assert "Ratios to `heuristic-tuned`" in capsys.readouterr().out


def test_several_seeds_give_medians_with_the_runs_kept(tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    argv = ["bench", "--workload", "shared-prefix-a", "--pool", "2", "--qps", "6", "--duration", "15"]
    argv += [
        "--warmup",
        "3",
        "--policies",
        "heuristic",
        "--seeds",
        "0,1,2",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["seeds"] == [0, 1, 2] and len(run["per_seed"]) == 3
    per_seed = [r["ttft_p90_ms"] for r in run["per_seed"]]
    assert len(set(per_seed)) > 1  # the seeds really differ
    assert run["ttft_p90_ms"] == pytest.approx(sorted(per_seed)[1])
    assert "median of seeds 0, 1, 2" in (out / "results.md").read_text()
    with pytest.raises(SystemExit):
        main(["bench", "--qps", "5", "--seeds", "a,b"])


def test_baselines_index_prompts_only_and_only_the_ranking_pipeline_follows_replies() -> None:
    """The originals' prefix index records prompts; slorouter's reply indexing is not given to them, and the
    shipped pipeline does without it too (it cost that pipeline 10-20 % TTFT p90)."""
    for name in (*POLICY_NAMES, "predicted-ranking"):
        setup = build_scheduler_setup(resolve_policy(name).config, PluginContext())
        producers = [p for p in setup.plugins.values() if p.type_name == "approx-prefix-cache-producer"]
        if name in ("heuristic", "heuristic-tuned", "token-aware", "predicted-latency"):
            assert [p.params.index_responses for p in producers] == [False]
        elif name == "predicted-ranking":
            assert [p.params.index_responses for p in producers] == [True]
        else:
            assert producers == []


def test_tables_leave_out_slo_columns_when_no_request_carried_an_slo() -> None:
    run = {"workload": "w", "qps": 1.0, "pool": "2x p", "duration_s": 10, "warmup_s": 2, "seed": 0}
    without = markdown_tables([{**run, "policy": "a", "requests": 5, "slo_requests": 0, "goodput_rps": 0.5}])
    assert "SLO att." not in without and "goodput rps" not in without
    with_slo = markdown_tables([{**run, "policy": "a", "requests": 5, "slo_requests": 3, "goodput_rps": 0.5}])
    assert "| SLO att. | goodput rps |" in with_slo


def test_without_matplotlib_bench_writes_its_tables_and_names_the_install_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the bench extra were not installed
    out = tmp_path / "results"
    argv = ["bench", "--workload", "shared-prefix-a", "--pool", "2", "--qps", "4", "--duration", "8"]
    code = main([*argv, "--warmup", "2", "--policies", "round-robin", "--out", str(out), "--no-progress"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"plots skipped: they need matplotlib ({install_hint('bench')})"


def test_log_axes_label_only_one_two_and_five_times_powers_of_ten(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from slorouter.bench.report import _log_scale

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([0.11, 0.9], [0, 1])  # less than a decade: matplotlib's default labels the minor ticks too
    _log_scale(ax.xaxis, ax.set_xscale)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels(minor=True) + ax.get_xticklabels() if t.get_text()]
    visible = [float(label) for label in labels if 0.11 <= float(label) <= 0.9]
    assert visible == [0.2, 0.5]
    plt.close(fig)
