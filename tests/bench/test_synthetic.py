"""`draftverify bench synthetic`: the synthetic rule as llama.cpp states it (its rates, what it keeps, how often),
bench-only (no method reaches it), bad options refused with one line, and, with llama.cpp's tools built, a tiny
random shape through both loops: at alpha 0 every call keeps one token, at alpha 1 every draft is kept."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess

import pytest
import torch
from typer.testing import CliRunner

from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench.synthetic import (
    SHAPES,
    CppUniform,
    Shape,
    SideLengths,
    SyntheticVerifier,
    alpha_rates,
    conditional_rates,
    draft_shape,
    render,
    request_seed,
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
    kept = SyntheticVerifier((1.0, 1.0, 1.0), random.Random(0).random).verify(draft, logits, GREEDY, None)
    assert kept.rows == [[3, 4, 5, 10], [6, 7, 8, 14]] and kept.accepted == [3, 3]
    none = SyntheticVerifier((0.0, 0.0, 0.0), random.Random(0).random).verify(draft, logits, GREEDY, None)
    assert none.rows == [[1, -1, -1, -1], [11, -1, -1, -1]] and none.accepted == [0, 0]


def test_a_row_keeps_nothing_past_its_own_draft_length():
    draft = Draft(tokens=torch.tensor([[3, 4, 5], [6, 7, 0]]), lengths=torch.tensor([3, 2]))
    verdict = SyntheticVerifier((1.0, 1.0, 1.0), random.Random(0).random).verify(
        draft, logits_choosing([[1, 2, 9, 10], [11, 12, 13, 14]]), GREEDY, None
    )
    assert verdict.accepted == [3, 2] and verdict.rows[1] == [6, 7, 13, -1]


def test_the_mean_kept_length_is_the_geometric_one():
    alpha, gamma, steps = 0.7, 4, 4000
    verifier = SyntheticVerifier(alpha_rates(alpha, gamma), random.Random(1).random)
    draft = Draft(tokens=torch.ones(1, gamma, dtype=torch.long))
    logits = torch.zeros(1, gamma + 1, 4)
    kept = [verifier.verify(draft, logits, GREEDY, None).accepted[0] for _ in range(steps)]
    expected = sum(alpha**i for i in range(1, gamma + 1))  # E[kept] = alpha + alpha^2 + ... + alpha^gamma
    spread = (sum((k - expected) ** 2 for k in kept) / steps) ** 0.5
    assert abs(sum(kept) / steps - expected) < 4 * spread / steps**0.5
    assert [kept.count(k) for k in range(gamma + 1)][0] == pytest.approx(steps * (1 - alpha), rel=0.1)


# std::uniform_real_distribution<double>(0, 1) over std::mt19937(seed), as the C++ program below printed them when
# built by g++ 12 (libstdc++): the draws llama-server's synthetic acceptance makes for a request of that seed
DRAWS_PROGRAM = r"""
#include <cstdio>
#include <random>
int main(int argc, char ** argv) {
    for (int a = 1; a < argc; ++a) {
        std::mt19937 rng((unsigned) std::stoul(argv[a]));
        std::uniform_real_distribution<double> dist(0.0, 1.0);
        for (int i = 0; i < 5; ++i) std::printf("%.17g\n", dist(rng));
    }
}
"""
LIBSTDCXX_DRAWS = {
    0: [0.59284461651668263, 0.84426574425659828, 0.85794561998982988, 0.84725173738433124, 0.62356369649610832],
    12345: [0.89015471328273787, 0.13070729405534817, 0.039759496502559354, 0.82643613177457831, 0.53207791656435588],
}


def test_the_generator_is_std_mt19937():
    # the C++ standard's check ([rand.predef]): the 10000th output of a default-constructed mt19937 (seed 5489)
    words = CppUniform(5489).words
    for _ in range(9999):
        words.getrandbits(32)
    assert words.getrandbits(32) == 4123659995


def test_the_draws_are_libstdcxxs_uniform_real_distribution():
    for seed, expected in LIBSTDCXX_DRAWS.items():
        draw = CppUniform(seed)
        assert [draw() for _ in expected] == expected


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the reference program")
def test_the_draws_equal_a_cpp_programs_for_any_seed(tmp_path):
    source = tmp_path / "draws.cpp"
    source.write_text(DRAWS_PROGRAM)
    subprocess.run(["c++", "-O1", "-o", str(tmp_path / "draws"), str(source)], check=True)
    seeds = [0, 1, 4294967295, request_seed([1, 2, 3], 0), request_seed([1, 2, 3], 1)]
    printed = subprocess.run(
        [str(tmp_path / "draws"), *map(str, seeds)], check=True, capture_output=True, text=True
    ).stdout.split()
    ours = []
    for seed in seeds:
        draw = CppUniform(seed)
        ours += [draw() for _ in range(5)]
    assert [float(x) for x in printed] == ours


def test_each_prompt_and_round_has_its_own_seed_and_both_sides_compute_the_same():
    assert request_seed([5, 6, 7], 0) == request_seed([5, 6, 7], 0)
    seeds = {request_seed([5, 6, 7], 0), request_seed([5, 6, 7], 1), request_seed([5, 6, 8], 0)}
    assert len(seeds) == 3 and all(0 <= s < 2**32 for s in seeds)


def test_a_drafted_end_of_generation_token_is_not_kept_whatever_its_draw():
    # llama.cpp's rule: the draw is made, and an EOG draft token is then refused (it would end the generation)
    draws = []

    def draw() -> float:
        draws.append(1)
        return 0.0

    draft = Draft(tokens=torch.tensor([[3, 9, 5]]))
    verdict = SyntheticVerifier((1.0, 1.0, 1.0), draw, is_eog=lambda t: t == 9).verify(
        draft, logits_choosing([[1, 2, 4, 6]]), GREEDY, None
    )
    assert verdict.accepted == [1] and verdict.rows == [[3, 2, -1, -1]] and len(draws) == 2


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
    assert "| tiny | q8_0 | 1 | n_max=3 |" in report and "at length 3, ours / llama.cpp" in report
    assert result["llama_cpp_library"]["path"] == (os.environ.get("LLAMA_CPP_LIB_PATH") or None)  # our rows ran on it
    assert "Our rows' llama.cpp library: " in report


@pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason="llama.cpp's tools are not built (scripts/build_llama_cpp_tools.sh) or the llamacpp extra is absent",
)
def test_both_loops_keep_the_same_draft_positions_at_the_same_length(monkeypatch, tmp_path):
    """Seeded alike, llama-server's draws and ours are the same numbers: at one length the two loops keep the same
    positions step by step, so their accepted totals part only at a request's end (llama.cpp's first token comes
    from the prompt's call and its last draft stops a token earlier), by at most one step's draft."""
    from draftverify.backends.gguf import gguf_cache_dir, gguf_for, llama_cpp_dir
    from draftverify.bench.synthetic import build_rows, random_model
    from draftverify.zoo import zoo_folder

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path / "gguf"))
    shape = Shape("qwen2", 64, 128, 2, 2, 1, 8192)
    tokenizer, cache = zoo_folder("code") / "target", gguf_cache_dir() / "shapes"
    cache.mkdir(parents=True)
    target = gguf_for(random_model("t", shape, tokenizer, cache, 0), "q8_0", llama_cpp_dir())
    draft = gguf_for(random_model("d", draft_shape(shape), tokenizer, cache, 1), "q8_0", llama_cpp_dir())
    rows = build_rows(target, draft, (0.6,), SideLengths((3,), (3,)), 2, 256, True)
    try:
        ours, theirs = rows[2], rows[3]
        assert ours.name == "llamacpp:model[g=3]@0.6" and "n_max=3" in theirs.name
        for row in rows:
            row.new_round()
        for prompt in ([1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3]):
            kept = [row.run(torch.tensor([prompt]), 0.0, 0, 60).accepted for row in (ours, theirs)]
            assert 0 <= kept[0] - kept[1] <= 3, kept  # independent draws part by several tokens here
    finally:
        for row in rows:
            row.close()


def test_each_sides_best_row_is_set_against_the_others_and_the_shared_length_compares_the_loops():
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
    # ours best (auto, 12.0) over llama.cpp's best (n_max=2, 9.0); at length 4: 8.0 / 6.0 (the same draws)
    assert line == "| s | q8_0 | 0.5 | n_max=2 | 9.0 | 2.00 | auto | 12.0 | 2.00 | 1.33x | 1.33x |"
    assert SideLengths((4, "auto"), (2, 4)).shared == 4 and SideLengths(("auto",), (2,)).shared is None
