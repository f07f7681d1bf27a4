"""The llama.cpp backend: every chain and tree method it runs gives llama.cpp's own plain greedy text.

The reference is llama.cpp decoding the same GGUF one token at a time through llama-cpp-python's low-level API (a
context of its own with llama.cpp's default parameters: one sequence, no unified KV cache; flash attention as
the backend and the bench's llama.cpp peers run it), written here and
independent of the backend. Models are tiny random Llamas on the zoo's tokenizer, converted in the test with
llama.cpp's own converter (what CI fetches with scripts/fetch_llama_cpp_converter.sh), and the zoo's target and
draft. Where a text differs, the message gives the reference's logit margin at the first differing token, so a
near-tie flip between a 1-token and an n-token evaluation is reported as one instead of hidden.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")

from transformers import AutoTokenizer  # noqa: E402

from conftest import save_llama, tiny_gguf_pair  # noqa: E402
from draftverify import DraftVerifyError, generate  # noqa: E402
from draftverify.backends import DEFAULT_DRAFT_GGUF  # noqa: E402
from draftverify.backends.gguf import converter_available, gguf_for  # noqa: E402
from draftverify.backends.llamacpp import (  # noqa: E402
    GGUFModel,
    GGUFTokenizer,
    LlamaCppLM,
    first_branch_first,
    flash_attn_type,
)
from draftverify.backends.llamacpp_kernels import float_type_by_width  # noqa: E402
from draftverify.backends.llamacpp_settle import SettlingVerifier  # noqa: E402
from draftverify.drafters import NgramTable  # noqa: E402
from draftverify.methods import MethodOptions, build_drafter, build_verifier, resolve_method  # noqa: E402
from draftverify.tree import TreeSpec  # noqa: E402
from draftverify.types import SamplingParams  # noqa: E402
from draftverify.verifiers.greedy import GreedyVerifier  # noqa: E402
from draftverify.verifiers.tree import TreeGreedyVerifier  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "zoo" / "code"
LIB = llama_cpp.llama_cpp
CHAIN_METHODS = ("autoregressive", "prompt_lookup", "ngram", "model", "lookup_model")
TREE_METHODS = ("model_tree", "prompt_lookup_tree")


# ---- llama.cpp's own plain greedy decoding: the reference -----------------------------------------------------
def plain_greedy(model: GGUFModel, prompt: list[int], new: int) -> tuple[list[int], list[float]]:
    """llama.cpp decoding one token per llama_decode from a fresh default context; returns the tokens and the
    logit margin (top 1 - top 2) at each step."""
    params = LIB.llama_context_default_params()
    params.n_ctx = max(512, len(prompt) + new + 8)
    params.n_batch = 512
    params.n_threads = params.n_threads_batch = 1
    params.flash_attn_type = flash_attn_type(LIB)  # the attention kernels every llama.cpp row of the bench runs
    ctx = LIB.llama_init_from_model(model.ptr, params)
    try:
        tokens, margins = [], []
        feed = list(prompt)
        for _ in range(new):
            for begin in range(0, len(feed), 512):  # a long prompt in chunks of at most n_batch tokens
                chunk = feed[begin : begin + 512]
                array = (ctypes.c_int32 * len(chunk))(*chunk)
                assert LIB.llama_decode(ctx, LIB.llama_batch_get_one(array, len(chunk))) == 0
            pointer = LIB.llama_get_logits_ith(ctx, -1)
            logits = torch.tensor(pointer[: model.n_vocab])
            top = logits.topk(2).values
            token = int(logits.argmax())
            tokens.append(token)
            margins.append(float(top[0] - top[1]))
            feed = [token]
        return tokens, margins
    finally:
        LIB.llama_free(ctx)


def explain(got: list[int], want: list[int], margins: list[float]) -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return (
                f"first difference at new token {i}: got {a}, llama.cpp greedy {b}; llama.cpp's logit margin "
                f"there {margins[i]:.3g} "
                f"({'a near tie: 1-token vs n-token arithmetic' if margins[i] < 1e-2 else 'not a near tie'})"
            )
    return f"lengths differ: {len(got)} vs {len(want)}"


# ---- models ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny random Llama target on the zoo tokenizer, a noisy copy of it as the draft (accepts some tokens, not
    all), converted to GGUF: the target at f32, the draft at the backend's default draft type (q8_0)."""
    return tiny_gguf_pair(tmp_path_factory.mktemp("llamacpp"), ZOO / "tokenizer")


PROMPT = [5, 17, 99, 230, 7, 5, 17, 99, 230, 7, 5, 17]


@pytest.fixture(scope="session")
def tiny_reference(tiny):
    return plain_greedy(tiny["target"], PROMPT, 40)


def run_method(
    target: GGUFModel,
    draft: GGUFModel | None,
    method: str,
    prompt: list[int],
    new: int,
    gamma: int | str = 4,
    ngram: Path | None = None,
    eos: int | None = None,
):
    spec = resolve_method(method)
    options = MethodOptions(
        draft_model=LlamaCppLM(draft, role="draft", threads=1) if spec.needs_draft else None,
        ngram_path=ngram,
        prompt_lookup_min_ngram=1,
    )
    backend = LlamaCppLM(target, threads=1)
    drafter = build_drafter(spec.drafter, backend, options)
    verifier = build_verifier(spec.verifier, SamplingParams(), options)
    return generate(
        backend, drafter, verifier, torch.tensor([prompt]), max_new_tokens=new, gamma=gamma, eos_token_id=eos
    )


# ---- exactness ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", CHAIN_METHODS + TREE_METHODS)
def test_every_method_gives_llama_cpp_greedy_text_on_a_tiny_llama(tiny, tiny_reference, method, tmp_path):
    want, margins = tiny_reference
    assert len(set(want)) > 10  # varied text: the equality is not vacuous
    ngram = None
    if method == "ngram":  # a table that knows part of the text: some drafts accepted, some rejected
        ngram = tmp_path / "ngram.safetensors"
        NgramTable.from_sequences([PROMPT + want[:20]], order=3, vocab_size=tiny["target"].n_vocab).save(ngram)
    for gamma in (1, 4):
        out = run_method(tiny["target"], tiny["draft"], method, PROMPT, len(want), gamma=gamma, ngram=ngram)
        got = out.new_tokens[0].tolist()
        assert got == want, f"{method} gamma={gamma}: {explain(got, want, margins)}"
        if method != "autoregressive":
            assert out.stats.target_calls < len(want), "no draft was ever accepted: the test exercises nothing"
        if method in ("model", "model_tree", "lookup_model"):
            assert out.stats.rejections > 0, "every draft accepted: rollback untested"


