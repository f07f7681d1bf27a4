"""llama.cpp rows: skipped with a reason when unavailable; when available, greedy tokens equal Hugging Face's."""

from __future__ import annotations

import pytest
import torch
from bench_fixtures import model_dir  # noqa: F401  (fixture)

from draftverify.backends.gguf import converter_available
from draftverify.bench import llamacpp
from draftverify.bench.config import BenchConfig
from draftverify.bench.models import load_models

needs_llama_cpp = pytest.mark.skipif(
    not (llamacpp.installed() and converter_available()),
    reason="llama-cpp-python not installed or no llama.cpp converter (scripts/fetch_llama_cpp_converter.sh)",
)


def _config(model_dir, **overrides):
    return BenchConfig(**{"target": model_dir / "target", "quick": True, "threads": 1, **overrides}).resolved()


def test_not_installed_is_a_note_with_the_install_command(model_dir, monkeypatch):
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    config = _config(model_dir)
    runners, notes = llamacpp.llamacpp_runners(config, load_models(config))
    assert runners == [] and notes == [
        f"llama.cpp rows skipped: llama-cpp-python is not installed ({llamacpp.INSTALL_HINT})"
    ]


def test_no_llama_cpp_rows_unless_wanted(model_dir):
    config = _config(model_dir, runners=("model",))
    assert llamacpp.llamacpp_runners(config, load_models(config)) == ([], [])


@needs_llama_cpp
def test_llama_cpp_greedy_tokens_equal_hf_generate(model_dir):
    config = _config(model_dir, gammas=(3,))
    models = load_models(config)
    runners, notes = llamacpp.llamacpp_runners(config, models)
    assert [r.name for r in runners] == [
        "llamacpp",
        "llamacpp_prompt_lookup[g=3]",
        "llamacpp_prompt_lookup[default]",
    ], notes
    assert runners[2].settings["num_pred_tokens"] == 10 and runners[2].settings["max_ngram_size"] == 2
    prompt = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99]])
    expected = models.target.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=16,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, 8:].tolist()
    for runner in runners:
        runner.eos_token_id = None  # 16 tokens on every row, EOS or not
        m = runner.run(prompt, 0.0, 0, 16)
        assert m.new_ids == expected, runner.name
        assert m.target_calls >= 1 and m.seconds > 0
    plain = runners[0].run(prompt, 0.0, 0, 16)
    assert plain.target_calls == 16  # one evaluation per token: the prompt's, then one per new token


@needs_llama_cpp
def test_our_rows_on_the_llamacpp_backend_equal_llama_cpp_greedy(model_dir, monkeypatch, tmp_path):
    from draftverify.bench.lineup import build_runners
    from draftverify.bench.runners import install_hooks

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    config = _config(
        model_dir,
        gammas=(3,),
        backends=("llamacpp",),
        temperatures=(0.0,),
        draft=model_dir / "draft",
        runners=("llamacpp", "model", "model_tree", "prompt_lookup", "bpd", "bild"),
    )
    models = load_models(config)
    hooks = install_hooks(models)
    try:
        runners, notes = build_runners(config, models, hooks)
    finally:
        hooks.remove()
    names = [r.name for r in runners]
    assert {
        "llamacpp:ours_autoregressive",
        "llamacpp:model[g=3]",
        "llamacpp:model_tree[g=3]",
        "llamacpp:prompt_lookup[g=3]",
    } <= set(names), names
    assert not any(n.startswith(("model", "prompt_lookup")) for n in names)  # --backend llamacpp: no hf rows
    assert any("llamacpp:bild skipped" in n for n in notes) and any("llamacpp:bpd skipped" in n for n in notes)
    prompt = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99]])
    plain = next(r for r in runners if r.name == "llamacpp")
    plain.eos_token_id = None
    expected = plain.run(prompt, 0.0, 0, 16).new_ids
    for runner in runners:
        if runner.name.startswith("llamacpp:"):
            assert runner.reference == "llamacpp" and runner.lossless and runner.greedy_only
            runner.eos_token_id = None
            assert runner.run(prompt, 0.0, 0, 16).new_ids == expected, runner.name
    assert next(r for r in runners if r.name == "llamacpp:model[g=3]").settings["draft_gguf"].endswith("-q8_0.gguf")


@needs_llama_cpp
def test_the_cost_curve_of_the_llamacpp_backend(model_dir, monkeypatch, tmp_path):
    from draftverify.bench.cost import LlamaCppForward, Mode, greedy_tokens, time_widths

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    assert Mode.parse("llamacpp-float32").backend == "llamacpp"
    runner = LlamaCppForward(model_dir / "target", "float32", threads=1)
    context = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99, 230, 7]])
    points, first = time_widths(runner, context, (1, 3), warmup=1, repeats=2)
    assert [p.n for p in points] == [1, 3] and all(len(p.seconds) == 2 for p in points)
    plain = llamacpp.llamacpp_runners(_config(model_dir, runners=("llamacpp",)), load_models(_config(model_dir)))[0][0]
    plain.eos_token_id = None
    assert greedy_tokens(runner, context, 12) == plain.run(context, 0.0, 0, 12).new_ids


