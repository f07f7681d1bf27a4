"""Prompt sets: HumanEval and Spec-Bench shipped in the package or from a data folder, clear errors for missing files
and bad names."""

from __future__ import annotations

import gzip
import json

import pytest
from bench_fixtures import HUMANEVAL, data_dir, model_args, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.bench.prompts import (
    HUMANEVAL_STOPS,
    PACKAGED_DATA,
    default_data_dir,
    load_prompts,
    prompt_set_name,
    truncate_at_stops,
)
from draftverify.cli import app


def test_humaneval_prompts_keep_the_canonical_solution_as_reference(data_dir):
    prompts = load_prompts("humaneval", data_dir)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    # the final newline is left to the model (BPE merges it with the body's indentation)
    assert [p.text for p in prompts] == [r["prompt"].rstrip("\n") for r in HUMANEVAL]
    assert all(not p.text.endswith("\n") for p in prompts)
    assert [p.reference for p in prompts] == [r["canonical_solution"] for r in HUMANEVAL]


def test_humaneval_published_keeps_the_prompts_as_published(data_dir):
    prompts = load_prompts("humaneval:published", data_dir)
    assert [p.text for p in prompts] == [r["prompt"] for r in HUMANEVAL]
    assert all(p.text.endswith("\n") for p in prompts)
    assert [p.reference for p in prompts] == [r["canonical_solution"] for r in HUMANEVAL]


def test_spec_bench_category_takes_the_first_turn(data_dir):
    prompts = load_prompts("spec_bench:translation", data_dir)
    assert [p.text for p in prompts] == [
        "Translate German to English: Guten Tag .",
        "Translate German to English: Danke .",
    ]
    assert [p.reference for p in prompts] == ["Good day .", None]
    mt = load_prompts("spec_bench:mt_bench", data_dir)  # the MT-Bench categories (writing, ...)
    assert [p.text for p in mt] == ["Write a haiku."]
    assert len(load_prompts("spec_bench", data_dir)) == 4


def test_unknown_spec_bench_category_lists_the_categories(data_dir):
    with pytest.raises(DraftVerifyError, match="no category 'poetry'.*translation"):
        load_prompts("spec_bench:poetry", data_dir)


def test_a_name_that_is_neither_a_prompt_set_nor_a_file_is_an_error(data_dir):
    with pytest.raises(DraftVerifyError, match="--prompts mbpp: not a prompt set .* and no such file"):
        load_prompts("mbpp", data_dir)
    with pytest.raises(DraftVerifyError, match="--prompts is empty"):
        load_prompts(" ", data_dir)
    with pytest.raises(DraftVerifyError, match="unknown prompt set 'humaneval:plus'"):
        load_prompts("humaneval:plus", data_dir)


def test_missing_file_names_the_path_and_the_option(tmp_path):
    with pytest.raises(DraftVerifyError) as err:
        load_prompts("humaneval", tmp_path)
    assert str(tmp_path / "humaneval" / "HumanEval.jsonl.gz") in str(err.value)
    assert "--data-dir" in str(err.value)


def test_data_dir_defaults_to_the_environment_variable(monkeypatch, data_dir):
    monkeypatch.setenv("DRAFTVERIFY_DATA", str(data_dir))
    assert default_data_dir() == data_dir
    assert len(load_prompts("humaneval")) == 3
    monkeypatch.delenv("DRAFTVERIFY_DATA")
    assert default_data_dir() == PACKAGED_DATA


def test_the_package_ships_both_prompt_sets_with_their_licences(monkeypatch):
    monkeypatch.delenv("DRAFTVERIFY_DATA", raising=False)
    humaneval = load_prompts("humaneval")
    assert len(humaneval) == 164 and humaneval[0].id == "HumanEval/0" and humaneval[0].reference
    assert len(load_prompts("spec_bench")) == 480
    assert len(load_prompts("spec_bench:translation")) == 80 and len(load_prompts("spec_bench:mt_bench")) == 80
    assert "MIT License" in (PACKAGED_DATA / "humaneval" / "LICENSE").read_text()
    assert "Apache License" in (PACKAGED_DATA / "spec_bench" / "LICENSE").read_text()
    attribution = (PACKAGED_DATA / "README.md").read_text()
    assert "openai/human-eval" in attribution and "hemingkx/Spec-Bench" in attribution


def test_a_gzipped_spec_bench_copy_reads_like_the_upstream_file(tmp_path, data_dir):
    assert (data_dir / "spec_bench" / "question.jsonl").is_file()  # upstream's layout, as in ../shared/data
    with gzip.open(tmp_path / "question.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write((data_dir / "spec_bench" / "question.jsonl").read_text())
    (tmp_path / "spec_bench").mkdir()
    (tmp_path / "question.jsonl.gz").rename(tmp_path / "spec_bench" / "question.jsonl.gz")
    assert load_prompts("spec_bench", tmp_path) == load_prompts("spec_bench", data_dir)


def test_completions_are_cut_at_humaneval_stop_sequences():
    stops = HUMANEVAL_STOPS
    assert truncate_at_stops("    return 1\n\ndef g():\n    pass", stops) == "    return 1\n"
    assert truncate_at_stops("    return 1\n", stops) == "    return 1\n"


def test_own_prompts_from_jsonl_keep_their_ids_references_and_newlines(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "def f(x):\n    return", "id": "a", "reference": " x"}, {"prompt": "import os\n"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts(str(path))
    assert [(p.id, p.text, p.reference) for p in prompts] == [
        ("a", "def f(x):\n    return", " x"),
        ("mine/1", "import os\n", None),
    ]
    assert prompt_set_name(str(path)) == "mine"


def test_own_prompts_from_text_are_one_per_non_empty_line(tmp_path):
    path = tmp_path / "questions.txt"
    path.write_text("What is a KV cache?\n\n  Why draft tokens?\n")
    assert [p.text for p in load_prompts(str(path))] == ["What is a KV cache?", "  Why draft tokens?"]
    assert prompt_set_name(str(path)) == "questions"
    assert prompt_set_name("spec_bench:coding") == "spec_bench-coding"


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.txt", "\n\n", "holds no prompt"),
        ("bad.jsonl", '{"text": "no prompt field"}\n', "record 0 has no non-empty 'prompt' string"),
        ("broken.jsonl", "{not json\n", "broken.jsonl:1 is not valid JSON"),
        ("binary.txt", b"\xff\xfe\x00", "is not UTF-8 text"),
    ],
)
def test_bad_prompt_files_say_what_is_wrong(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DraftVerifyError, match=message):
        load_prompts(str(path))


def test_bench_runs_on_own_prompts_and_names_its_files_after_them(model_dir, tmp_path):  # noqa: F811
    path = tmp_path / "my-prompts.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):", "id": "add"}) + "\n")
    args = ["bench", "speed", "--quick", *model_args(model_dir), "--prompts", str(path), "--runners", "prompt_lookup"]
    args += ["--out", str(tmp_path / "out"), "--threads", "1", "--no-progress", "--no-plots"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "out" / "bench-my-prompts-quick.json").read_text())
    assert [p["id"] for p in payload["prompts"]] == ["add"]
    bad = CliRunner().invoke(app, ["bench", "speed", "--quick", "--prompts", str(tmp_path / "missing.jsonl")])
    assert bad.exit_code == 2 and "no such file" in bad.output
