"""`draftverify reproduce healing`: HumanEval trimmed vs as published, healing off and on, through the real command."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bench.bench_fixtures import HUMANEVAL, data_dir, model_dir  # noqa: F401  (fixtures)
from draftverify.api import load
from draftverify.bench.prompts import HUMANEVAL_STOPS, truncate_at_stops
from draftverify.bench.quality import chrf
from draftverify.cli import app


def test_bench_healing_writes_the_table_and_its_rows_are_the_librarys_texts(model_dir, data_dir, tmp_path):  # noqa: F811
    args = [
        "reproduce",
        "healing",
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--methods",
        "model",
        "--num-prompts",
        "3",
        "--max-new-tokens",
        "12",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
        "--name",
        "heal",
        "--threads",
        "1",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| published | on | `autoregressive` |" in result.stdout
    saved = json.loads((tmp_path / "heal.json").read_text())
    rows = {(r["runner"], r["form"], r["heal"]): r for r in saved["rows"]}
    assert set(rows) == {("autoregressive", f, h) for f in ("trimmed", "published") for h in (False, True)} | {
        ("model", "published", h) for h in (False, True)
    }
    pipe = load(target=model_dir / "target", method="autoregressive")
    for heal in (False, True):
        row = rows[("autoregressive", "published", heal)]
        expected = [pipe.generate(r["prompt"], max_new_tokens=12, heal=heal).text for r in HUMANEVAL]
        assert row["texts"] == expected
        score = chrf(
            [truncate_at_stops(t, HUMANEVAL_STOPS) for t in expected], [r["canonical_solution"] for r in HUMANEVAL]
        )
        assert row["chrf_reference"] == score
        assert row["healed_prompts"] == (3 if heal else 0)  # every prompt ends in "\n", which longer tokens extend
        newline = pipe.tokenizer("\n").input_ids
        changed = sum(ids[:1] != newline for ids in row["new_ids"])
        assert row["first_token_changed"] == (changed if heal else None)
        assert rows[("model", "published", heal)]["equal_to_baseline"] == 3  # lossless: healed vs healed
    trimmed = rows[("autoregressive", "trimmed", False)]
    assert trimmed["texts"] == [pipe.generate(r["prompt"].rstrip("\n"), max_new_tokens=12).text for r in HUMANEVAL]
    markdown = (tmp_path / "heal.md").read_text()
    assert "draftverify reproduce healing" in markdown and "| trimmed | off | `autoregressive` |" in markdown


def test_bench_healing_rejects_an_unknown_method_before_loading(model_dir, tmp_path):  # noqa: F811
    result = CliRunner().invoke(
        app,
        ["reproduce", "healing", "--target", str(model_dir / "target"), "--methods", "medusa", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2 and "unknown method" in result.stderr