@needs_llama_cpp
def test_the_cost_curve_of_a_quantized_file(model_dir, monkeypatch, tmp_path):
    from draftverify.bench.cost import LlamaCppForward, Mode, time_widths

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    assert Mode.parse("llamacpp-q8_0") == Mode(compiled=False, dtype="q8_0", few_row=False, backend="llamacpp")
    runner = LlamaCppForward(model_dir / "target", "q8_0", threads=1)
    assert runner.lm.model.path.name.endswith("-q8_0.gguf")  # quantized, not read as a torch dtype
    points, _ = time_widths(runner, torch.tensor([[5, 17, 99, 230, 7, 5]]), (1, 2), warmup=1, repeats=1)
    assert [p.n for p in points] == [1, 2] and all(s > 0 for p in points for s in p.seconds)


@needs_llama_cpp
def test_llama_cpps_own_speculative_decoding_with_the_draft_gguf(model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    config = _config(model_dir, gammas=(3,), draft=model_dir / "draft", runners=("llamacpp", "llamacpp_draft"))
    runners, notes = llamacpp.llamacpp_runners(config, load_models(config))
    assert [r.name for r in runners] == ["llamacpp", "llamacpp_draft[g=3]"], notes
    prompt = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99]])
    results = []
    for runner in runners:
        runner.eos_token_id = None
        results.append(runner.run(prompt, 0.0, 0, 16))
        results.append(runner.run(prompt, 0.0, 0, 16))  # the draft's context starts again on a new prompt
    assert all(m.new_ids == results[0].new_ids for m in results)
    assert results[2].target_calls < 16 and results[2].drafted > 0  # the draft's tokens were accepted
    assert runners[1].settings["draft"].endswith("-q8_0.gguf")  # the default draft type, as our llamacpp rows use


def test_the_draft_gguf_type_is_checked(model_dir):
    from draftverify.errors import DraftVerifyError

    assert _config(model_dir).draft_gguf == "q8_0"
    assert _config(model_dir, draft_gguf="f32").draft_gguf == "f32"
    message = r"--draft-gguf\) must be one of q8_0, q4_k_m, q4_0, q5_k_m, q6_k, f32, f16, bf16, got 'int4'"
    with pytest.raises(DraftVerifyError, match=message):
        _config(model_dir, draft_gguf="int4")


@needs_llama_cpp
def test_a_run_on_both_backends_writes_their_cost_curves_in_the_same_file(model_dir, monkeypatch, tmp_path):
    from draftverify.bench.run import run_bench

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path / "gguf"))
    result = run_bench(
        _config(
            model_dir,
            quick=False,
            backends=("hf", "llamacpp"),
            runners=("llamacpp", "model"),
            draft=model_dir / "draft",
            gammas=(2,),
            temperatures=(0.0,),
            num_prompts=1,
            max_new_tokens=4,
            out=tmp_path,
            name="both",
            plots=False,
        )
    )
    cost = result["cost_curve"]
    assert list(cost["modes"]) == ["eager-float32", "llamacpp-float32"]
    assert [p["n"] for p in cost["modes"]["llamacpp-float32"]["points"]] == [1, 2, 3, 4, 5, 6, 8, 12, 16]
    text = (tmp_path / "both.md").read_text()
    assert "## Cost of scoring n tokens, per backend (this run)" in text and "llamacpp-float32 ms" in text
    assert not list(tmp_path.glob("cost*"))  # the curve's own files stay out of the bench's folder


@needs_llama_cpp
def test_the_peers_and_our_backend_compute_the_same_logits(model_dir, monkeypatch, tmp_path):
    """The llama.cpp peers run the attention kernels our backend runs (FLASH_ATTENTION): scoring the same tokens in
    one decode, the prompt-lookup peer (which keeps every position's logits) computes our logits to the bit; the
    other setting computes other logits, so a mismatch would show. (The plain peer is made with the same
    parameters; it asks llama.cpp for the last position's logits only, a one-row output matmul that rounds
    differently from an n-row one, so its logits are compared through its greedy text elsewhere.)"""
    import numpy as np
    from llama_cpp import Llama

    from draftverify.backends.llamacpp import LlamaCppLM
    from draftverify.backends.llamacpp_kernels import FLASH_ATTENTION

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    config = _config(model_dir, runners=("llamacpp", "llamacpp_prompt_lookup"))
    runners, notes = llamacpp.llamacpp_runners(config, load_models(config))
    plain, lookup = runners[0].llm, runners[1].llm
    assert plain.context_params.flash_attn_type == lookup.context_params.flash_attn_type
    prompt = [5, 17, 99, 230, 7, 5, 17, 99]
    ours = LlamaCppLM(lookup.model_path, threads=1)
    ours.start(torch.tensor([prompt[:1]]))  # nothing cached: the whole prompt is scored in one decode, as eval does
    want = ours.forward(torch.tensor([prompt])).logits[0]  # [8, V]

    def every_position(llm) -> torch.Tensor:
        llm.reset()
        llm.eval(prompt)
        return torch.from_numpy(np.array(llm.scores[: len(prompt)]))

    assert torch.equal(every_position(lookup), want)
    other = Llama(
        model_path=lookup.model_path,
        n_ctx=lookup.n_ctx(),
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        flash_attn=not FLASH_ATTENTION,
        verbose=False,
    )
    assert not torch.equal(every_position(other), want)
