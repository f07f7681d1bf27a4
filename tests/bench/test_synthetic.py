"""`draftverify bench synthetic`: the synthetic rule as llama.cpp states it (its rates, what it keeps, how often),
bench-only (no method reaches it), bad options refused with one line, and, with llama.cpp's tools built, a tiny
random shape through both loops: at alpha 0 every call keeps one token, at alpha 1 every draft is kept."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest
import torch
from typer.testing import CliRunner

from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench.synthetic import (
    SHAPES,
    Shape,
    SideLengths,
    SyntheticVerifier,
    alpha_rates,
    conditional_rates,
    draft_shape,
    render,
    run_synthetic,
)
from draftverify.cli import app
from draftverify.errors import DraftVerifyError
from draftverify.methods import MethodOptions, build_verifier
from draftverify.types import Draft, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def logits_choosing(choices: list[list[int]], vocab: int = 16) -> torch.Tensor:
    """[B, N+1, V] logits whose argmax at each position is choices[b][i]."""
    out = torch.zeros(len(choices), len(choices[0]), vocab)
    for b, row in enumerate(choices):
        for i, token in enumerate(row):
            out[b, i, token] = 1.0
    return out


def test_rates_are_llama_cpps_conditional_chances():
    assert alpha_rates(0.5, 3) == (0.5, 0.25, 0.125)
    assert conditional_rates((0.8, 0.4, 0.4, 0.0)) == [0.8, 0.5, 1.0, 0.0]
    assert conditional_rates((0.0, 0.0)) == [0.0, 0.0]  # nothing after a position never kept


def test_all_kept_or_none_kept_then_the_targets_own_token():
    draft = Draft(tokens=torch.tensor([[3, 4, 5], [6, 7, 8]]))
    logits = logits_choosing([[1, 2, 9, 10], [11, 12, 13, 14]])
    kept = SyntheticVerifier((1.0, 1.0, 1.0), random.Random(0)).verify(draft, logits, GREEDY, None)
    assert kept.rows == [[3, 4, 5, 10], [6, 7, 8, 14]] and kept.accepted == [3, 3]
    none = SyntheticVerifier((0.0, 0.0, 0.0), random.Random(0)).verify(draft, logits, GREEDY, None)
    assert none.rows == [[1, -1, -1, -1], [11, -1, -1, -1]] and none.accepted == [0, 0]


def test_a_row_keeps_nothing_past_its_own_draft_length():
    draft = Draft(tokens=torch.tensor([[3, 4, 5], [6, 7, 0]]), lengths=torch.tensor([3, 2]))
    verdict = SyntheticVerifier((1.0, 1.0, 1.0), random.Random(0)).verify(
        draft, logits_choosing([[1, 2, 9, 10], [11, 12, 13, 14]]), GREEDY, None
    )
    assert verdict.accepted == [3, 2] and verdict.rows[1] == [6, 7, 13, -1]


def test_the_mean_kept_length_is_the_geometric_one():
    alpha, gamma, steps = 0.7, 4, 4000
    verifier = SyntheticVerifier(alpha_rates(alpha, gamma), random.Random(1))
    draft = Draft(tokens=torch.ones(1, gamma, dtype=torch.long))
    logits = torch.zeros(1, gamma + 1, 4)
    kept = [verifier.verify(draft, logits, GREEDY, None).accepted[0] for _ in range(steps)]
    expected = sum(alpha**i for i in range(1, gamma + 1))  # E[kept] = alpha + alpha^2 + ... + alpha^gamma
    spread = (sum((k - expected) ** 2 for k in kept) / steps) ** 0.5
    assert abs(sum(kept) / steps - expected) < 4 * spread / steps**0.5
    assert [kept.count(k) for k in range(gamma + 1)][0] == pytest.approx(steps * (1 - alpha), rel=0.1)


def test_no_method_reaches_the_synthetic_rule():
    with pytest.raises(DraftVerifyError, match="synthetic"):
        build_verifier("synthetic", GREEDY, MethodOptions())


def test_the_shapes_are_the_published_ones_and_their_drafts_share_the_vocabulary():
    qwen, llama = SHAPES["qwen2.5-0.5b"], SHAPES["llama-3.2-1b"]
    assert (qwen.hidden, qwen.layers, qwen.heads, qwen.kv_heads, qwen.vocab) == (896, 24, 14, 2, 151936)
    assert (llama.hidden, llama.layers, llama.heads, llama.kv_heads, llama.vocab) == (2048, 16, 32, 8, 128256)
    for shape in (qwen, llama):
        draft = draft_shape(shape)
        assert draft.vocab == shape.vocab and draft.architecture == shape.architecture and draft.layers == 2
        config = shape.config(token_id=0)
        assert config.vocab_size == shape.vocab and config.num_key_value_heads == shape.kv_heads


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--alpha", "1.5"], "--alpha takes numbers in [0, 1]"),
        (["--alpha", "x"], "--alpha takes a comma list of numbers"),
        (["--shapes", "gpt-9"], "unknown shape 'gpt-9'"),
        (["--gamma", "0"], "--gamma takes whole numbers >= 1 or auto"),
        (["--gamma", "conf"], "--gamma takes whole numbers >= 1 or auto"),
        (["--native-n-max", "auto"], "--native-n-max takes whole numbers >= 1, got 'auto'"),
        (["--native-n-max", "2,-1"], "--native-n-max takes whole numbers >= 1, got -1"),
        (["--rounds", "0"], "--rounds must be a whole number >= 1"),
        (["--target-gguf", "q3_x"], "q3_x"),
    ],
)
def test_bad_options_exit_2_with_one_line_before_any_model_is_made(extra, message, tmp_path):
    result = CliRunner().invoke(app, ["bench", "synthetic", "--out", str(tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason="llama.cpp's tools are not built (scripts/build_llama_cpp_tools.sh) or the llamacpp extra is absent",
)
def test_a_tiny_shape_through_both_loops(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path / "gguf"))
    tiny = {"tiny": Shape("qwen2", 64, 128, 2, 2, 1, 8192)}
    result = run_synthetic(
        ("tiny",), ("q8_0",), (0.0, 1.0), SideLengths((3, "auto"), (3,)), rounds=1, num_prompts=2,
        max_new_tokens=12, known_shapes=tiny, out=tmp_path / "out",
    )  # fmt: skip
    (cell,) = result["cells"]
    calls = cell["tokens_per_call"]
    for side in ("llamacpp:model[g=3]@{}", "llamacpp_native[draft-simple,n_max=3,p_min=0]@{}"):
        assert calls[side.format(0)] == pytest.approx(12 / 12, abs=0.1)  # a call per token (ours after prefill)
        assert calls[side.format(1)] >= 2.4  # gamma + 1 per call but where fewer tokens were left
    assert calls["llamacpp:model[auto]@0"] == pytest.approx(1.0, abs=0.1)  # nothing is ever kept
    assert len(cell["median_tokens_per_second"]) == 2 + 2 * 3
    report = (tmp_path / "out" / "bench-synthetic.md").read_text()
    assert "| tiny | q8_0 | 1 | n_max=3 |" in report and "steps/s at length 3" in report
    assert result["llama_cpp_library"]["path"] == (os.environ.get("LLAMA_CPP_LIB_PATH") or None)  # our rows ran on it
    assert "Our rows' llama.cpp library: " in report


def test_each_sides_best_row_is_set_against_the_others_and_the_shared_length_compares_steps():
    median = {"llamacpp:ours_autoregressive": 10.0, "llamacpp_native[plain]": 10.0,
              "llamacpp:model[g=4]@0.5": 8.0, "llamacpp:model[auto]@0.5": 12.0,
              "llamacpp_native[draft-simple,n_max=2,p_min=0]@0.5": 9.0,
              "llamacpp_native[draft-simple,n_max=4,p_min=0]@0.5": 6.0}  # fmt: skip
    calls = {k: 2.0 for k in median} | {"llamacpp:model[g=4]@0.5": 4.0}
    result = {
        "command": "c", "date": "d", "machine": {"cpu_model": "cpu", "cores": 2},
        "settings": {"gammas": [4, "auto"], "native_n_max": [2, 4], "shared_length": 4, "alphas": [0.5],
                     "rounds": 1, "threads": 2, "num_prompts": 1, "max_new_tokens": 8},
        "cells": [{"shape": "s", "target_gguf": "q8_0", "median_tokens_per_second": median, "tokens_per_call": calls}],
    }  # fmt: skip
    from draftverify.markdown import markdown_table

    line = next(x for x in render(result, markdown_table).splitlines() if x.startswith("| s | q8_0 | 0.5 |"))
    # ours best (auto, 12.0) over llama.cpp's best (n_max=2, 9.0); at length 4: (8 / 4) / (6 / 2) steps/s
    assert line == "| s | q8_0 | 0.5 | n_max=2 | 9.0 | 2.00 | auto | 12.0 | 2.00 | 1.33x | 0.67x |"
    assert SideLengths((4, "auto"), (2, 4)).shared == 4 and SideLengths(("auto",), (2,)).shared is None
