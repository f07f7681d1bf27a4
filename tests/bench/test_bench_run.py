"""`draftverify bench speed --quick` end to end on tiny random models: files, rows, losslessness, HF agreement,
theory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_fixtures import data_dir, model_args, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

import draftverify
from draftverify.backends.gguf import converter_available
from draftverify.bench import llamacpp, run_bench
from draftverify.bench.summary import cost_ratio
from draftverify.cli import app
from draftverify.theory import walltime_factor

QUICK_GAMMA = 3
# the rows of today's registry (a new method adds its own: tests/bench/test_bench_lineup.py); lossy: greedy only
LOSSLESS_FAMILIES = (
    "hf_generate",
    "ours_autoregressive",
    "hf_assisted",
    "hf_prompt_lookup",
    "model",
    "model_aligned",
    "prompt_lookup",
    "lookup_model",
    "lookup_model_aligned",
    "ngram",
    "early_exit",
    "model_tree",
    "model_tree_aligned",
    "prompt_lookup_tree",
    "suffix",
    "earn",
    "earn_aligned",
    "cross_tokenizer",
    "cross_tokenizer_aligned",
)
LOSSY_FAMILIES = ("bild", "bild_early_exit", "specdec++")


def llama_cpp_families() -> set[str]:
    """Greedy-only peer rows, present where llama-cpp-python and llama.cpp's converter are (test_bench_llamacpp)."""
    return (
        {"llamacpp", "llamacpp_prompt_lookup", "llamacpp_draft"}
        if llamacpp.installed() and converter_available()
        else set()
    )