def test_the_suffix_caches_sure_copy_drafts_past_confs_own_bound_on_llama_cpp(tiny):
    """llama.cpp's width is dear, so the suffix drafter declares the widest draft: a text seen before (a prompt as
    long as the drafter's 24-token match, then 40 tokens) is copied whole at conf's first step (no timings yet),
    past conf's own bound of 32, and exactly."""
    prompt = PROMPT * 2
    want, margins = plain_greedy(tiny["target"], prompt, 40)
    backend = LlamaCppLM(tiny["target"], threads=1)
    drafter = build_drafter("suffix", backend, MethodOptions())
    drafter.index.finish(drafter.index.add(prompt + want))
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    lengths = []
    out = generate(
        backend,
        drafter,
        verifier,
        torch.tensor([prompt]),
        max_new_tokens=len(want),
        gamma="conf",
        on_step=lambda record, rows: lengths.append(record.length),
    )
    got = out.new_tokens[0].tolist()
    assert got == want, explain(got, want, margins)
    assert lengths[0] == len(want) > 32, lengths


def test_the_draft_equal_to_the_target_accepts_everything_on_trees_and_chains(tiny, tiny_reference):
    want, margins = tiny_reference
    for method in ("model", "model_tree"):
        out = run_method(tiny["target"], tiny["target"], method, PROMPT, len(want), gamma=4)
        assert out.new_tokens[0].tolist() == want, explain(out.new_tokens[0].tolist(), want, margins)
        assert out.stats.target_calls == -(-len(want) // 5)  # 5 tokens per call: 4 drafts + the bonus token


# ---- the backend's cache: rollback, trees in one decode, keeping a branch -------------------------------------
def test_rollback_drops_the_tail_beyond_a_length_uncommitted(tiny):
    """rollback (a staged draft's looked-up tokens it did not choose): the positions before `length` stay and the
    tail stays uncommitted, so a later commit still keeps a prefix of it."""
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    lm.forward(torch.tensor([[17, 40, 41, 42]]))
    lm.rollback(lm.committed + 2)  # keep 17, 40 in the tail
    assert (lm.committed, lm.length) == (len(PROMPT) - 1, len(PROMPT) + 1)
    again = lm.forward(torch.tensor([[43]])).logits
    lm.commit(1)  # only 17 is kept after all
    assert lm.length == len(PROMPT)
    fresh = LlamaCppLM(tiny["target"], threads=1)
    fresh.start(torch.tensor([PROMPT]))
    reference = fresh.forward(torch.tensor([[17, 40, 43]])).logits[:, 2:]
    assert torch.allclose(again, reference, atol=1e-3)
    with pytest.raises(DraftVerifyError, match="cannot roll back to"):
        lm.rollback(lm.length + 1)


def test_rollback_then_rescoring_gives_the_logits_of_a_fresh_run(tiny):
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    first = lm.forward(torch.tensor([[17, 40, 41, 42]])).logits  # [1, 4, V]
    lm.commit(2)  # keep 17, 40; drop 41, 42
    assert (lm.committed, lm.length) == (len(PROMPT) + 1, len(PROMPT) + 1)
    again = lm.forward(torch.tensor([[41, 43]])).logits
    fresh = LlamaCppLM(tiny["target"], threads=1)
    fresh.start(torch.tensor([PROMPT]))
    reference = fresh.forward(torch.tensor([[17, 40, 41, 43]])).logits[:, 2:]  # the same text, never rolled back
    assert torch.allclose(first[0, 2], again[0, 0], atol=1e-3)  # 41 after the same text: kept state
    assert torch.allclose(again, reference, atol=1e-3)


def test_logits_to_keep_makes_only_the_last_positions_output_rows_with_a_full_forwards_logits(tiny):
    """A draft model catching up reads its last position alone: forward(..., logits_to_keep=k) asks llama.cpp for
    the last k tokens' outputs only (the output layer runs on those rows) and gives the logits a full forward gives
    there: with the deferred prompt (the first forward), on the hot path after it, and on a tree."""
    full, lm = LlamaCppLM(tiny["target"], threads=1), LlamaCppLM(tiny["target"], threads=1)
    full.start(torch.tensor([PROMPT]))
    lm.start(torch.tensor([PROMPT]))
    want = full.forward(torch.tensor([[17, 40, 41]])).logits.clone()  # [1, 3, V]
    got = lm.forward(torch.tensor([[17, 40, 41]]), logits_to_keep=1).logits
    assert got.shape == (1, 1, lm.vocab_size) and torch.allclose(got[0, 0], want[0, 2], atol=1e-3)
    full.commit(3)
    lm.commit(3)
    want = full.forward(torch.tensor([[42, 43, 44, 45]])).logits.clone()
    got = lm.forward([[42, 43, 44, 45]], logits_to_keep=2).logits  # host ints: the hot path
    assert [lm.batch.logits[i] for i in range(4)] == [0, 0, 1, 1]
    assert got.shape == (1, 2, lm.vocab_size) and torch.allclose(got[0], want[0, 2:], atol=1e-3)
    assert lm.forward([[46]], logits_to_keep=3).logits.shape == (1, 1, lm.vocab_size)  # k past n: all n
    tree = TreeSpec.from_parents([-1, -1, 0])
    for backend in (full, lm):
        backend.commit(0)
    positions = (lm.length + tree.verify_positions())[None]
    every = full.forward(torch.tensor([[42, 50, 51, 52]]), positions, tree.verify_mask()).logits
    last = lm.forward(torch.tensor([[42, 50, 51, 52]]), positions, tree.verify_mask(), logits_to_keep=2).logits
    assert torch.allclose(last[0], every[0, 2:], atol=1e-3)


def test_a_tree_scored_in_one_decode_equals_each_branch_scored_alone(tiny):
    """Three branches from the pending token, one of them branching again; each node's logits equal its path's
    logits scored as a chain; then keeping the second branch leaves the cache as if only it had been scored."""
    tree = TreeSpec.from_parents([-1, -1, 0, 0, 1, 3])  # node: parent
    nodes = [40, 50, 41, 42, 51, 43]
    pending = PROMPT[-1]
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    positions = (lm.length + tree.verify_positions())[None]
    out = lm.forward(torch.tensor([[pending] + nodes]), positions, tree.verify_mask()).logits[0]  # [7, V]
    worst = 0.0
    for leaf_path in tree.retrieve_indices.tolist():
        path = [j for j in leaf_path if j >= 0]
        alone = LlamaCppLM(tiny["target"], threads=1)
        alone.start(torch.tensor([PROMPT]))
        chain = alone.forward(torch.tensor([[pending] + [nodes[j] for j in path]])).logits[0]
        worst = max(worst, float((chain[0] - out[0]).abs().max()))
        for k, j in enumerate(path):
            worst = max(worst, float((chain[1 + k] - out[1 + j]).abs().max()))
    assert worst < 1e-3, worst
    lm.commit(torch.tensor([[0, 2, 5]]))  # pending, node 1 (50), node 4 (51): the branch [1, 4]
    assert lm.committed == len(PROMPT) + 2 and lm.live == {0}
    after = lm.forward(torch.tensor([[60, 61]])).logits  # 60: the token the verifier would emit next
    fresh = LlamaCppLM(tiny["target"], threads=1)
    fresh.start(torch.tensor([PROMPT + [50, 51, 60, 61]]))  # prefills up to 60
    assert torch.allclose(after[0, 0], fresh.prefilled.logits[0, 0], atol=1e-3)


def test_a_context_holds_one_sequence_until_its_first_tree_which_keeps_the_cells_held(tiny):
    """Chains run on a context of one sequence (llama_decode checks the batch against every sequence a context
    holds, per decode); the first token tree makes the context again with max_sequences, the committed cells copied
    across: the tree's logits equal its branches scored as chains by a backend that never scored a tree, and the
    context keeps its sequences for the next trees."""
    n_seq_max = llama_cpp.llama_cpp.llama_n_seq_max
    tree = TreeSpec.from_parents([-1, -1, 0])
    nodes = [50, 51, 52]
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    lm.forward(torch.tensor([[PROMPT[-1], 40]]))
    lm.commit(2)  # the prompt and 40 in the cache; 41 pending
    assert n_seq_max(lm.ctx) == 1 == lm.sequences
    positions = (lm.length + tree.verify_positions())[None]
    out = lm.forward(torch.tensor([[41] + nodes]), positions, tree.verify_mask()).logits[0].clone()  # [4, V]
    assert n_seq_max(lm.ctx) == lm.max_sequences == lm.sequences
    for path in ([0, 2], [1]):
        chain = LlamaCppLM(tiny["target"], threads=1)
        chain.start(torch.tensor([PROMPT + [40, 41]]))
        logits = chain.forward(torch.tensor([[41] + [nodes[j] for j in path]])).logits[0]
        assert torch.allclose(logits[0], out[0], atol=1e-3)
        for k, j in enumerate(path):
            assert torch.allclose(logits[1 + k], out[1 + j], atol=1e-3), (path, k)
    lm.commit(torch.tensor([[0, 2]]))  # 41, 51
    lm.start(torch.tensor([PROMPT]))  # a new request: the context keeps its sequences
    lm.forward(torch.tensor([[PROMPT[-1]]]))
    assert n_seq_max(lm.ctx) == lm.max_sequences


def count_decodes(monkeypatch) -> list[int]:
    """The token count of every llama_decode the backend makes from now on."""
    counts: list[int] = []
    inner = LlamaCppLM._decode

    def counted(lm, n, order=None):
        counts.append(n)
        inner(lm, n, order)

    monkeypatch.setattr(LlamaCppLM, "_decode", counted)
    return counts


def test_the_prompt_is_decoded_with_the_first_forwards_first_token_and_its_drafts_after(tiny, monkeypatch):
    """start() defers the prefill; the first forward decodes the prompt and its first token in one llama_decode
    (the prompt's P tokens in one batch, as a plain loop and llama.cpp's tools decode them), then its other tokens:
    the first position's logits and the prompt's cells are plain decoding's to the bit whatever the forward
    drafts (a prompt decoded beside a draft rounded otherwise on a quantized file, and a near tie after it parted
    a method's text from plain decoding's), and the drafts' logits are those of a decode of them alone."""
    first = PROMPT[-1]
    counts = count_decodes(monkeypatch)
    plain = LlamaCppLM(tiny["target"], threads=1)
    plain.start(torch.tensor([PROMPT]))
    assert counts == [] and (plain.committed, plain.length) == (len(PROMPT) - 1, len(PROMPT) - 1)
    plain_first = plain.forward(torch.tensor([[first]])).logits.clone()
    assert counts == [len(PROMPT)]  # one decode: the prompt with its last token
    assert plain.prefilled is None  # the prompt's last-but-one position had no output row, as in a plain loop
    plain.commit(1)
    drafts_alone = plain.forward(torch.tensor([[40, 41]])).logits.clone()  # the same cells, then two tokens
    counts.clear()
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    got = lm.forward(torch.tensor([[first, 40, 41]])).logits
    assert counts == [len(PROMPT), 2] and got.shape == (1, 3, lm.vocab_size)
    assert torch.equal(got[:, :1], plain_first) and torch.equal(got[:, 1:], drafts_alone)
    lm.commit(1)  # the drafts' cells go; the next token sees the prompt's cells and the first token's
    plain.commit(0)
    assert torch.equal(lm.forward(torch.tensor([[40]])).logits, plain.forward(torch.tensor([[40]])).logits)
    assert (lm.committed, lm.length) == (len(PROMPT), len(PROMPT) + 1)


def test_reading_prefilled_decodes_the_prompt_alone_and_keeps_a_copy(tiny, monkeypatch):
    """`prefilled` read before the first forward decodes the deferred prompt on its own (P - 1 tokens) and is the
    backend's own copy, kept while later forwards rewrite llama.cpp's buffer; the first forward's tokens then go
    in one decode."""
    counts = count_decodes(monkeypatch)
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    prefilled = lm.prefilled.logits.clone()
    assert counts == [len(PROMPT) - 1] and prefilled.shape == (1, 1, lm.vocab_size)
    lm.forward(torch.tensor([[PROMPT[-1], 40]]))
    assert counts == [len(PROMPT) - 1, 2]
    assert torch.equal(lm.prefilled.logits, prefilled)


def test_a_forwards_logits_are_llama_cpps_buffer_until_the_next_forward(tiny):
    """forward's logits are a view of llama.cpp's output buffer (nothing copied): the next forward rewrites them,
    as backends/base.py says."""
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    lm.forward(torch.tensor([[17]]))  # decodes the prompt with it
    lm.commit(1)
    first = lm.forward(torch.tensor([[40, 41]])).logits
    kept = first.clone()
    lm.commit(2)
    second = lm.forward(torch.tensor([[42, 43]])).logits
    assert second.data_ptr() == first.data_ptr() and torch.equal(first, second)  # one buffer, rewritten
    assert not torch.equal(kept, second)


@pytest.mark.parametrize(
    "method, gamma",
    [
        ("autoregressive", 1),
        ("suffix", 4),
        ("prompt_lookup", 4),
        ("model", "conf"),
        ("model", "conf=0.001"),
        ("model", 4),
    ],
)
def test_a_chain_step_on_llama_cpp_makes_no_torch_call_after_the_first(tiny, tiny_reference, method, gamma):
    """The hot path of a host-side chain method on this backend, a draft model's drafting included: after the
    first step (which decodes the prompt), a step reads llama.cpp's logits through NumPy (sampling.host_array) and
    keeps everything else in Python objects: no torch function, method or attribute read, each of which costs a
    step many microseconds right after llama_decode has cooled the caches. The text is still llama.cpp's own
    greedy text."""
    from torch.overrides import TorchFunctionMode

    want, margins = tiny_reference
    calls: list[list[str]] = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[-1].append(getattr(func, "__qualname__", repr(func)))
            return func(*args, **(kwargs or {}))

    def on_step(record, active):
        calls.append([])

    spec = resolve_method(method)
    backend = LlamaCppLM(tiny["target"], threads=1)
    draft = LlamaCppLM(tiny["draft"], role="draft", threads=1) if spec.needs_draft else None
    drafter = build_drafter(spec.drafter, backend, MethodOptions(draft_model=draft, prompt_lookup_min_ngram=1))
    verifier = build_verifier(spec.verifier, SamplingParams(), MethodOptions())
    calls.append([])
    with Count():
        out = generate(
            backend, drafter, verifier, torch.tensor([PROMPT]), max_new_tokens=len(want), gamma=gamma, on_step=on_step
        )
    assert out.new_tokens[0].tolist() == want, explain(out.new_tokens[0].tolist(), want, margins)
    steps = calls[1:-1]  # from the second step to the last one (the first decodes the prompt; the output after)
    assert len(steps) > 5 and all(step == [] for step in steps), [step for step in steps if step][:3]


def test_a_trees_first_branch_takes_the_cells_after_the_tail():
    # new tokens' parents as tail indices (base 2: two tail tokens before them; -1 or < 2: outside the new tokens)
    assert first_branch_first([1, 2, 2, 3, 4, 6], base=2) == [0, 1, 3, 2, 4, 5]
    assert first_branch_first([-1, -1, 0], base=0) == [0, 2, 1]  # two roots, in index order


def test_a_kept_branch_past_the_first_is_scored_again_as_a_chain(tiny):
    """The same tree as above: its first branch (pending, 40, 41) took the cells after the prompt's, so its logits are
    a chain's already; the branch through 50 and 51 sat past siblings and is decoded again after the pending token
    (on kernels that round a chain's rows as one-token decoding does): its logits are the chain's, and keeping a
    prefix of it leaves the cache as if only that prefix was decoded."""
    tree = TreeSpec.from_parents([-1, -1, 0, 0, 1, 3])
    nodes = [40, 50, 41, 42, 51, 43]
    pending = PROMPT[-1]
    lm = LlamaCppLM(tiny["target"], threads=1)
    assert lm.chains_exact is False  # llama-cpp-python's own build: nothing is re-scored
    lm.start(torch.tensor([PROMPT]))
    lm.forward(torch.tensor([[PROMPT[-1]] + nodes]), (lm.length + tree.verify_positions())[None], tree.verify_mask())
    assert lm.rescore_branch([0, 2, 5]) is None
    lm.chains_exact = True  # the mechanics here; bit for bit on the kernels that make it so: test_llamacpp_kernels
    decodes = []
    for keep, rescored in (([0, 1, 3], None), ([0, 2, 5], 1)):
        lm.start(torch.tensor([PROMPT]))
        positions = (lm.length + tree.verify_positions())[None]
        out = lm.forward(torch.tensor([[pending] + nodes]), positions, tree.verify_mask()).logits[0]  # [7, V]
        got = lm.rescore_branch(keep)
        if rescored is None:
            assert got is None
            lm.commit(torch.tensor(keep))
            continue
        m, logits = got
        assert m == rescored and logits.shape == (1, 2, lm.vocab_size)
        assert torch.allclose(logits[0], out[[2, 5]], atol=1e-3)  # after 50, after 51
        assert lm.committed == len(PROMPT) and lm.length == len(PROMPT) + 2  # pending kept, 50 51 a chain tail
        with pytest.raises(DraftVerifyError, match="not a prefix of the re-scored branch"):
            lm.commit(torch.tensor([0, 1]))
        lm._rescored = (m, keep)  # the refused commit changed nothing else
        lm.commit(torch.tensor([0, 2]))  # the verdict was cut after 50
        assert lm.committed == len(PROMPT) + 1 and lm.length == lm.committed
        after = lm.forward(torch.tensor([[60]])).logits
        fresh = LlamaCppLM(tiny["target"], threads=1)
        fresh.start(torch.tensor([PROMPT + [50, 60, 61]]))  # prefills up to 60
        decodes.append(float((after[0, 0] - fresh.prefilled.logits[0, 0]).abs().max()))
    assert decodes and decodes[0] < 1e-3


def test_the_backend_settles_a_lossless_tree_rule_only_where_that_makes_it_exact(tiny):
    """LlamaCppLM.wrap_verifier, which the loop asks for its verifier: llama-cpp-python's own build leaves the rule as
    it is (a second forward would not make a verdict exact there); where a chain's rows round as one-token decoding
    does, a lossless rule that checks trees settles its greedy tree verdicts (llamacpp_settle.py)."""
    lm = LlamaCppLM(tiny["target"], threads=1)
    rule = TreeGreedyVerifier()
    assert lm.wrap_verifier(rule) is rule
    lm.chains_exact = True
    settling = lm.wrap_verifier(rule)
    assert isinstance(settling, SettlingVerifier) and settling.verifier is rule
    chains_only = GreedyVerifier()
    assert lm.wrap_verifier(chains_only) is chains_only


def test_a_long_deferred_prompt_goes_in_chunks_ending_with_the_first_token_and_a_tree_decodes_it_first(
    zoo_models, monkeypatch
):
    """511 prompt tokens, BATCH 512: the first forward decodes 511 of them (the prompt and its first token), and
    its 4 drafts after them, the first position's logits those of a plain first step to the bit; with a prompt one
    token longer the prompt's first 511 go alone and its last with the first token. A tree decodes the whole
    deferred prompt first."""
    from draftverify.backends.llamacpp import BATCH

    target, _, _ = zoo_models
    prompt = list(range(300, 300 + BATCH))  # BATCH tokens: BATCH - 1 deferred
    new = [prompt[-1], 40, 41, 42, 43]
    reference = LlamaCppLM(target, threads=2)
    reference.start(torch.tensor([prompt]))
    want = reference.forward(torch.tensor([new[:1]])).logits.clone()
    counts = count_decodes(monkeypatch)
    lm = LlamaCppLM(target, threads=2)
    lm.start(torch.tensor([prompt]))
    got = lm.forward(torch.tensor([new])).logits
    assert counts == [BATCH, 4] and torch.equal(got[:, :1], want)
    counts.clear()
    lm.start(torch.tensor([prompt + [7]]))  # BATCH deferred: one more than fits beside the first token
    lm.forward(torch.tensor([[7, 40]]))
    assert counts == [BATCH - 1, 2, 1]
    counts.clear()
    lm.start(torch.tensor([prompt]))
    tree = TreeSpec.from_parents([-1, -1])
    lm.forward(torch.tensor([[prompt[-1], 40, 50]]), (lm.length + tree.verify_positions())[None], tree.verify_mask())
    assert counts == [BATCH - 1, 3]


def test_the_step_that_decodes_the_prompt_is_timed_as_the_prefill(tiny, monkeypatch):
    """The first step's forwards also decode the prompt (the target's and the draft's): the loop counts its time as
    the prefill's and keeps it out of gamma auto's cost model; every later step is timed as a step."""
    from draftverify.draft_length import StepCosts

    recorded = []
    inner = StepCosts.record

    def record(costs, *args, **kwargs):
        recorded.append(args)
        inner(costs, *args, **kwargs)

    monkeypatch.setattr(StepCosts, "record", record)
    stats = run_method(tiny["target"], tiny["draft"], "model", PROMPT, 24, gamma="auto").stats
    assert stats.target_calls > 2 and stats.prefill_steps == 1 and stats.prefill_draft_calls >= 1
    assert len(recorded) == stats.target_calls - 1
    assert stats.time_prefill > 0 and stats.time_target > 0 and stats.draft_calls > stats.prefill_draft_calls


def test_keeping_something_that_is_not_a_branch_is_refused(tiny):
    lm = LlamaCppLM(tiny["target"], threads=1)
    lm.start(torch.tensor([PROMPT]))
    tree = TreeSpec.from_parents([-1, -1])
    lm.forward(torch.tensor([[7, 40, 50]]), (lm.length + tree.verify_positions())[None], tree.verify_mask())
    with pytest.raises(DraftVerifyError, match="not one branch"):
        lm.commit(torch.tensor([[0, 1, 2]]))  # siblings 40 and 50 on one path
    with pytest.raises(DraftVerifyError, match="not a token tree"):
        bad = torch.ones(2, 2, dtype=torch.bool).tril()
        bad[1, 0] = False  # the second token skips its parent: not a tree
        lm2 = LlamaCppLM(tiny["target"], threads=1)
        lm2.start(torch.tensor([PROMPT]))
        lm2.forward(
            torch.tensor([[7, 40, 41]]),
            attention_mask=torch.tensor([[True, False, False], [True, True, False], [False, True, True]]),
        )


def test_models_and_contexts_alive_at_exit_end_the_process_quietly(tiny):
    """Objects still referenced when Python exits are collected after llama_cpp's module is torn down: their
    finalizers must not call into it (no 'Exception ignored in ... __del__' on stderr)."""
    script = (
        "import sys\n"
        "from draftverify.backends.llamacpp import GGUFModel, LlamaCppLM\n"
        f"model = GGUFModel({str(tiny['target'].path)!r})\n"
        "lm = LlamaCppLM(model, role='target', threads=1)\n"
        "lm.start(__import__('torch').tensor([[5, 17, 99]])); lm.forward([[7]])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_no_hidden_states(tiny):
    lm = LlamaCppLM(tiny["target"], threads=1)
    with pytest.raises(DraftVerifyError, match="hidden states"):
        lm.start(torch.tensor([PROMPT]), want_hidden=True)


# ---- the pipeline: load(backend="llamacpp") -------------------------------------------------------------------
def test_load_converts_once_and_caches(tiny, monkeypatch):
    from draftverify import load
    from draftverify.backends import gguf

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tiny["cache"]))
    calls = []
    monkeypatch.setattr(gguf, "convert", lambda *a, **k: calls.append(a))  # the fixture converted them already
    pipe = load(
        target=tiny["root"] / "target",
        draft=tiny["root"] / "draft",
        method="model",
        backend="llamacpp",
        threads=1,
        gamma=3,
    )
    assert calls == [] and pipe.target.name == "llamacpp" and pipe.drafter.lm.name == "llamacpp"
    result = pipe.generate("def add(a, b):", max_new_tokens=12)
    hf = load(target=tiny["root"] / "target", method="autoregressive").generate("def add(a, b):", max_new_tokens=12)
    assert result.output.new_tokens[0].tolist() == hf.output.new_tokens[0].tolist()  # peaked logits: no near tie


