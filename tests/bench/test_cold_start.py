"""`draftverify bench cold-start`: one `draftverify generate` per fresh process."""

from __future__ import annotations

import json

import pytest
from bench_fixtures import model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.bench.cold_start import config_arguments
from draftverify.cli import app
from draftverify.errors import DraftVerifyError


def test_configurations_are_generate_arguments():
    assert config_arguments("default") == []
    assert config_arguments("model:auto") == ["--method", "model", "--gamma", "auto"]
    assert config_arguments("autoregressive") == ["--method", "autoregressive"]
    with pytest.raises(DraftVerifyError, match="METHOD"):
        config_arguments(":4")


def test_bench_cold_start_runs_fresh_processes_and_takes_ratios_to_the_first(model_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "cold-start",
        "--target",
        str(model_dir / "target"),
        "--configs",
        "autoregressive,prompt_lookup:4",
        "--runs",
        "1",
        "--prompts",
        "1",
        "-n",
        "6",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "cold-start.json").read_text())
    assert list(saved["summary"]) == ["autoregressive", "prompt_lookup:4"] and saved["reference"] == "autoregressive"
    assert saved["summary"]["autoregressive"]["ratio_to_reference"] == 1.0
    assert saved["summary"]["autoregressive"]["median_tokens_per_call"] == 1.0  # one token per target call
    run = saved["runs"]["prompt_lookup:4"][0]
    assert run["new_tokens"] == 6 and run["process_seconds"] > run["generate_seconds"] > 0
    assert "--configs autoregressive,prompt_lookup:4" in (tmp_path / "cold-start.md").read_text()


def test_bench_cold_start_refuses_a_prompt_count_it_does_not_have(tmp_path):
    result = CliRunner().invoke(app, ["bench", "cold-start", "--prompts", "3", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--prompts 1..2" in result.output
