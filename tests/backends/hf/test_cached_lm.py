"""CachedLM with trees: scoring a token tree in one forward (ancestor mask, depth positions), keeping one branch
of it (a gather along the sequence axis), the hidden-state channel, and a clear refusal where trees cannot work.

Every check compares against a cache-free forward over the plain sequence a node or branch stands for.
"""

from __future__ import annotations

import pytest
import torch

from conftest import SEQ2SEQ_ARCHS, VOCAB
from draftverify.backends.hf.cache import cache_length
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.errors import DraftVerifyError
from draftverify.tree import TreeSpec

torch.set_num_threads(1)

ATOL = 1e-10
DECODER_ONLY = ["llama", "qwen2", "gpt2", "gpt_neox"]
PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)]


@torch.no_grad()
def _full(model, sequence: torch.Tensor) -> torch.Tensor:
    return model(input_ids=sequence, use_cache=False).logits  # [1, L, V]


def _score_tree(lm: CachedLM, committed: torch.Tensor, tree: TreeSpec, nodes: torch.Tensor, want_hidden=False):
    scored = torch.cat([committed[:, lm.length :], nodes], dim=1)  # [1, 1+N]: pending token + nodes
    positions = lm.length + tree.verify_positions()[None]  # [1, 1+N]
    return lm.forward(scored, position_ids=positions, attention_mask=tree.verify_mask(), want_hidden=want_hidden)


def _branch(tree: TreeSpec, leaf: int) -> list[int]:
    """Node indices root-to-leaf."""
    return tree.ancestor_mask[leaf].nonzero().flatten().tolist()


@pytest.mark.parametrize("arch", DECODER_ONLY)
def test_tree_forward_scores_every_node_as_its_own_branch(models, float64_softmax, arch):
    model = models(arch, layers=2, seed=0)
    gen = torch.Generator().manual_seed(DECODER_ONLY.index(arch))
    tree = TreeSpec.from_paths(PATHS)
    lm = CachedLM(model)
    committed = lm.start(torch.randint(4, VOCAB, (1, 6), generator=gen))
    nodes = torch.randint(4, VOCAB, (1, tree.size), generator=gen)
    logits = _score_tree(lm, committed, tree, nodes).logits  # [1, 1+N, V]
    torch.testing.assert_close(logits[:, 0], _full(model, committed)[:, -1], rtol=0, atol=ATOL)
    for j in range(tree.size):
        sequence = torch.cat([committed, nodes[:, _branch(tree, j)]], dim=1)
        torch.testing.assert_close(logits[:, 1 + j], _full(model, sequence)[:, -1], rtol=0, atol=ATOL)


@pytest.mark.parametrize("leaf_path", [(0, 1, 0), (1, 0), (0, 0, 0), ()], ids=["deep", "second-root", "first", "none"])
@pytest.mark.parametrize("arch", DECODER_ONLY)
def test_commit_a_tree_branch_round_trip(models, float64_softmax, arch, leaf_path):
    """Keep the pending token plus one branch; the next forward equals a fresh one over the kept sequence."""
    model = models(arch, layers=2, seed=1)
    gen = torch.Generator().manual_seed(11)
    tree = TreeSpec.from_paths(PATHS)
    lm = CachedLM(model)
    committed = lm.start(torch.randint(4, VOCAB, (1, 5), generator=gen))
    nodes = torch.randint(4, VOCAB, (1, tree.size), generator=gen)
    _score_tree(lm, committed, tree, nodes)
    ordered = sorted(PATHS, key=lambda p: (len(p), p))
    branch = _branch(tree, ordered.index(leaf_path)) if leaf_path else []
    lm.commit(torch.tensor([[0] + [1 + j for j in branch]]))  # tail offsets: pending token, then the branch
    committed = torch.cat([committed, nodes[:, branch], torch.tensor([[7]])], dim=1)  # + the target's token
    assert lm.length == lm.committed == committed.shape[1] - 1 == cache_length(lm.cache)

    cont = torch.randint(4, VOCAB, (1, 3), generator=gen)
    got = lm.forward(torch.cat([committed[:, -1:], cont], dim=1)).logits
    full = _full(model, torch.cat([committed, cont], dim=1))[:, -4:]
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", DECODER_ONLY + SEQ2SEQ_ARCHS)
def test_hidden_state_is_what_the_lm_head_reads(models, arch):
    model = models(arch, layers=2, seed=0)
    lm = CachedLM(model)
    committed = lm.start(torch.tensor([[5, 9, 14, 22]]))
    out = lm.forward(torch.cat([committed[:, lm.length :], torch.tensor([[30, 31]])], dim=1), want_hidden=True)
    assert out.hidden is not None and out.hidden.shape[:2] == out.logits.shape[:2]
    head = model.get_output_embeddings()
    scale = model.config.d_model**-0.5 if arch == "t5" and model.config.tie_word_embeddings else 1.0
    bias = getattr(model, "final_logits_bias", 0.0)  # BART / Marian add a bias after the head
    torch.testing.assert_close(head(out.hidden * scale) + bias, out.logits, rtol=0, atol=1e-9)
    assert lm.forward(torch.tensor([[4]])).hidden is None  # computed only when asked for


