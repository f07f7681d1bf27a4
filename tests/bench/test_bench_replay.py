"""`draftverify bench replay`: the same prompts twice in one process; suffix drafts the second pass from the first."""

from __future__ import annotations

import json

from bench_fixtures import data_dir, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.bench.replay import differences, summarize
from draftverify.cli import app


def test_the_second_pass_of_suffix_is_drafted_from_the_first(model_dir, data_dir, tmp_path):  # noqa: F811
    args = ["bench", "replay", "--target", str(model_dir / "target"), "--num-prompts", "2", "-n", "16"]
    args += ["--data-dir", str(data_dir), "--out", str(tmp_path), "--name", "replay"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "replay.json").read_text())
    assert report["differences"] == [] and report["prompt_ids"] == ["HumanEval/0", "HumanEval/1"]
    rows = {(r["method"], r["pass"]): r for r in report["rows"]}
    assert set(rows) == {(m, p) for m in ("autoregressive", "prompt_lookup", "suffix") for p in (1, 2)}
    assert all(r["new_tokens"] == 32 for r in rows.values())
    # prompt lookup sees the current prompt only: the same calls on both passes; suffix reads the first pass
    assert rows["prompt_lookup", 2]["target_calls"] == rows["prompt_lookup", 1]["target_calls"]
    assert rows["suffix", 2]["tokens_per_call"] > rows["prompt_lookup", 2]["tokens_per_call"]
    assert rows["suffix", 2]["target_calls"] < rows["suffix", 1]["target_calls"]
    ratio = {r["pass"]: r for r in report["ratios"]}[2]
    suffix, lookup = rows["suffix", 2], rows["prompt_lookup", 2]
    assert ratio["tokens_per_call"] == suffix["tokens_per_call"] / lookup["tokens_per_call"]
    markdown = (tmp_path / "replay.md").read_text()
    assert "draftverify bench replay" in markdown and "| 2 | `suffix` |" in markdown
    assert f"| 2 | {ratio['tokens_per_call']:.2f}x |" in markdown


def test_a_text_that_differs_is_reported():
    records = [
        {
            "method": m,
            "pass": p,
            "prompt_index": 0,
            "prompt_id": "a",
            "new_ids": ids,
            "new_tokens": 2,
            "target_calls": 2,
            "drafted": 0,
            "accepted": 0,
            "seconds": 1.0,
        }
        for m, p, ids in (("autoregressive", 1, [1, 2]), ("suffix", 1, [1, 2]), ("suffix", 2, [1, 3]))
    ]
    assert differences(records, "autoregressive") == ["suffix pass 2 prompt a"]
    rows = summarize(records, ("autoregressive", "suffix"), 2)
    assert [(r["method"], r["pass"], r["prompts"]) for r in rows] == [
        ("autoregressive", 1, 1),
        ("suffix", 1, 1),
        ("autoregressive", 2, 0),
        ("suffix", 2, 1),
    ]


def test_bad_methods_are_refused_in_one_line(tmp_path):
    for methods in ("suffix,nope", "suffix,suffix"):
        result = CliRunner().invoke(app, ["bench", "replay", "--methods", methods, "--out", str(tmp_path)])
        assert result.exit_code == 2
        assert "error:" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())