def test_a_gguf_file_runs_with_its_own_tokenizer(tiny):
    from draftverify import load

    path = tiny["target"].path
    pipe = load(target=path, method="prompt_lookup", backend="llamacpp", threads=1)
    assert isinstance(pipe.tokenizer, GGUFTokenizer)
    hf_tokenizer = AutoTokenizer.from_pretrained(ZOO / "tokenizer")
    text = "def add(a, b):\n    return a + b\n"
    assert (
        pipe.tokenizer.encode(text, add_special_tokens=False) == hf_tokenizer(text, add_special_tokens=False).input_ids
    )
    ids = hf_tokenizer(text).input_ids
    assert pipe.tokenizer.decode(ids, skip_special_tokens=True) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert pipe.generate(text, max_new_tokens=8).stats.new_tokens == 8


@pytest.mark.parametrize("method", ["bpd", "bita", "early_exit", "specdec"])
def test_methods_that_need_the_hf_model_are_refused_by_name(tiny, method):
    from draftverify import load

    with pytest.raises(DraftVerifyError, match=f"method '{method}' needs .*--backend hf"):
        load(target=tiny["target"].path, method=method, backend="llamacpp")


def test_a_draft_with_another_vocabulary_is_refused(tiny, tmp_path):
    from draftverify import load

    other = tmp_path / "other"
    save_llama(other, layers=1, seed=3, tokenizer=AutoTokenizer.from_pretrained(ZOO / "tokenizer"))
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two token ids swapped: same size, another vocabulary
    (other / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(DraftVerifyError, match="different vocabularies"):
        load(
            target=tiny["target"].path,
            draft=GGUFModel(gguf_for(other, cache_dir=tiny["cache"])).path,
            method="model",
            backend="llamacpp",
        )


def test_generate_and_serve_say_when_a_method_on_a_quantized_target_may_part(tiny, monkeypatch, capsys):
    """The note (cli._say_llamacpp_exactness) names what makes a method exact where the kernels do not; with them
    (tree methods included: settle re-scores a kept branch past the first), a float file and plain decoding get
    none."""
    from draftverify import load
    from draftverify.backends import llamacpp
    from draftverify.cli import _say_llamacpp_exactness

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tiny["cache"]))
    monkeypatch.setenv("GGML_CPU_TILED_MM", "0")  # as the exact kernels set it: nothing left set after the test
    common = dict(target=tiny["root"] / "target", backend="llamacpp", threads=1, gamma=3)

    def note(method, kernels_exact, **options) -> str:
        # the library the backend reads its kernels from (LlamaCppLM.chains_exact)
        monkeypatch.setattr(llamacpp, "library", lambda lib: {"path": None, "llamafile": not kernels_exact})
        pipe = load(method=method, flash_attn=not kernels_exact, **common, **options)
        capsys.readouterr()
        _say_llamacpp_exactness(pipe)
        return " ".join(capsys.readouterr().err.split())

    draft = {"draft": tiny["root"] / "draft"}
    assert "build_llama_cpp_invariant_lib.sh" in note("model", False, target_gguf="q8_0", **draft)
    assert "--no-flash-attn" in note("model", False, target_gguf="q8_0", **draft)
    assert note("model", True, target_gguf="q8_0", **draft) == ""
    assert note("model_tree", True, target_gguf="q8_0", **draft) == ""
    assert "--no-flash-attn" in note("model_tree", False, target_gguf="q8_0", **draft)
    assert note("model", False, **draft) == ""  # f32
    assert note("autoregressive", False, target_gguf="q8_0") == ""