@pytest.mark.parametrize("arch", SEQ2SEQ_ARCHS)
def test_trees_are_refused_where_positions_cannot_be_given(models, arch):
    lm = CachedLM(models(arch, layers=1, seed=0))
    committed = lm.start(torch.tensor([[5, 9, 14]]))
    tree = TreeSpec.from_paths([(0,), (1,)])
    with pytest.raises(DraftVerifyError, match="cannot score a token tree"):
        _score_tree(lm, committed, tree, torch.tensor([[10, 11]]))


def test_mask_of_the_wrong_size_is_refused(models):
    lm = CachedLM(models("llama", layers=1, seed=0))
    committed = lm.start(torch.tensor([[5, 9, 14]]))
    with pytest.raises(DraftVerifyError, match="attention mask must cover"):
        lm.forward(committed[:, -1:], attention_mask=torch.ones(2, 2, dtype=torch.bool))


# ---------------------------------------------------------------- the preallocated (static) cache


def _random_walk(lm: CachedLM, prompt: torch.Tensor, gen: torch.Generator, tree: TreeSpec, steps: int = 6):
    """Alternate chain steps and tree steps with random accepted lengths; return every step's logits."""
    committed = lm.start(prompt)
    seen = []
    for step in range(steps):
        nodes = torch.randint(4, VOCAB, (1, tree.size), generator=gen)
        if step % 2:
            seen.append(_score_tree(lm, committed, tree, nodes).logits)
            leaf = int(torch.randint(0, tree.retrieve_indices.shape[0], (1,), generator=gen))
            branch = [j for j in tree.retrieve_indices[leaf].tolist() if j >= 0]
            branch = branch[: int(torch.randint(0, len(branch) + 1, (1,), generator=gen))]
            lm.commit(torch.tensor([[0] + [1 + j for j in branch]]))
            kept = nodes[:, branch]
        else:
            seen.append(lm.forward(torch.cat([committed[:, lm.length :], nodes], dim=1)).logits)
            accepted = int(torch.randint(0, tree.size + 1, (1,), generator=gen))
            lm.commit(1 + accepted)
            kept = nodes[:, :accepted]
        committed = torch.cat([committed, kept, torch.randint(4, VOCAB, (1, 1), generator=gen)], dim=1)
        assert lm.length == committed.shape[1] - 1
    return seen


