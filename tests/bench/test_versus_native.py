"""`draftverify bench native`: each side's best row per prompt set and target file. The finalist choice, the
exactness reading and the ratios on made-up records; bad options refused with one line before any model loads; and,
with llama.cpp's tools built, one small cell on the zoo through the real command, resumed by a rerun."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from typer.testing import CliRunner

from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench.native_spec import SWEEP, SWEEP_SPECS, native_specs
from draftverify.bench.versus_native import (
    NATIVE_PLAIN,
    OURS_PLAIN,
    exact_rows,
    pick_finalists,
    render,
    summarize,
)
from draftverify.cli import app

FAST, SLOW = "llamacpp:suffix[conf]", "llamacpp:model[conf]"
NATIVE_FAST, NATIVE_SLOW = "llamacpp_native[ngram-mod]", "llamacpp_native[draft-simple,n_max=8,p_min=0,draft=draft]"


def records(texts: dict[str, list[list[int]]], calls: int = 1) -> list[dict]:
    return [
        {"runner": row, "prompt_index": i, "new_ids": ids, "new_tokens": len(ids), "target_calls": calls}
        for row, per_prompt in texts.items()
        for i, ids in enumerate(per_prompt)
    ]


def test_each_row_is_read_against_its_own_sides_plain_text():
    plain = [[1, 2, 3], [4, 5]]
    got = exact_rows(
        records({OURS_PLAIN: plain, NATIVE_PLAIN: plain, FAST: plain, SLOW: [[1, 2, 3], [4, 6]], NATIVE_FAST: plain})
    )
    assert got == {OURS_PLAIN: True, NATIVE_PLAIN: True, FAST: True, SLOW: False, NATIVE_FAST: True}
    # a native row is read against llama.cpp's plain text, not ours; the plain rows against each other
    got = exact_rows(records({OURS_PLAIN: plain, NATIVE_PLAIN: [[1, 2, 3], [4, 6]], NATIVE_FAST: [[1, 2, 3], [4, 6]]}))
    assert got == {OURS_PLAIN: False, NATIVE_PLAIN: False, NATIVE_FAST: True}


def test_finalists_are_each_sides_fastest_and_ours_only_among_exact_rows():
    speeds = {OURS_PLAIN: 99.0, NATIVE_PLAIN: 98.0, FAST: 50.0, SLOW: 90.0, NATIVE_FAST: 40.0, NATIVE_SLOW: 30.0}
    exact = {row: True for row in speeds} | {SLOW: False, NATIVE_FAST: False}
    # SLOW is faster but not exact: left out; the native side keeps its fastest whatever its text
    assert pick_finalists(speeds, exact, 1) == [FAST, NATIVE_FAST]
    assert pick_finalists(speeds, exact, 2) == [FAST, NATIVE_FAST, NATIVE_SLOW]


def test_the_best_rows_are_the_finalists_with_the_highest_median_round():
    rounds = [
        {OURS_PLAIN: 10.0, NATIVE_PLAIN: 10.0, FAST: 30.0, SLOW: 20.0, NATIVE_FAST: 20.0},
        {OURS_PLAIN: 9.0, NATIVE_PLAIN: 10.0, FAST: 24.0, SLOW: 28.0, NATIVE_FAST: 20.0},
        {OURS_PLAIN: 11.0, NATIVE_PLAIN: 10.0, FAST: 26.0, SLOW: 21.0, NATIVE_FAST: 10.0},
    ]
    got = summarize(rounds, [FAST, SLOW, NATIVE_FAST])
    assert got["median_tokens_per_second"][FAST] == 26.0
    assert got["best"]["ours"] == FAST and got["best"]["peer"] == NATIVE_FAST
    assert got["best"]["ratio"] == 1.5 and got["best"]["low"] == 1.2 and got["best"]["high"] == 2.6
    assert got["plain"] == {"ours": OURS_PLAIN, "peer": NATIVE_PLAIN, "ratio": 1.0, "low": 0.9, "high": 1.1}
    assert summarize(rounds, [FAST])["best"] is None  # no native finalist: no ratio


def test_a_cell_without_an_exact_row_of_ours_still_names_llama_cpps_best_row():
    rounds = [{OURS_PLAIN: 9.0, NATIVE_PLAIN: 10.0, NATIVE_FAST: 20.0, NATIVE_SLOW: 15.0}] * 3
    finalists = [NATIVE_SLOW, NATIVE_FAST]  # none of ours: every one of our rows wrote another text somewhere
    cell = {"target_gguf": "q4_k_m", "prompts": "humaneval", "num_prompts": 2, "finalists": finalists, "sweep": []}
    cell |= {"rounds": rounds, "exact": {row: True for row in rounds[0]}, **summarize(rounds, finalists)}
    settings = {"threads": 2, "num_prompts": 2, "max_new_tokens": 8, "finalists": 2, "rounds": 3}
    machine = {"cpu_model": "cpu", "cores": 2}
    text = render({"command": "c", "date": "d", "machine": machine, "settings": settings, "cells": [cell]})
    row = next(line for line in text.splitlines() if line.startswith("| q4_k_m"))
    assert f"`{NATIVE_FAST}` | 20.0 | none exact | - | - |" in row


def test_the_sweep_names_every_native_setting_once_and_each_parses():
    specs = native_specs((SWEEP,))
    assert [s.name for s in specs] == [native_specs((text,))[0].name for text in SWEEP_SPECS]
    assert len({s.name for s in specs}) == len(SWEEP_SPECS)
    assert specs[0].name == NATIVE_PLAIN
    assert {s.draft for s in specs if s.needs_draft} == {"draft", "aligned"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rounds", "0"], "--rounds must be a whole number >= 1"),
        (["--finalists", "0"], "--finalists must be a whole number >= 1"),
        (["--native", "llamacpp:suffix"], "--native names no llamacpp_native[...] row"),
        (["--native", "llamacpp_native[ngram-nope]"], "unknown type 'ngram-nope'"),
        (["--target-gguf", "q3_x"], "q3_x"),
        (["--methods", "nope"], "nope"),
        (["--prompts", "spec_bench:nope"], "Spec-Bench has no category 'nope'"),
    ],
)
def test_bad_options_exit_2_with_one_line_before_any_model_loads(extra, message, tmp_path):
    result = CliRunner().invoke(app, ["bench", "native", "--out", str(tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason="llama.cpp's tools are not built (scripts/build_llama_cpp_tools.sh) or the llamacpp extra is absent",
)
def test_one_cell_on_the_zoo_a_rerun_resumes_and_fresh_measures_again(tmp_path, tmp_path_factory, monkeypatch):
    if not os.environ.get("DRAFTVERIFY_GGUF_CACHE"):
        monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path_factory.mktemp("versus-gguf")))
    args = [
        "bench",
        "native",
        "--prompts",
        "humaneval",
        "--target-gguf",
        "f32",
        "--methods",
        "suffix,suffix_aligned",
        "--gamma",
        "conf",
        "--native",
        "llamacpp_native[ngram-mod]",
        "--rounds",
        "2",
        "--finalists",
        "1",
        "--num-prompts",
        "1",
        "-n",
        "8",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "note: suffix_aligned skipped: suffix runs no draft model" in result.output  # not dropped silently
    saved = json.loads((tmp_path / "bench-native.json").read_text())
    (cell,) = saved["cells"]
    assert (cell["target_gguf"], cell["prompts"], cell["num_prompts"]) == ("f32", "humaneval", 1)
    assert cell["finalists"] == ["llamacpp:suffix[conf]", "llamacpp_native[ngram-mod]"]
    assert len(cell["rounds"]) == 2 and set(cell["rounds"][0]) == {*cell["finalists"], OURS_PLAIN, NATIVE_PLAIN}
    assert all(cell["exact"].values()), cell["exact"]  # f32: every row keeps the greedy text
    assert cell["best"]["ours"] == "llamacpp:suffix[conf]" and cell["best"]["peer"] == "llamacpp_native[ngram-mod]"
    text = (tmp_path / "bench-native.md").read_text()
    assert "| f32 | humaneval |" in text
    assert "Our rows' llama.cpp library: " in text and "flash attention on" in text  # llama.cpp's default
    again = CliRunner().invoke(app, args)  # the same settings: the cell is kept, nothing measured
    assert again.exit_code == 0, again.output
    assert "sweep:" not in again.output
    assert json.loads((tmp_path / "bench-native.json").read_text())["cells"] == saved["cells"]
    anew = CliRunner().invoke(app, [*args, "--fresh"])  # after a code change: every cell measured again
    assert anew.exit_code == 0, anew.output
    assert "sweep:" in anew.output
    assert len(json.loads((tmp_path / "bench-native.json").read_text())["cells"]) == 1
    off = CliRunner().invoke(app, [*args, "--no-flash-attn"])  # other settings: not the file's cells
    assert off.exit_code == 0, off.output
    assert "sweep:" in off.output
    saved = json.loads((tmp_path / "bench-native.json").read_text())
    assert saved["settings"]["flash_attn"] is False and len(saved["cells"]) == 1
    assert "flash attention off" in (tmp_path / "bench-native.md").read_text()