def test_the_draft_converts_at_its_own_gguf_type(tiny, monkeypatch):
    """draft_gguf picks the draft's GGUF type (default q8_0) while the target keeps dtype's; the text is the
    target's greedy text whatever the draft's precision."""
    from draftverify import load

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tiny["cache"]))
    texts = {}
    for kind in (None, "f16"):
        pipe = load(
            target=tiny["root"] / "target",
            draft=tiny["root"] / "draft",
            method="model",
            backend="llamacpp",
            threads=1,
            gamma=3,
            draft_gguf=kind,
        )
        assert pipe.target.model.path.name.endswith("-f32.gguf")
        assert pipe.drafter.lm.model.path.name.endswith(f"-{kind or DEFAULT_DRAFT_GGUF}.gguf")
        texts[kind] = pipe.generate("def add(a, b):", max_new_tokens=12).output.new_tokens[0].tolist()
    want, _ = plain_greedy(tiny["target"], pipe.encode("def add(a, b):")[0].tolist(), 12)
    assert texts[None] == texts["f16"] == want[: len(texts[None])] and len(texts[None]) > 0
    with pytest.raises(
        DraftVerifyError, match="must be one of q8_0, q4_k_m, q4_0, q5_k_m, q6_k, f32, f16, bf16, got 'q4'"
    ):
        load(target=tiny["root"] / "target", draft=tiny["root"] / "draft", backend="llamacpp", draft_gguf="q4")
    with pytest.raises(DraftVerifyError, match="on the hf backend the draft loads at dtype"):
        load(target=tiny["root"] / "target", draft=tiny["root"] / "draft", draft_gguf="q8_0")


