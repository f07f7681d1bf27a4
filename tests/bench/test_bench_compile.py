"""`draftverify bench speed --quick --compile` on tiny models: the same greedy tokens as the eager run, compiled in the
warm-up only, with the warm-up seconds recorded. Slow-ish (it compiles a few graphs): one gamma, one method, greedy."""

from __future__ import annotations

import json

import pytest
import torch
from bench_fixtures import data_dir, model_args, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.cli import app


def _bench(model_dir, data_dir, out, *extra) -> dict:
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
        "--no-plots",
        "--temperature",
        "0",
        "--gamma",
        "1",
        "--runners",
        "model",
        *extra,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(next(out.glob("*.json")).read_text())


@pytest.fixture(scope="module")
def runs(model_dir, data_dir, tmp_path_factory):  # noqa: F811
    torch.set_num_threads(1)
    eager = _bench(model_dir, data_dir, tmp_path_factory.mktemp("eager"))
    out = tmp_path_factory.mktemp("compiled")
    torch.compiler.reset()  # graphs an earlier test compiled would be reused, and the warm-up would compile nothing
    compiled = _bench(model_dir, data_dir, out, "--compile", "--name", "bench-humaneval-compiled")
    return eager, compiled, (out / "bench-humaneval-compiled.md").read_text()


def _ids(payload) -> dict:
    return {(m["runner"], m["prompt_index"]): m["new_ids"] for m in payload["measurements"]}


def test_compiled_run_gives_the_eager_greedy_tokens(runs):
    eager, compiled, _ = runs
    assert compiled["config"]["compile"] is True and eager["config"]["compile"] is False
    assert {r["runner"] for r in compiled["runners"]} == {r["runner"] for r in eager["runners"]}  # names unchanged
    assert {"ours_autoregressive", "model[g=1]"} <= {r["runner"] for r in compiled["runners"]}
    assert _ids(compiled) == _ids(eager)
    assert not compiled["warnings"], compiled["warnings"]


def test_compiled_run_compiles_in_the_warm_up_only_and_records_its_seconds(runs):
    _, compiled, markdown = runs
    specs = {s["name"]: s for s in compiled["runner_specs"]}
    assert specs["hf_generate"]["compiled"] is False  # peers stay eager
    for name in ("ours_autoregressive", "model[g=1]"):
        assert specs[name]["compiled"] is True
        assert specs[name]["warmup_seconds"] > 0
        assert specs[name]["timed_compiles"] == 0
    assert specs["ours_autoregressive"]["compiled_models"] == ["target"]
    assert specs["model[g=1]"]["compiled_models"] == ["target", "draft"]
    # widths 1 and 2 (gamma 1 verifies 2 tokens), compiled by the first runner; the draft (same shapes as the tiny
    # target) reuses those graphs; the timed generations compile nothing (the forward-counting hook is kept out)
    assert specs["ours_autoregressive"]["warmup_compiles"] >= 2
    assert "--compile" in compiled["command"]
    assert "Compiled (`--compile`)" in markdown and "## Warm-up and compilation" in markdown
