"""bench batch on tiny models: every runner at every batch size, rows equal to their batch-1 texts, files written."""

from __future__ import annotations

import json

import pytest
from serve_fixtures import make_models

from draftverify import DraftVerifyError
from draftverify.bench.batch import main, parse_runner, parse_sizes


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("bench-batch"), chat_template=False)


def test_bench_batch_writes_every_runner_and_batch_size(models, tmp_path):
    results = main(
        None,
        str(models / "target"),
        str(models / "draft"),
        ["model", "prompt_lookup"],
        [1, 2, 4],
        "humaneval",
        4,
        6,
        tmp_path,
        "bb",
        threads=1,
        echo=lambda line: None,
    )
    assert [(r.runner, r.batch_size) for r in results] == [
        (name, b) for name in ("hf_generate", "ours_autoregressive", "model", "prompt_lookup") for b in (1, 2, 4)
    ]
    assert all(r.equal_rows == 4 for r in results if r.runner != "hf_generate")
    assert all(r.new_tokens > 0 and r.tokens_per_second > 0 for r in results)
    assert all(r.speedup_vs_hf is not None for r in results)
    data = json.loads((tmp_path / "bb.json").read_text())
    assert len(data["rows"]) == 12 and data["meta"]["batch_sizes"] == [1, 2, 4]
    assert "| ours_autoregressive | 4 |" in (tmp_path / "bb.md").read_text()


def test_bench_batch_runs_a_method_at_several_draft_lengths_and_reports_the_mean_gamma(models, tmp_path):
    results = main(
        None,
        str(models / "target"),
        str(models / "draft"),
        ["model", "model[auto]", "model[g=2]"],
        [1, 2],
        "humaneval",
        2,
        8,
        tmp_path,
        "bb",
        threads=1,
        echo=lambda line: None,
        gamma=3,
    )
    by = {(r.runner, r.batch_size): r for r in results}
    assert [name for name, b in by if b == 1] == [
        "hf_generate",
        "ours_autoregressive",
        "model",
        "model[auto]",
        "model[g=2]",
    ]
    assert all(r.equal_rows == 2 for r in results if r.runner != "hf_generate")
    assert all(by[(n, b)].mean_gamma is None for n in ("hf_generate", "ours_autoregressive") for b in (1, 2))
    for b in (1, 2):  # the cap at the tokens left can only shorten a fixed gamma
        assert 2 < by[("model", b)].mean_gamma <= 3 and 1 < by[("model[g=2]", b)].mean_gamma <= 2
        assert 0 <= by[("model[auto]", b)].mean_gamma <= 16
    table = (tmp_path / "bb.md").read_text()
    assert "| mean gamma |" in table and f"| {by[('model[g=2]', 1)].mean_gamma:.2f} |" in table
    assert json.loads((tmp_path / "bb.json").read_text())["rows"][-1]["mean_gamma"] == by[("model[g=2]", 2)].mean_gamma


def test_runner_spellings():
    assert parse_runner("lookup_model", 4) == ("lookup_model", "lookup_model", 4)
    assert parse_runner("lookup_model[auto]", 4)[1:] == ("lookup_model", "auto")
    assert parse_runner("model[g=7]", "auto")[1:] == ("model", 7)
    assert parse_runner("model[conf]", 4)[1:] == ("model", "conf")
    assert parse_runner("lookup_model[conf=0.3]", 4)[1:] == ("lookup_model", "conf=0.3")
    for bad in ("model[7]", "model[g=0]", "model[fast]", "model[auto", "[auto]", "model[conf=2]", "model[conf=]"):
        with pytest.raises(DraftVerifyError):
            parse_runner(bad, 4)


def test_bench_batch_argument_errors(models, tmp_path):
    with pytest.raises(DraftVerifyError, match="at least the largest batch size"):
        main(None, str(models / "target"), None, [], [1, 8], "humaneval", 4, 4, tmp_path, "x", None)
    with pytest.raises(DraftVerifyError, match="comma list of integers"):
        parse_sizes("1,two")
    with pytest.raises(DraftVerifyError, match="integers >= 1"):
        parse_sizes("0,1")
    with pytest.raises(DraftVerifyError, match="lists a runner twice"):
        main(
            None,
            str(models / "target"),
            None,
            ["prompt_lookup", "prompt_lookup"],
            [1],
            "humaneval",
            1,
            4,
            tmp_path,
            "x",
            None,
        )
