"""`draftverify bench rounds`: head-to-head ratios over rounds, through the real command."""

from __future__ import annotations

import json

import pytest
from bench_fixtures import data_dir, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.bench.rounds import DEFAULT_PAIRS, family, parse_pairs
from draftverify.cli import app
from draftverify.errors import DraftVerifyError


def test_bench_rounds_measures_each_pair_every_round(model_dir, data_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "rounds",
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--pairs",
        "model[g=4]/hf_assisted[g=4]",
        "--backend",
        "hf",
        "--gamma",
        "4",
        "--rounds",
        "2",
        "--num-prompts",
        "1",
        "-n",
        "6",
        "--threads",
        "1",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "bench-rounds.json").read_text())
    assert saved["rows"] == ["hf_assisted[g=4]", "model[g=4]"] or saved["rows"] == ["model[g=4]", "hf_assisted[g=4]"]
    assert len(saved["rounds"]) == 2
    pair = saved["pairs"][0]
    ratios = [r["model[g=4]"] / r["hf_assisted[g=4]"] for r in saved["rounds"]]
    assert pair["low"] == min(ratios) and pair["high"] == max(ratios)
    assert "`model[g=4]` | `hf_assisted[g=4]`" in (tmp_path / "bench-rounds.md").read_text()


def test_bench_rounds_names_the_rows_when_a_pair_names_none(model_dir, data_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "rounds",
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--pairs",
        "model[g=9]/hf_assisted[g=4]",
        "--backend",
        "hf",
        "--gamma",
        "4",
        "--rounds",
        "1",
        "--num-prompts",
        "1",
        "-n",
        "4",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "no bench row named model[g=9]" in result.output
    assert "model[g=4]" in result.output and not (tmp_path / "bench-rounds.json").exists()


def test_pairs_and_families():
    assert parse_pairs("a[x]/b, c/d") == [("a[x]", "b"), ("c", "d")]
    for bad in ("a", "a/b/c", "/b", ""):
        with pytest.raises(DraftVerifyError, match="OURS/PEER"):
            parse_pairs(bad)
    assert {family(n) for pair in parse_pairs(",".join(DEFAULT_PAIRS)) for n in pair} == {
        "model",
        "model_aligned",
        "llamacpp",
        "llamacpp_prompt_lookup",
        "hf_assisted",
    }