def test_compile_and_batches_of_trees_are_refused(tiny):
    from draftverify import load

    with pytest.raises(DraftVerifyError, match="--compile is for"):
        load(target=tiny["target"].path, method="prompt_lookup", backend="llamacpp", compile=True)
    pipe = load(target=tiny["target"].path, method="prompt_lookup_tree", backend="llamacpp", threads=1)
    assert not pipe.supports_batches
    with pytest.raises(DraftVerifyError, match="token trees in batches of several rows"):
        pipe.generate(["def a():", "def b():"], max_new_tokens=4)


# ---- the zoo --------------------------------------------------------------------------------------------------
ZOO_PROMPTS = [
    "def fibonacci(n):\n",
    'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n',
]


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory):
    cache = (
        Path(os.environ["DRAFTVERIFY_GGUF_CACHE"])
        if os.environ.get("DRAFTVERIFY_GGUF_CACHE")
        else tmp_path_factory.mktemp("zoo-gguf")
    )
    tokenizer = AutoTokenizer.from_pretrained(ZOO / "target")
    return (
        GGUFModel(gguf_for(ZOO / "target", cache_dir=cache)),
        GGUFModel(gguf_for(ZOO / "draft", DEFAULT_DRAFT_GGUF, cache_dir=cache)),
        tokenizer,
    )


