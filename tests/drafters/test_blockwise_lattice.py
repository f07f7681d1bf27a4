"""bpd_ngram / bpd_pbest: lattice-rescored blockwise drafts (a chain, or p paths as one tree) stay exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import CAUSAL_ARCHS, VOCAB, chi2_critical, chi2_statistic, target_and_reference
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters import BlockwiseHeads, BlockwiseNgramDrafter, BlockwisePBestDrafter
from draftverify.drafters.ngram import NgramTable
from draftverify.methods import MethodOptions, build_drafter, build_verifier

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


def random_heads(model, num_heads: int = 4, seed: int = 0) -> BlockwiseHeads:
    heads = BlockwiseHeads.for_target(model, num_heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * p.shape[-1] ** -0.5)
    return heads


def table(text: list[int] | None = None) -> NgramTable:
    gen = np.random.default_rng(0)
    data = [gen.integers(4, VOCAB, 200).tolist()] + ([text] if text else [])
    return NgramTable.from_sequences(data, order=3, vocab_size=VOCAB)


def exact(params: SamplingParams | None = None):
    return build_verifier("exact", params or SamplingParams(), MethodOptions())


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
@pytest.mark.parametrize("p", [1, 4])
def test_rescored_drafts_equal_target_greedy(arch, p):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    drafter = BlockwiseNgramDrafter(random_heads(model, 5), table(), k=4, alpha=0.5, p=p)
    out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.draft_calls == 0


def test_pbest_tree_holds_the_p_paths_and_the_one_best_chain_is_its_first():
    from draftverify.types import DecodingState

    model, _ = target_and_reference("llama", PROMPT, NEW)
    heads = random_heads(model, 4, seed=1)
    lm = CachedLM(model)
    tokens = lm.start(PROMPT, want_hidden=True)
    state = DecodingState(tokens, None, tokens.shape[1], SamplingParams(), None)
    drafts = []
    for p in (1, 4):
        drafter = BlockwiseNgramDrafter(heads, table(), k=3, alpha=0.5, p=p)
        drafter.bind(lm, 64)
        drafter.start(state, lm.prefilled)
        drafts.append(drafter.propose(state, 3))
    chain, tree = drafts
    assert chain.tree is None and chain.length == 3
    leaves = tree.tree.retrieve_indices  # [P, D]: leaves in node order; the best path was inserted first
    assert leaves.shape == (4, 3) and tree.depth == 3
    assert tree.tokens[0, leaves[0]].tolist() == chain.tokens[0].tolist()
    paths = {tuple(tree.tokens[0, row].tolist()) for row in leaves}
    assert len(paths) == 4


def first_token_follows_the_target(model, make_drafter, draws: int = 1200) -> bool:
    """Sample the first new token with a fresh drafter per seed (T = 1, exact verifier): chi-square against p."""
    with torch.no_grad():
        p = model(PROMPT).logits[0, -1].softmax(-1)
    counts = torch.zeros_like(p)
    for seed in range(draws):
        params = SamplingParams(temperature=1.0, seed=seed)
        out = generate(model, make_drafter(), exact(params), PROMPT, params, max_new_tokens=1, gamma=1)
        counts[out.new_tokens[0, 0]] += 1
    return chi2_statistic(counts, p) < chi2_critical(counts, p)


def test_pbest_samples_follow_the_target():
    model, _ = target_and_reference("gpt2", PROMPT, NEW)
    heads = random_heads(model, 3, seed=4)
    assert first_token_follows_the_target(model, lambda: BlockwisePBestDrafter(heads, table(), k=4, alpha=0.5, p=3))


def test_method_options_and_bad_input(tmp_path):
    model, ref = target_and_reference("qwen2", PROMPT, NEW)
    random_heads(model).save(tmp_path / "heads")
    table().save(tmp_path / "ngram.safetensors")
    options = MethodOptions(
        heads_path=tmp_path / "heads", ngram_path=tmp_path / "ngram.safetensors", pbest=3, lattice_k=2
    )
    for name in ("bpd_ngram", "bpd_pbest"):
        drafter = build_drafter(name, CachedLM(model), options)
        assert drafter.p == (3 if name == "bpd_pbest" else 1) and drafter.k == 2
        assert generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=3).new_tokens[0].tolist() == ref
    with pytest.raises(DraftVerifyError, match="n-gram table"):
        build_drafter("bpd_ngram", CachedLM(model), MethodOptions(heads_path=tmp_path / "heads"))
    other = NgramTable.from_sequences([[1, 2, 3, 4]], order=2, vocab_size=VOCAB + 4)
    with pytest.raises(DraftVerifyError, match="vocabulary"):
        generate(model, BlockwiseNgramDrafter(random_heads(model), other), exact(), PROMPT, max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="p >= 1"):
        BlockwiseNgramDrafter(random_heads(model), table(), p=0)
