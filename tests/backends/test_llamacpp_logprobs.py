"""Log-probabilities on the llama.cpp backend: what prompt_lookup and a llama.cpp draft model report for the tokens
they emit equals what the target alone (autoregressive on the same backend) reports for the same text, greedy and
seeded sampling, one row and rows that join a running batch; and the prompt's, kept from the deferred prefill
(outputs at every prompt position), equal what a step's verify pass gave for the same tokens."""

from __future__ import annotations

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from conftest import left_padded, tiny_gguf_pair  # noqa: E402
from draftverify import Logprobs, RowRequest, generate  # noqa: E402
from draftverify.backends.gguf import converter_available  # noqa: E402
from draftverify.backends.llamacpp import LlamaCppLM  # noqa: E402
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