def test_the_file_type_is_the_metadatas_and_the_weights_width_tells_the_same(zoo_models):
    target, draft, _ = zoo_models
    assert (target.file_type(), draft.file_type()) == ("0", "7")  # the zoo's f32 target, its q8_0 draft
    lib = target.lib
    widths = [float_type_by_width(lib.llama_model_size(m.ptr), lib.llama_model_n_params(m.ptr)) for m in zoo_models[:2]]
    assert widths == ["0", None]  # what a file without general.file_type would have been taken for


@pytest.mark.parametrize("method", CHAIN_METHODS + TREE_METHODS)
def test_every_method_gives_llama_cpp_greedy_text_on_the_zoo(zoo_models, method):
    target, draft, tokenizer = zoo_models
    for text in ZOO_PROMPTS:
        prompt = tokenizer(text).input_ids
        want, margins = _zoo_reference(target, tuple(prompt))
        out = run_method(
            target, draft, method, prompt, 48, gamma=4, ngram=ZOO / "ngram.safetensors", eos=tokenizer.eos_token_id
        )
        got = out.new_tokens[0].tolist()
        assert got == want, f"{method} on {text!r}: {explain(got, want, margins)}"


_ZOO_REFERENCES: dict = {}


def _zoo_reference(target: GGUFModel, prompt: tuple) -> tuple[list[int], list[float]]:
    if prompt not in _ZOO_REFERENCES:
        tokens, margins = plain_greedy(target, list(prompt), 48)
        eos = target.eos_token_id
        if eos in tokens:
            cut = tokens.index(eos) + 1
            tokens, margins = tokens[:cut], margins[:cut]
        _ZOO_REFERENCES[prompt] = (tokens, margins)
    return _ZOO_REFERENCES[prompt]