@pytest.mark.parametrize("arch", DECODER_ONLY)
def test_static_cache_matches_the_growing_cache(models, float64_softmax, arch):
    model = models(arch, layers=2, seed=2)
    tree = TreeSpec.from_paths(PATHS)
    prompt = torch.randint(4, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    growing = _random_walk(CachedLM(model), prompt, torch.Generator().manual_seed(2), tree)
    static_lm = CachedLM(model, capacity=80)
    static = _random_walk(static_lm, prompt, torch.Generator().manual_seed(2), tree)
    for a, b in zip(growing, static):
        torch.testing.assert_close(b, a, rtol=0, atol=ATOL)
    assert static_lm.cache.layers[0].keys.shape[2] == 80  # still the one preallocated buffer


@pytest.mark.parametrize("rows", [False, True])
def test_logits_to_keep_gives_the_last_positions_of_a_full_forward(models, rows):
    """logits_to_keep=k gives the last k positions' logits as a forward of every position gives them (the model's
    own logits_to_keep: the LM head runs on those rows only), on one row and on left-padded rows, where a row's
    padding is never among the last k; the hidden states stay every position's."""
    model = models("llama", layers=2, seed=2)
    every, last = CachedLM(model), CachedLM(model)
    if rows:
        ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
        mask = ids != 0
        step = torch.tensor([[0, 13, 14], [15, 16, 17]])
        valid = step != 0
    else:
        ids, mask, step, valid = torch.tensor([[5, 6, 7, 8]]), None, torch.tensor([[13, 14, 15]]), None
    for lm in (every, last):
        lm.start(ids, attention_mask=mask)
    want = every.forward(step, want_hidden=True, new_valid=valid)
    got = last.forward(step, want_hidden=True, new_valid=valid, logits_to_keep=2)
    torch.testing.assert_close(got.logits, want.logits[:, 1:], rtol=0, atol=1e-6)
    assert got.hidden.shape == want.hidden.shape


def test_static_cache_refuses_what_it_cannot_hold(models):
    model = models("llama", layers=1, seed=0)
    with pytest.raises(DraftVerifyError, match="capacity"):
        CachedLM(model, capacity=0)
    with pytest.raises(DraftVerifyError, match="preallocated"):
        CachedLM(model, compile=True)
    with pytest.raises(DraftVerifyError, match="decoder-only"):
        CachedLM(models("t5", layers=1, seed=0), capacity=32)
    lm = CachedLM(model, capacity=8)
    with pytest.raises(DraftVerifyError, match="holds 8 positions"):
        lm.check_fits(9)
    committed = lm.start(torch.tensor([[5, 6, 7, 8, 9]]))
    with pytest.raises(DraftVerifyError, match="holds 8 positions"):
        lm.forward(torch.cat([committed[:, lm.length :], torch.tensor([[1, 2, 3, 4, 5]])], dim=1))


def test_compiled_forward_pads_to_a_bucket_and_stays_exact(models):
    """One compiled graph (width 3 padded to 4); output equals the target's greedy text. Slow: it compiles."""
    from conftest import reference_greedy, varied_model
    from draftverify import SamplingParams, generate
    from draftverify.backends.hf.compiled_widths import bucket
    from draftverify.drafters import ModelDrafter
    from draftverify.methods import MethodOptions, build_verifier

    assert [bucket(w) for w in (1, 3, 5, 9, 64, 65)] == [1, 4, 8, 16, 64, 65]
    model = varied_model("llama").float()
    prompt = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
    lm = CachedLM(model, capacity=32, compile=True)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(lm, ModelDrafter(model), verifier, prompt, max_new_tokens=9, gamma=2)
    assert out.new_tokens[0].tolist() == reference_greedy(model, prompt, 9)
    assert out.stats.target_calls == 3 and lm.length == prompt.shape[1] + 9 - 1  # padding never kept


def test_a_forward_wider_than_every_compiled_width_runs_eagerly_without_compiling(models):
    """Compiled widths (3,): drafts of 2 pad to 3 (one graph); drafts of 4 (width 5) run eager on the same cache,
    compiling nothing more; both texts equal the target's greedy text. Slow: it compiles one graph."""
    from torch._dynamo.utils import counters

    from conftest import reference_greedy, varied_model
    from draftverify import SamplingParams, generate
    from draftverify.drafters import ModelDrafter
    from draftverify.methods import MethodOptions, build_verifier

    model = varied_model("llama").float()
    prompt = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
    lm = CachedLM(model, capacity=32, compile=True)
    lm.widths = (3,)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    expected = reference_greedy(model, prompt, 9)
    assert (
        generate(lm, ModelDrafter(model), verifier, prompt, max_new_tokens=9, gamma=2).new_tokens[0].tolist()
        == expected
    )
    frames = counters["frames"]["total"]
    out = generate(lm, ModelDrafter(model), verifier, prompt, max_new_tokens=9, gamma=4)
    assert out.new_tokens[0].tolist() == expected and out.stats.target_calls == 2
    assert counters["frames"]["total"] == frames  # width 5: eager, no graph compiled


@pytest.mark.parametrize("arch", DECODER_ONLY)
def test_tree_mask_also_reaches_the_sdpa_attention(arch):
    """transformers 5 passes a 4-D mask through unchanged to eager and SDPA attention alike; check SDPA too."""
    import copy

    from conftest import build_model

    model = copy.deepcopy(build_model(arch, layers=2, seed=0))
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    gen = torch.Generator().manual_seed(5)
    tree = TreeSpec.from_paths(PATHS)
    lm = CachedLM(model)
    committed = lm.start(torch.randint(4, VOCAB, (1, 6), generator=gen))
    nodes = torch.randint(4, VOCAB, (1, tree.size), generator=gen)
    logits = _score_tree(lm, committed, tree, nodes).logits
    for j in range(tree.size):
        sequence = torch.cat([committed, nodes[:, _branch(tree, j)]], dim=1)
        torch.testing.assert_close(logits[:, 1 + j], _full(model, sequence)[:, -1], rtol=0, atol=1e-6)


def test_a_preallocated_cache_is_sized_to_the_request_not_to_the_model(models):
    """Every forward attends over all slots of a static cache: a request gets the next power of two above its
    positions plus the widest verify (at least 256, at most the capacity), and the logits do not change."""
    from draftverify.backends.hf.compiled_widths import window_for

    assert window_for(100, 2048) == 256 and window_for(300, 2048) == 512 and window_for(1990, 2048) == 2048
    assert window_for(300, 400) == 400
    model = models("llama", layers=2, seed=0)
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    lm = CachedLM(model, capacity=2048)
    lm.check_fits(40 + 100)
    assert lm.window == 256
    lm.start(ids)
    out = lm.forward(ids[:, -1:]).logits
    assert lm.cache.layers[0].keys.shape[2] == 256
    grown = CachedLM(model)
    grown.start(ids)
    assert torch.allclose(out, grown.forward(ids[:, -1:]).logits, atol=1e-5)
