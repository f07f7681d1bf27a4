"""Log-probabilities on the llama.cpp backend: what prompt_lookup and a llama.cpp draft model report for the tokens
they emit equals what the target alone (autoregressive on the same backend) reports for the same text, greedy and
seeded sampling, one row and rows that join a running batch; and the prompt's, kept from the deferred prefill
(outputs at every prompt position), equal what a step's verify pass gave for the same tokens."""

from __future__ import annotations

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from transformers import AutoTokenizer  # noqa: E402

from conftest import left_padded, save_llama, tiny_gguf_pair  # noqa: E402
from draftverify import Logprobs, RowRequest, generate  # noqa: E402
from draftverify.backends.gguf import converter_available, gguf_for  # noqa: E402
from draftverify.backends.llamacpp import GGUFModel, LlamaCppLM  # noqa: E402
from draftverify.methods import MethodOptions, build_drafter, build_verifier, resolve_method  # noqa: E402
from draftverify.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

PROMPTS = [[5, 17, 99, 230, 7, 5, 17, 99, 230, 7, 5, 17], [41, 8], [300, 12, 77, 300, 12, 77, 300, 12], [9]]
NEW = 20
TOP = 4
ATOL = 1e-3  # f32 logits of one position scored in decodes of different widths: llama.cpp rounds per width
SETTINGS = {"greedy": SamplingParams(), "sampling": SamplingParams(temperature=0.8, seed=3)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, request):
    return tiny_gguf_pair(
        tmp_path_factory.mktemp("llamacpp-logprobs"), request.config.rootpath / "zoo" / "code" / "tokenizer"
    )


def run(tiny, method: str, params: SamplingParams, prompts, asks, admit=None, limits=NEW):
    spec = resolve_method(method)
    options = MethodOptions(
        draft_model=LlamaCppLM(tiny["draft"], role="draft", threads=1) if spec.needs_draft else None,
        prompt_lookup_min_ngram=1,
    )
    target = LlamaCppLM(tiny["target"], threads=1)
    drafter = build_drafter(spec.drafter, target, options)
    verifier = build_verifier(spec.verifier, params, options)
    ids, mask = left_padded(prompts) if len(prompts) > 1 else (torch.tensor(prompts), None)
    return generate(
        target,
        drafter,
        verifier,
        ids,
        params,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
        logprobs=asks,
        admit=admit,
        seeds=[params.seed] * len(prompts) if params.seed is not None else None,
    )


def assert_close(ours, alone) -> None:
    assert [e.token for e in ours] == [e.token for e in alone]
    for a, b in zip(ours, alone):
        assert a.logprob == pytest.approx(b.logprob, abs=ATOL)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=ATOL)


@pytest.mark.parametrize("method", ["prompt_lookup", "model"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_one_row_reports_the_target_alone_logprobs(tiny, method, setting):
    params = SETTINGS[setting]
    ask = Logprobs(top=TOP, prompt=True)
    ours = run(tiny, method, params, PROMPTS[:1], ask)
    alone = run(tiny, "autoregressive", params, PROMPTS[:1], ask)
    assert ours.new_tokens.tolist() == alone.new_tokens.tolist()
    assert len(ours.logprobs[0].tokens) == NEW and len(ours.logprobs[0].prompt) == len(PROMPTS[0]) - 1
    assert_close(ours.logprobs[0].tokens, alone.logprobs[0].tokens)
    assert_close(ours.logprobs[0].prompt, alone.logprobs[0].prompt)
    # the prompt's from the prefill equal a verify pass's: the text so far as the next request's prompt
    longer = PROMPTS[0] + ours.new_tokens[0, :8].tolist()
    again = run(tiny, "autoregressive", SamplingParams(), [longer], ask, limits=1)
    assert_close(again.logprobs[0].prompt, ours.logprobs[0].prompt + ours.logprobs[0].tokens[:8])


@pytest.mark.parametrize("method", ["prompt_lookup", "model"])
def test_rows_and_joining_rows_report_the_target_alone_logprobs(tiny, method):
    """Rows mode (a sequence per row): a batch asking for different things, rows joining it with their own asks;
    each row's numbers equal that row decoded alone by the target."""
    asks = [Logprobs(top=2, prompt=True), None, Logprobs(top=TOP), Logprobs(prompt=True)]
    pending = [[RowRequest(PROMPTS[2], NEW, logprobs=asks[2])], [RowRequest(PROMPTS[3], NEW, logprobs=asks[3])]]
    out = run(tiny, method, SamplingParams(), PROMPTS[:2], asks[:2], admit=lambda: pending.pop(0) if pending else [])
    assert out.logprobs[1] is None
    for row in (0, 2, 3):
        alone = run(tiny, "autoregressive", SamplingParams(), [PROMPTS[row]], asks[row])
        assert out.rows[row] == alone.new_tokens[0].tolist()
        assert_close(out.logprobs[row].tokens, alone.logprobs[0].tokens)
        if asks[row].prompt:
            assert_close(out.logprobs[row].prompt, alone.logprobs[0].prompt)
        else:
            assert out.logprobs[row].prompt is None


@pytest.fixture(scope="module")
def long_target(tmp_path_factory, request):
    """A tiny random Llama with room for a prompt longer than one llama_decode (512 tokens), as f32 GGUF."""
    root = tmp_path_factory.mktemp("llamacpp-long")
    tokenizer = AutoTokenizer.from_pretrained(request.config.rootpath / "zoo" / "code" / "tokenizer")
    save_llama(root / "target", layers=2, seed=0, tokenizer=tokenizer, context=1024)
    return GGUFModel(gguf_for(root / "target", cache_dir=root / "gguf"))


def prefilled_at(model: GGUFModel, prompt: list[int], position: int) -> torch.Tensor:
    """The logits at one prompt position [V], from a prefill that ends there (the reference)."""
    lm = LlamaCppLM(model, threads=1)
    lm.start(torch.tensor([prompt[: position + 2]]))
    return lm.prefilled.logits[0, -1]


@pytest.mark.parametrize("rows", [False, True])
def test_a_prompt_longer_than_one_decode_keeps_every_positions_logits(long_target, rows):
    """A deferred prompt of 700 tokens is decoded in chunks (the first ones alone, the rest with the first step's
    tokens); every chunk's logits are kept, in order, one row or in rows mode (a second row beside it)."""
    prompt = [(7 * i) % 4000 + 5 for i in range(700)]
    lm = LlamaCppLM(long_target, threads=1)
    if rows:
        ids, mask = left_padded([prompt, [9, 10, 11]])
        lm.start(ids, attention_mask=mask, prompt_logits=True)
        lm.forward([[prompt[-1], 40], [11, 41]])
    else:
        lm.start(torch.tensor([prompt]), prompt_logits=True)
        lm.forward([[prompt[-1], 40]])
    kept = lm.take_prompt_logits()
    assert kept[0].shape == (len(prompt) - 1, lm.vocab_size)
    if rows:
        assert kept[1].shape == (2, lm.vocab_size)
    # positions on both sides of the first chunk's end, whose reference's last chunk is not a decode of one or two
    # tokens (llama.cpp rounds those a little otherwise: what any width does, ATOL above)
    for position in (0, 255, 511, 600, 698):
        assert torch.allclose(kept[0][position], prefilled_at(long_target, prompt, position), atol=1e-4)
    assert lm.take_prompt_logits() == [None] * len(kept)  # handed over once