def test_n_token_and_1_token_evaluations_differ_only_by_rounding_on_the_zoo(zoo_models, record_property):
    """llama.cpp's logits of a token scored inside a block of several differ from the same token scored alone by
    float rounding (other kernel paths); measured here, with any argmax flip it causes and its margin."""
    target, _, tokenizer = zoo_models
    prompt = tokenizer(ZOO_PROMPTS[1]).input_ids
    text, _ = _zoo_reference(target, tuple(prompt))
    single = LlamaCppLM(target, threads=1)
    single.start(torch.tensor([prompt]))
    alone = []
    for token in [prompt[-1]] + text[:-1]:
        alone.append(single.forward(torch.tensor([[token]])).logits[0, 0].clone())  # the next decode rewrites it
        single.commit(1)
    alone = torch.stack(alone)  # [T, V], one token per decode
    block = LlamaCppLM(target, threads=1)
    block.start(torch.tensor([prompt]))
    fed = [prompt[-1]] + text[:-1]
    chunks = []
    for begin in range(0, len(fed), 5):
        chunks.append(block.forward(torch.tensor([fed[begin : begin + 5]])).logits[0].clone())
        block.commit(len(fed[begin : begin + 5]))
    together = torch.cat(chunks)  # [T, V], five tokens per decode
    difference = float((alone - together).abs().max())
    top = alone.topk(2, dim=-1).values
    margins = top[:, 0] - top[:, 1]
    flips = [(i, float(margins[i])) for i in range(len(fed)) if alone[i].argmax() != together[i].argmax()]
    record_property("max_logit_difference_1_vs_5_tokens", difference)
    record_property("argmax_flips", flips)
    print(
        f"\nzoo target, 1-token vs 5-token decodes: max logit difference {difference:.3g}, "
        f"smallest greedy margin {float(margins.min()):.3g}, argmax flips {flips}"
    )
    assert difference < 0.05
    assert all(margin <= 2 * difference for _, margin in flips), f"a flip that is not a near tie: {flips}"


def test_serving_a_tree_method_on_the_llamacpp_backend_answers_one_request_at_a_time(tiny):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from draftverify import load
    from draftverify.serve.app import ServerSettings, create_app

    pipe = load(
        target=tiny["root"] / "target",
        draft=tiny["root"] / "draft",
        method="model_tree",
        backend="llamacpp",
        threads=1,
        gamma=3,
    )
    assert not pipe.supports_batches  # trees are one row's: the engine serves one request at a time
    expected = pipe.generate("def add(a, b):", max_new_tokens=8).text
    with TestClient(create_app(pipe, ServerSettings(model_name="tiny", max_batch=4))) as client:
        reply = client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == expected


def test_the_command_line(tiny, monkeypatch):
    from typer.testing import CliRunner

    from draftverify.cli import app

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tiny["cache"]))
    runner = CliRunner()
    base = [
        "generate",
        "--target",
        str(tiny["root"] / "target"),
        "-p",
        "def add(a, b):",
        "-n",
        "8",
        "--threads",
        "1",
        "--backend",
        "llamacpp",
    ]
    ok = runner.invoke(app, base + ["--draft", str(tiny["root"] / "draft"), "--method", "model_tree", "--json"])
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["stats"]["new_tokens"] == 8
    for extra, message in (
        (["--method", "bita"], "method 'bita' needs extra embedded positions"),
        (["--compile"], "--compile is for --backend hf"),
        (["--draft-gguf", "q4"], "--draft-gguf) must be one of q8_0, q4_k_m, q4_0, q5_k_m, q6_k, f32, f16, bf16"),
        (["--target-gguf", "q4"], "--target-gguf) must be one of q8_0, q4_k_m, q4_0, q5_k_m, q6_k, f32, f16, bf16"),
        (["--method", "model", "--draft", str(tiny["root"] / "nowhere")], "neither a .gguf file nor"),
    ):
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2  # the loading line, then one error line
    unused = runner.invoke(app, base + ["--method", "prompt_lookup", "--draft-gguf", "f16"])
    assert unused.exit_code == 0 and "--draft-gguf is not used by method 'prompt_lookup'" in unused.stderr


