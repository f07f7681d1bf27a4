"""The cost curve: widths timed in place on a static cache, greedy equality, files, and bad options."""

from __future__ import annotations

import json

import pytest
import torch
from bench_fixtures import model_dir  # noqa: F401  (fixture)
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.bench.cost import Mode, StaticForward, equality, greedy_tokens, time_widths
from draftverify.cli import app


@pytest.fixture(scope="module")
def target(model_dir):
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(model_dir / "target").eval()


def test_greedy_on_the_static_cache_equals_hf_generate(target):
    prompt = torch.tensor([[5, 17, 99, 230, 7]])
    expected = target.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, prompt.shape[1] :].tolist()
    assert greedy_tokens(StaticForward(target, 32, compiled=False), prompt, 12) == expected


def test_each_width_is_timed_repeats_times_after_the_context(target):
    runner = StaticForward(target, 40, compiled=False)
    context = torch.arange(1, 31)[None]  # [1, 30]
    points, first = time_widths(runner, context, (1, 3, 8), warmup=2, repeats=3)
    assert [p.n for p in points] == [1, 3, 8] and set(first) == {1, 3, 8}
    assert all(len(p.seconds) == 3 and p.min_ms <= p.median_ms and p.min_ms > 0 for p in points)
    # scoring in place rewrote positions 30..37 only: the context's cache entries are those of a fresh prefill
    fresh = StaticForward(target, 40, compiled=False)
    with torch.no_grad():
        fresh.prefill(context)
    assert torch.equal(runner.cache.layers[0].keys[:, :, :30], fresh.cache.layers[0].keys[:, :, :30])


def test_equality_rate_and_first_mismatch():
    result = equality([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [0, 8]])
    assert result == {"equal_rate": pytest.approx(1 / 3), "first_mismatch": [None, 1, 0]}


def test_unknown_mode_is_named():
    assert Mode.parse("compiled-bfloat16") == Mode(compiled=True, dtype="bfloat16")
    assert Mode.parse("eager-float32") == Mode(compiled=False, dtype="float32", few_row=True)
    assert Mode.parse("eager-float32-gemm") == Mode(compiled=False, dtype="float32", few_row=False)
    with pytest.raises(DraftVerifyError, match="unknown mode 'compiled-float32-gemm'"):
        Mode.parse("compiled-float32-gemm")
    with pytest.raises(DraftVerifyError, match="unknown mode 'compiled-fp8'"):
        Mode.parse("compiled-fp8")


def test_cost_curve_command_writes_json_markdown_and_plot(model_dir, tmp_path):
    args = [
        "bench",
        "speed",
        "--cost-curve",
        "--quick",
        "--target",
        str(model_dir / "target"),
        "--cost-sizes",
        "1,2,4",
        "--cost-modes",
        "eager-float32,eager-float32-gemm,eager-bfloat16",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "cost-target-quick.json").read_text())
    assert payload["context_tokens"] == 120 and payload["equality_prompts"] == 2 and payload["label"] == "target"
    modes = payload["modes"]
    assert list(modes) == ["eager-float32", "eager-float32-gemm", "eager-bfloat16"]
    assert [p["n"] for p in modes["eager-bfloat16"]["points"]] == [1, 2, 4]
    assert all(len(p["seconds"]) == 2 for p in modes["eager-float32"]["points"])
    assert modes["eager-float32"]["equality"]["equal_rate"] == 1.0  # the reference against itself
    # one token per greedy step: the few-row layout never applies, so the stock layout decodes the same tokens
    assert modes["eager-float32-gemm"]["greedy_tokens"] == modes["eager-float32"]["greedy_tokens"]
    assert all(len(t) == 8 for t in modes["eager-bfloat16"]["greedy_tokens"])
    markdown = (tmp_path / "cost-target-quick.md").read_text()
    assert "| 4 |" in markdown and "eager-bfloat16 ms" in markdown and "Greedy equality" in markdown
    assert (tmp_path / "cost-target-quick.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--cost-curve", "--cost-modes", "eager-float32,turbo"], "unknown mode 'turbo'"),
        (["--cost-curve", "--cost-sizes", "1,0"], "--cost-sizes must be integers >= 1"),
        (["--cost-curve", "--gamma", "3"], "--cost-curve does not use --gamma"),
        (["--cost-sizes", "1,2"], "--cost-sizes only apply with --cost-curve"),
    ],
)
def test_bad_cost_options_exit_2_with_a_message(extra, message, tmp_path):
    result = CliRunner().invoke(app, ["bench", "speed", "--target", "t", "--out", str(tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