@pytest.fixture(scope="module")
def quick(model_dir, data_dir, tmp_path_factory):
    """One `draftverify bench speed --quick` through the CLI; returns (result JSON, output folder, CLI output)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench-out")
    args = [
        "bench",
        "speed",
        "--quick",
        *model_args(model_dir),
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
        "--threads",
        "1",
        "--no-progress",
        "--temperature",
        "0,1",
    ]  # --quick alone runs greedy only
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads((out / "bench-humaneval-quick.json").read_text())
    return payload, out, result.output


def _rows(payload, temperature=None, family=None):
    return [
        r
        for r in payload["runners"]
        if (temperature is None or r["temperature"] == temperature) and (family is None or r["family"] == family)
    ]


def _measurements(payload, runner, temperature):
    return sorted(
        (m for m in payload["measurements"] if m["runner"] == runner and m["temperature"] == temperature),
        key=lambda m: m["prompt_index"],
    )


def test_quick_run_writes_json_markdown_and_plots(quick):
    payload, out, output = quick
    for name in (
        "bench-humaneval-quick.json",
        "bench-humaneval-quick.md",
        "bench-humaneval-quick-speedup.png",
        "bench-humaneval-quick-tokens-per-call.png",
        "bench-humaneval-quick-bild.png",
    ):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote markdown" in output
    assert "tokens/call" in output and "overshoot" in output  # piped: the summary is not squeezed to 80 columns
    if not llama_cpp_families():  # the reason, printed whole (brackets included)
        assert "pip install 'draftverify[llamacpp]'" in output or "$DRAFTVERIFY_LLAMA_CPP" in output, output
    for key in ("platform", "cpu_model", "cores"):
        assert payload["machine"][key]
    for key in ("python", "torch", "transformers", "draftverify", "git_commit"):
        assert key in payload["versions"]
    assert payload["date"] and payload["config"]["quick"] is True


def test_quick_run_has_every_runner_type_at_every_temperature(quick):
    payload, _, _ = quick
    assert payload["config"]["temperatures"] == [0.0, 1.0]
    assert len(payload["prompts"]) == 2 and payload["config"]["max_new_tokens"] == 8
    for t in (0.0, 1.0):
        families = {r["family"] for r in _rows(payload, t)}
        expected = set(LOSSLESS_FAMILIES) | (set(LOSSY_FAMILIES) | llama_cpp_families() if t == 0 else set())
        assert families == expected, (t, expected ^ families)
    names = {r["runner"] for r in _rows(payload, 0.0)}
    assert {
        f"hf_assisted[g={QUICK_GAMMA}]",
        "hf_assisted[heuristic]",
        "hf_assisted[hf-default]",
        f"hf_prompt_lookup[g={QUICK_GAMMA}]",
        f"model[g={QUICK_GAMMA}]",
        "model[auto]",
        f"early_exit[L=1,g={QUICK_GAMMA}]",
        "bild[fb=0.4,rb=2]",
    } <= names
    # every row measured on every prompt, each with real token counts and timings
    assert len(payload["measurements"]) == len(payload["runners"]) * 2
    for m in payload["measurements"]:
        assert m["new_tokens"] == len(m["new_ids"]) and 1 <= m["new_tokens"] <= 8
        assert m["seconds"] > 0 and m["target_calls"] >= 1


def test_greedy_lossless_runners_equal_the_baseline_on_every_prompt(quick):
    payload, _, _ = quick
    baseline = [m["new_ids"] for m in _measurements(payload, "hf_generate", 0.0)]
    lossless = [r for r in _rows(payload, 0.0) if r["lossless"]]
    assert len(lossless) >= 10
    for row in lossless:
        assert row["equal_to_baseline"] == 1.0, row["runner"]
        assert [m["new_ids"] for m in _measurements(payload, row["runner"], 0.0)] == baseline, row["runner"]
    assert payload["warnings"] == []


def test_hf_assisted_and_our_model_runner_agree_on_greedy_text(quick):
    payload, _, _ = quick
    hf = _measurements(payload, f"hf_assisted[g={QUICK_GAMMA}]", 0.0)
    ours = _measurements(payload, f"model[g={QUICK_GAMMA}]", 0.0)
    assert [m["text"] for m in hf] == [m["text"] for m in ours]
    # same draft, same constant gamma, greedy: the same steps, so the same number of target calls
    assert [m["target_calls"] for m in hf] == [m["target_calls"] for m in ours]
    assert all(m["draft_calls"] > 0 and m["drafted"] > 0 for m in hf)
    assert sum(m["accepted"] for m in hf) > 0 and sum(m["accepted"] for m in ours) > 0  # drafts were kept, too


def test_hf_counters_come_from_forward_hooks(quick):
    payload, _, _ = quick
    for m in _measurements(payload, "hf_generate", 0.0):
        assert m["target_calls"] == m["new_tokens"] and m["draft_calls"] == 0 and m["drafted"] == 0
    for t in (0.0, 1.0):
        for row in _rows(payload, t, "hf_assisted") + _rows(payload, t, "hf_prompt_lookup"):
            for m in _measurements(payload, row["runner"], t):
                # every HF target forward verifies a draft and emits its accepted tokens plus one of its own
                assert m["accepted"] + m["target_calls"] == m["new_tokens"], (row["runner"], m)
                assert m["hook_target_forwards"] == m["target_calls"]
    for m in _measurements(payload, f"model[g={QUICK_GAMMA}]", 0.0):  # ours: the hook also sees the prefill
        assert m["hook_target_forwards"] == m["target_calls"] + 1


def test_speedup_is_the_ratio_of_aggregate_tokens_per_second(quick):
    payload, _, _ = quick
    for t in (0.0, 1.0):
        rows = {r["runner"]: r for r in _rows(payload, t)}
        for name, row in rows.items():
            ms = _measurements(payload, name, t)
            tps = sum(m["new_tokens"] for m in ms) / sum(m["seconds"] for m in ms)
            assert row["tokens_per_second"] == pytest.approx(tps)
            assert row["speedup"] == pytest.approx(tps / rows["hf_generate"]["tokens_per_second"])
            assert row["tokens_per_call"] == pytest.approx(
                sum(m["new_tokens"] for m in ms) / sum(m["target_calls"] for m in ms)
            )
        assert rows["hf_generate"]["speedup"] == pytest.approx(1.0)


def test_theorem8_prediction_is_walltime_factor_of_the_recorded_alpha_c_gamma(quick):
    payload, _, _ = quick
    predicted = [r for r in payload["runners"] if r["predicted_speedup"] is not None]
    # chain drafters only: Theorem 8 has no model of a tree (model_tree, prompt_lookup_tree get no prediction)
    assert {r["family"] for r in predicted} == {
        "model",
        "model_aligned",
        "ngram",
        "prompt_lookup",
        "suffix",
        "earn",
        "earn_aligned",
        "earn_aligned",
        "early_exit",
        "lookup_model",
        "lookup_model_aligned",
        "cross_tokenizer",
        "cross_tokenizer_aligned",
    }
    for row in predicted:
        assert row["predicted_speedup"] == pytest.approx(walltime_factor(row["alpha"], row["theory_gamma"], row["c"]))
        if isinstance(row["gamma"], int):
            assert row["theory_gamma"] == row["gamma"]
        ms = _measurements(payload, row["runner"], row["temperature"])
        calls = sum(m["target_calls"] for m in ms)
        base = _measurements(payload, "ours_autoregressive", row["temperature"])
        single = sum(m["stats"]["time_target"] for m in base) / sum(m["target_calls"] for m in base)
        draft_runs = sum(m["draft_calls"] for m in ms) or calls * row["theory_gamma"]
        c = cost_ratio(sum(m["stats"]["time_draft"] for m in ms), draft_runs, single)
        assert row["c"] == pytest.approx(c) and row["c"] > 0
        assert row["verify_cost"] == pytest.approx(sum(m["stats"]["time_target"] for m in ms) / calls / single)
        assert row["predicted_speedup_with_verify_cost"] == pytest.approx(
            walltime_factor(row["alpha"], row["theory_gamma"], row["c"], row["verify_cost"])
        )
        accepted = sum(m["accepted"] for m in ms)
        assert row["alpha"] == pytest.approx(accepted / (accepted + sum(m["rejections"] for m in ms)))
        assert row["achieved_over_predicted"] == pytest.approx(
            row["speedup_vs_ours_autoregressive"] / row["predicted_speedup"]
        )
    assert all(r["predicted_speedup"] is None for r in payload["runners"] if r["kind"] == "hf" or r["family"] == "bild")


def test_quality_columns_use_chrf_against_reference_and_target_greedy(quick):
    payload, _, _ = quick
    for row in _rows(payload, 0.0):
        assert row["chrf_reference"] is not None and 0 <= row["chrf_reference"] <= 100
        if row["lossless"]:
            assert row["chrf_target_greedy"] == pytest.approx(100.0)
    bild = _rows(payload, 0.0, "bild")
    assert len(bild) == 1 and bild[0]["settings"]["alpha_fb"] == 0.4 and bild[0]["settings"]["alpha_rb"] == 2.0


def test_markdown_has_the_command_line_and_a_row_per_runner(quick):
    payload, out, _ = quick
    markdown = (out / "bench-humaneval-quick.md").read_text()
    assert payload["command"].startswith("draftverify bench speed") and "--quick" in payload["command"]
    assert payload["command"] in markdown
    assert str(Path(payload["config"]["target"])) in markdown
    for row in payload["runners"]:
        assert f"`{row['runner']}`" in markdown
    assert "## Temperature 0 (greedy)" in markdown and "## Lossy methods" in markdown
    assert "bench-humaneval-quick-speedup.png" in markdown


def test_quick_piped_says_each_phase_runner_and_prompt_on_stderr_without_loading_bars(model_dir, data_dir, tmp_path):
    """The real `draftverify bench speed --quick` with stderr a pipe (not a terminal): a line per phase and per (runner,
    prompt) as it goes, greedy only and no warm-up (the smoke test's defaults), no transformers bars."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(draftverify.__file__).resolve().parents[1])
        + os.pathsep
        + os.environ.get("PYTHONPATH", ""),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftverify.cli",
            "bench",
            "speed",
            "--quick",
            *model_args(model_dir),
            "--data-dir",
            str(data_dir),
            "--out",
            str(tmp_path),
            "--threads",
            "1",
            "--no-plots",
            "--runners",
            "model,prompt_lookup",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "Loading weights" not in err and "━" not in err  # no bars: neither transformers' nor a stuck rich one
    lines = err.splitlines()
    assert lines[0].startswith("bench bench-humaneval-quick: loading the models")
    assert any(line.startswith("building the runners") for line in lines)
    assert any(line.startswith("5 runners, 5 (runner, temperature) rows x 2 prompts of 8 tokens") for line in lines)
    runners = [
        "hf_generate",
        "ours_autoregressive",
        f"model[g={QUICK_GAMMA}]",
        "model[auto]",
        f"prompt_lookup[g={QUICK_GAMMA}]",
    ]
    progress = [line for line in lines if line.startswith("[")]
    assert len(progress) == 10 and progress[-1].startswith("[10/10] ")
    for index, prompt in enumerate(("HumanEval/0", "HumanEval/1")):
        for runner in runners:
            assert sum(f"prompt {index + 1}/2 ({prompt}) {runner} T=0: " in line for line in progress) == 1, runner
    assert not any(line.startswith("warm-up") for line in lines)
    assert any(line.startswith("measured in ") for line in lines)


def test_python_api_returns_the_result_and_records_the_command(model_dir, data_dir, tmp_path):
    torch.set_num_threads(1)
    result = run_bench(
        target=model_dir / "target",
        draft=model_dir / "draft",
        data_dir=data_dir,
        out=tmp_path,
        quick=True,
        temperatures=(0.0,),
        runners=("model",),
        plots=False,
        progress=False,
        num_prompts=1,
        command="my-command --x",
    )
    assert [r["runner"] for r in result["runners"]] == [
        "hf_generate",
        "ours_autoregressive",
        f"model[g={QUICK_GAMMA}]",
        "model[auto]",
    ]
    assert result["command"] == "my-command --x"
    assert "my-command --x" in (tmp_path / "bench-humaneval-quick.md").read_text()
    assert not list(tmp_path.glob("*.png"))
    assert json.loads((tmp_path / "bench-humaneval-quick.json").read_text())["runners"][2]["equal_to_baseline"] == 1.0


def test_tokens_per_second_sums_each_runners_prompts():
    from draftverify.bench.run import tokens_per_second

    records = [
        {"runner": "a", "new_tokens": 10, "seconds": 1.0},
        {"runner": "b", "new_tokens": 30, "seconds": 1.0},
        {"runner": "a", "new_tokens": 20, "seconds": 0.5},
    ]
    assert tokens_per_second(records) == {"a": 20.0, "b": 30.0}  # (10 + 20) / 1.5, not the mean of 10 and 40


def test_tokens_per_call_sums_each_runners_prompts():
    from draftverify.bench.run import tokens_per_call

    records = [
        {"runner": "a", "new_tokens": 4, "target_calls": 2},
        {"runner": "a", "new_tokens": 2, "target_calls": 2},
        {"runner": "b", "new_tokens": 0, "target_calls": 0},
    ]
    assert tokens_per_call(records) == {"a": 6 / 4, "b": 0.0}  # summed, not averaged; no call: 0, not an error
