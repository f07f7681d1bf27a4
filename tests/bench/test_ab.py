"""`draftverify bench ab`: public options side by side, through the real command, and its parts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from bench_fixtures import data_dir, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.bench.ab import alternating_rounds, parse_assignments, settings_from, summarize
from draftverify.cli import app
from draftverify.errors import DraftVerifyError


def test_bench_ab_runs_every_setting_of_a_declared_option_and_writes_its_table(model_dir, data_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "ab",
        "--target",
        str(model_dir / "target"),
        "--set",
        f"draft={model_dir / 'draft'}",
        "--set",
        "gamma=4",
        "--vary",
        "lookup-confirms=false,true",
        "--vary",
        "lookup_tokens=0,5",
        "--num-prompts",
        "1",
        "-n",
        "8",
        "--rounds",
        "2",
        "--warmup-tokens",
        "0",
        "--threads",
        "1",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
        "--name",
        "ab",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "ab.json").read_text())
    settings = [row["setting"] for row in saved["rows"]]
    assert settings == [{"lookup_confirms": c, "lookup_tokens": k} for c in (False, True) for k in (0, 5)]
    assert saved["rows"][0]["vs_reference"] == 1.0 and len(saved["rounds"]) == 2
    # a fixed gamma: the same draft tokens whatever staged drafting does, so the same tokens per call
    assert len({row["tokens_per_call"] for row in saved["rows"]}) == 1
    by = {(r["setting"]["lookup_confirms"], r["setting"]["lookup_tokens"]): r for r in saved["rows"]}
    assert by[False, 5]["draft_calls"] <= by[False, 0]["draft_calls"]  # staged drafting never adds forwards
    text = (tmp_path / "ab.md").read_text()
    assert "--vary lookup-confirms=false,true" in text and "| lookup_confirms=True, lookup_tokens=5 |" in text


def test_assignments_take_public_options_only_and_parse_them_as_the_option_does():
    assert parse_assignments(["gamma=conf=0.9,4", "lookup-tokens=0,3", "lookup_confirms=off,ON"], many=True) == {
        "gamma": ["conf=0.9", 4],
        "lookup_tokens": [0, 3],
        "lookup_confirms": [False, True],
    }
    assert parse_assignments(["backend=llamacpp"], many=False) == {"backend": ["llamacpp"]}
    for bad, match in (
        (["nonsense=1,2"], "unknown option 'nonsense'"),
        (["lean_draft=true,false"], "not a declared"),
        (["lookup_confirms=maybe,true"], "is not a bool"),
        (["lookup_tokens=x,1"], "is not a int"),
        (["gamma"], "NAME=VALUE"),
        (["gamma=4,"], "NAME=VALUE"),
        (["gamma=4", "gamma=3"], "twice"),
    ):
        with pytest.raises(DraftVerifyError, match=match):
            parse_assignments(bad, many=True)
    with pytest.raises(DraftVerifyError, match="at least two values"):
        settings_from({"gamma": [4]})
    assert settings_from({"a": [1, 2], "b": ["x", "y"]})[1] == {"a": 1, "b": "y"}  # the first varies slowest


def fake_result(text: str, tokens: int = 4, calls: int = 2, seconds: float = 1.0):
    stats = SimpleNamespace(new_tokens=tokens, target_calls=calls, draft_calls=3, time_total=seconds)
    return SimpleNamespace(text=text, output=SimpleNamespace(stats=stats))


def test_rounds_rotate_the_order_prompt_by_prompt_and_stop_on_a_different_text():
    order = []

    def generate(s, text):
        order.append((text, s))
        return fake_result("same")

    alternating_rounds(generate, 2, ["p", "q"], 2, check_text=True, first=0)
    assert order == [("p", 0), ("p", 1), ("q", 1), ("q", 0), ("p", 1), ("p", 0), ("q", 0), ("q", 1)]
    with pytest.raises(DraftVerifyError, match="prompt 7: the settings gave different texts"):
        alternating_rounds(lambda s, text: fake_result(str(s)), 2, ["p"], 1, check_text=True, first=7)
    alternating_rounds(lambda s, text: fake_result(str(s)), 2, ["p"], 1, check_text=False, first=0)


def test_summary_ratios_are_per_round_medians_over_the_first_setting():
    rounds = [
        [[10, 5, 3, 1.0], [10, 2, 3, 0.5]],
        [[10, 5, 3, 1.0], [10, 2, 3, 0.25]],
        [[10, 5, 3, 2.0], [10, 2, 3, 1.0]],
    ]
    rows = summarize(rounds, [{"k": 0}, {"k": 1}])
    assert rows[0]["vs_reference"] == 1.0 and rows[1]["vs_reference"] == 2.0
    assert rows[1]["vs_reference_range"] == [2.0, 4.0] and rows[1]["tokens_per_second"] == 20.0
    assert rows[0]["tokens_per_call"] == 2.0 and rows[1]["tokens_per_call"] == 5.0 and rows[1]["draft_calls"] == 3


def test_structured_output_is_one_kind_and_its_value_or_a_file(tmp_path):
    from draftverify.bench.ab import parse_structured

    assert parse_structured("regex=( {4}.*\\n){1,3}").regex == "( {4}.*\\n){1,3}"
    assert parse_structured("json_object=true").json_object is True
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    assert parse_structured(f"json_schema=@{schema}").json_schema == '{"type":"object"}'
    for bad, message in (
        ("regex", "not KIND=VALUE"),
        ("choice=a,b", "not KIND=VALUE"),
        ("json_object=no", "takes true"),
        (f"grammar=@{tmp_path / 'none.ebnf'}", "cannot read"),
        ("json_schema={nope", "not valid JSON"),
    ):
        with pytest.raises(DraftVerifyError, match=message):
            parse_structured(bad)