def test_speculative_sampling_is_distributed_as_llama_cpps_softmax(tiny):
    """The first sampled token of `model` (a noisy draft: accepted or resampled from the residual) against
    llama.cpp's own softmax at that position (chi-square, 0.001 level); accepting every draft token (a wrong rule,
    the draft's distribution) fails the same test."""
    from conftest import chi2_critical, chi2_statistic

    temperature, draws = 0.3, 1000  # peaked enough for ~35 chi-square bins, far enough from the draft
    prompt = PROMPT[:6]
    target_lm, draft_lm = LlamaCppLM(tiny["target"], threads=1), LlamaCppLM(tiny["draft"], role="draft", threads=1)
    p = torch.softmax(_plain_last_logits(tiny["target"], prompt) / temperature, dim=-1).double()
    q = torch.softmax(_plain_last_logits(tiny["draft"], prompt) / temperature, dim=-1).double()
    assert float((p - q).abs().sum()) > 0.2  # the draft really differs: rejections happen
    options = MethodOptions(draft_model=draft_lm)
    drafter = build_drafter("model", target_lm, options)
    counts = torch.zeros_like(p)
    for seed in range(draws):
        params = SamplingParams(temperature=temperature, seed=seed, coupling=False)
        out = generate(
            target_lm,
            drafter,
            build_verifier("exact", params, options),
            torch.tensor([prompt]),
            params,
            max_new_tokens=1,
            gamma=1,
        )
        counts[out.new_tokens[0, 0]] += 1
    assert chi2_statistic(counts, p) < chi2_critical(counts, p)
    wrong = torch.bincount(
        torch.multinomial(q, draws, replacement=True, generator=torch.Generator().manual_seed(0)), minlength=p.numel()
    ).double()
    assert chi2_statistic(wrong, p) > chi2_critical(wrong, p)


def _plain_last_logits(model: GGUFModel, prompt: list[int]) -> torch.Tensor:
    """llama.cpp's logits after the prompt, from a fresh default context."""
    params = LIB.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 512, 1, 1
    ctx = LIB.llama_init_from_model(model.ptr, params)
    try:
        array = (ctypes.c_int32 * len(prompt))(*prompt)
        assert LIB.llama_decode(ctx, LIB.llama_batch_get_one(array, len(prompt))) == 0
        return torch.tensor(LIB.llama_get_logits_ith(ctx, -1)[: model.n_vocab])
    finally:
        LIB.llama_free(ctx)


def test_the_context_grows_for_a_longer_request_unless_its_size_was_given(tiny):
    lm = LlamaCppLM(tiny["target"], threads=1, n_ctx=300)  # llama.cpp pads it (to 512 here)
    lm.max_positions = None  # as for a model with a long context: the cells, not the model, are the limit
    cells = lm.n_ctx
    with pytest.raises(DraftVerifyError, match="holds .* cells"):
        lm.check_fits(cells)  # the positions + room for a tree's siblings do not fit
    lm.fixed_ctx = False  # the default: sized on demand
    lm.check_fits(cells)
    assert lm.n_ctx >= cells + 256
    lm.max_positions = 256
    lm.start(torch.tensor([PROMPT]))
    assert lm.forward(torch.tensor([[PROMPT[-1]]])).logits.shape == (1, 1, tiny["target"].n_vocab)
    with pytest.raises(DraftVerifyError, match="attends to at most 256 positions"):
        lm.check_fits(257)


def test_unconvertible_folders_and_encoder_decoder_models_are_refused_in_one_line(tmp_path):
    from transformers import T5Config

    from draftverify import load

    T5Config(vocab_size=96, d_model=32, num_layers=1, num_heads=2).save_pretrained(tmp_path / "t5")
    with pytest.raises(
        DraftVerifyError, match="encoder-decoder model, which the llamacpp backend does not run; use --backend hf"
    ):
        load(target=tmp_path / "t5", method="prompt_lookup", backend="llamacpp")
    folder = tmp_path / "metaspace"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": {"type": "Metaspace"}}))
    with pytest.raises(DraftVerifyError) as caught:
        load(target=folder, method="prompt_lookup", backend="llamacpp")
    message = str(caught.value)
    assert "cannot run on llama.cpp" in message and "--backend hf" in message and "\n" not in message


def test_a_prompt_longer_than_one_decode_and_a_one_token_prompt(zoo_models):
    target, draft, _ = zoo_models
    long_prompt = list(range(300, 900))  # 600 tokens: prefilled in two llama_decode calls of at most 512
    for prompt in (long_prompt, [42]):
        want, margins = plain_greedy(target, prompt, 12)
        for method in ("autoregressive", "model_tree"):
            got = run_method(target, draft, method, prompt, 12).new_tokens[0].tolist()
            assert got == want, f"{method}, {len(prompt)}-token prompt: {explain(got, want, margins)}"


def test_contexts_over_one_file_share_its_loaded_model_until_the_file_changes(tiny, tmp_path):
    """GGUFModel.shared: pipelines over one file hold one copy of its weights (each its own context)."""
    copy = tmp_path / "shared.gguf"
    copy.write_bytes(Path(tiny["target"].path).read_bytes())
    first, second = LlamaCppLM(copy, threads=1), LlamaCppLM(str(copy), threads=1)
    assert first.model is second.model and first.ctx != second.ctx
    os.utime(copy, ns=(1, 1))  # the file changed: loaded again
    assert LlamaCppLM(copy, threads=1).model is not first.model
