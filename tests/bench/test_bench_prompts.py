"""Prompt sets: HumanEval and Spec-Bench shipped in the package or from a data folder, clear errors for missing files
and bad names."""

from __future__ import annotations

import gzip

import pytest
from bench_fixtures import HUMANEVAL, data_dir  # noqa: F401  (fixture)

from draftverify import DraftVerifyError
from draftverify.bench.prompts import HUMANEVAL_STOPS, PACKAGED_DATA, default_data_dir, load_prompts, truncate_at_stops


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


def test_unknown_prompt_set_is_an_error(data_dir):
    with pytest.raises(DraftVerifyError, match="unknown prompt set 'mbpp'"):
        load_prompts("mbpp", data_dir)


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
