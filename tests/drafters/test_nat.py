"""SpecDec's NAT drafter: k mask slots filled in one pass over the verifier's encoder states (encoder-decoder targets)
or over the target's own kept hidden states (decoder-only targets); vanilla SpecDec (greedy verification) is exactly
the target's greedy decoding on tiny random models of both kinds, SpecDec++ (top-beta) keeps at least what greedy
keeps, and the drafter refuses targets it was not trained for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import build_model, forward_atol, target_and_reference
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.drafters import NatDecoder, NatDrafter
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.train.nat import nat_batch, nat_loss
from draftverify.train.nat_lm import Sequence, nat_lm_loss

torch.set_num_threads(1)

SOURCE = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 3]])
NEW = 24
ARCHS = ["marian", "bart"]


def fitted_nat(model, continuation: list[int], block_size: int = 4, steps: int = 100) -> NatDecoder:
    """A NAT drafter fitted on the target's own greedy continuation of SOURCE (the distilled target): it then
    agrees with the verifier often, so the exactness tests see long accepted runs and rejections alike."""
    torch.manual_seed(0)
    nat = NatDecoder.for_target(model, layers=1, block_size=block_size, ffn_size=64).double()
    labels = torch.tensor([continuation])
    batch = {"input_ids": SOURCE, "attention_mask": torch.ones_like(SOURCE), "labels": labels}
    opt = torch.optim.Adam(nat.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    for step in range(steps):
        loss = nat_loss(nat, model, batch, int(rng.integers(1, block_size + 1)), rng, 0.5 if step % 2 else 0.0, False)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return nat.eval()


@pytest.fixture(scope="module", params=ARCHS)
def fitted(request):
    model, ref = target_and_reference(request.param, SOURCE, NEW)
    return model, ref, fitted_nat(model, ref)


def greedy():
    return build_verifier("exact", SamplingParams(), MethodOptions())


@pytest.mark.parametrize("gamma", [1, 3, 4, 7])
def test_specdec_equals_target_greedy(fitted, gamma):
    model, ref, nat = fitted
    assert len(set(ref)) >= 5  # varied text, so equivalence is not vacuous
    out = generate(model, NatDrafter(nat), greedy(), SOURCE, max_new_tokens=NEW, gamma=gamma)
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.draft_calls == out.stats.target_calls  # one NAT forward per step, whatever k
    if gamma > 1:  # the drafts are used, and sometimes overruled: both paths of commit() run
        assert out.stats.accepted_tokens > 0 and out.stats.target_calls < NEW and out.stats.rejections > 0


def test_untrained_drafter_is_exact_too():
    """Whatever it proposes, greedy verification gives the target's text (random weights: nearly all rejected)."""
    model, ref = target_and_reference("marian", SOURCE, NEW)
    torch.manual_seed(1)
    nat = NatDecoder.for_target(model, layers=2, block_size=5).double()
    out = generate(model, NatDrafter(nat), greedy(), SOURCE, max_new_tokens=NEW, gamma=5)
    assert out.new_tokens[0].tolist() == ref


def test_draft_is_one_bidirectional_pass_over_prefix_and_slots(fitted):
    """propose() equals the decoder run from scratch on [committed tokens, k masks] over the source's encoding."""
    model, ref, nat = fitted
    seen = []

    class Spy(NatDrafter):
        def propose(self, state, gamma):
            draft = super().propose(state, gamma)
            seen.append((state.tokens.clone(), draft.tokens.clone()))
            return draft

    generate(model, Spy(nat), greedy(), SOURCE, max_new_tokens=NEW, gamma=3)
    memory = model.get_encoder()(input_ids=SOURCE).last_hidden_state
    with torch.no_grad():
        for tokens, draft in seen:
            k, L = draft.shape[1], tokens.shape[1]
            inputs = torch.cat([tokens, tokens.new_zeros((1, k - 1))], dim=1)  # k - 1 masks after the prefix
            slots = torch.zeros_like(inputs, dtype=torch.bool)
            slots[:, L:] = True
            expected = nat(model, inputs, slots, memory).argmax(dim=-1)[:, L - 1 :]
            assert torch.equal(draft, expected)
        # bidirectional: a later mask's content changes the prediction at the last committed token
        tokens = seen[0][0]
        inputs = torch.cat([tokens, tokens.new_zeros((1, 2))], dim=1)
        slots = torch.zeros_like(inputs, dtype=torch.bool)
        slots[:, -2:] = True
        all_masked = nat(model, inputs, slots, memory)[:, -3]
        slots[:, -1] = False
        inputs[:, -1] = 7
        assert not torch.allclose(all_masked, nat(model, inputs, slots, memory)[:, -3])


def test_specdec_plus_plus_keeps_at_least_what_greedy_keeps(fitted):
    """beta 1, tau 0 is greedy; a looser top-beta / tau keeps at least greedy's run of the same first draft (later
    steps differ: once it keeps a non-greedy token the text, and the drafts, go elsewhere)."""
    model, ref, nat = fitted

    def run(beta, tau):
        steps = []
        verifier = build_verifier("topbeta", SamplingParams(), MethodOptions(beta=beta, tau=tau))
        out = generate(
            model,
            NatDrafter(nat),
            verifier,
            SOURCE,
            max_new_tokens=NEW,
            gamma=4,
            on_tokens=lambda t: steps.append(t.shape[1]),
        )
        return out, steps

    exact_again, strict_steps = run(1, 0.0)
    assert exact_again.new_tokens[0].tolist() == ref
    loose, loose_steps = run(5, 6.0)
    assert loose_steps[0] >= strict_steps[0]
    assert loose.stats.rejections <= loose.stats.target_calls


def test_sampling_returns_the_slot_distributions(fitted):
    model, _, nat = fitted
    out = generate(
        model,
        NatDrafter(nat),
        build_verifier("exact", SamplingParams(temperature=1.0, seed=3), MethodOptions()),
        SOURCE,
        SamplingParams(temperature=1.0, seed=3),
        max_new_tokens=NEW,
        gamma=4,
    )
    assert out.new_tokens.shape[1] >= 1
    coupled_ref = generate(
        model,
        NatDrafter(nat),
        build_verifier("exact", SamplingParams(temperature=1.0, seed=3), MethodOptions()),
        SOURCE,
        SamplingParams(temperature=1.0, seed=3),
        max_new_tokens=NEW,
        gamma=1,
    )
    assert out.new_tokens[0].tolist() == coupled_ref.new_tokens[0].tolist()  # coupled: independent of k


def test_save_load_round_trip_and_registry(tmp_path, fitted):
    model, ref, nat = fitted
    nat.save(tmp_path / "nat")
    drafter = build_drafter("nat", None, MethodOptions(nat_path=tmp_path / "nat"))
    out = generate(model, drafter, greedy(), SOURCE, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref


def test_refuses_another_target_and_decoder_only(fitted):
    model, _, nat = fitted
    other, _ = target_and_reference("bart" if model.config.model_type == "marian" else "marian", SOURCE, NEW)
    with pytest.raises(DraftVerifyError, match="another target|d_model"):
        generate(other, NatDrafter(nat), greedy(), SOURCE, max_new_tokens=4)
    causal, _ = target_and_reference("llama", SOURCE, NEW)
    with pytest.raises(DraftVerifyError, match="trained for an encoder-decoder target"):
        generate(causal, NatDrafter(nat), greedy(), SOURCE, max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="nat_path"):
        build_drafter("nat", None, MethodOptions())


def test_nat_batch_cuts_and_labels():
    labels = torch.tensor([[11, 12, 13, 3], [21, 3, -100, -100]])
    tokens, slots, padding, targets = nat_batch(labels, 3, np.random.default_rng(0), 0, cuts=[2, 0])
    assert tokens[0, :3].tolist() == [0, 11, 12] and slots[0].tolist() == [False] * 3 + [True] * 2
    assert targets[0].tolist() == [-100, -100, 13, 3, -100]  # y_3 at y_2, eos at the first mask, past the end ignored
    assert tokens[1, 0] == 0 and slots[1, 1:3].all() and padding[1, 3:].all() and not padding[1, :3].any()
    assert targets[1, :3].tolist() == [21, 3, -100]


def test_marian_drafter_starts_from_the_target_decoder():
    """With no masks (k = 1) and the target's own layers, the drafter's prediction at the last committed token is the
    target's next-token prediction up to bidirectional attention over the prefix: on the first step (start token
    only) there is nothing later to see, so it is the target's exactly."""
    from transformers import MarianMTModel

    from draftverify.train.seq2seq import make_config

    torch.manual_seed(0)
    model = MarianMTModel(make_config("tiny", 96, 3)).double().eval()  # the zoo's layout: ReLU, post-LN
    nat = NatDecoder.for_target(model, layers=model.config.decoder_layers, block_size=1).double()
    memory = model.get_encoder()(input_ids=SOURCE).last_hidden_state
    start = torch.tensor([[model.config.decoder_start_token_id]])
    with torch.no_grad():
        ours = nat(model, start, torch.zeros_like(start, dtype=torch.bool), memory)[0, -1]
        theirs = model(input_ids=SOURCE, decoder_input_ids=start).logits[0, -1]
    assert torch.allclose(ours, theirs, atol=1e-6)


# --------------------------------------------------------------------------- decoder-only targets

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 3, 9, 12]])
CAUSAL = ["llama", "gpt_neox"]
WINDOW = 6  # shorter than the prompt: the kept states are cropped from the first step on


def fitted_nat_lm(model, continuation: list[int], block_size: int = 4, steps: int = 120) -> NatDecoder:
    """A decoder-only NAT drafter fitted on the target's own greedy continuation of PROMPT, from the target's hidden
    states over prompt + continuation (as `train nat` does): long accepted runs and rejections alike."""
    torch.manual_seed(0)
    nat = NatDecoder.for_target(model, layers=1, block_size=block_size, ffn_size=64, memory_window=WINDOW).double()
    tokens = PROMPT[0].tolist() + continuation
    with torch.no_grad():
        states = model(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]  # [T, H]
    seqs = [Sequence(tokens, PROMPT.shape[1] - 1, states)]
    opt = torch.optim.Adam(nat.parameters(), lr=3e-3)
    rng = np.random.default_rng(0)
    for step in range(steps):
        k = int(rng.integers(1, block_size + 1))
        loss = nat_lm_loss(nat, model, seqs, k, 8, rng, 0.5 if step % 2 else 0.0, False)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return nat.eval()


@pytest.fixture(scope="module", params=CAUSAL)
def fitted_lm(request):
    model, ref = target_and_reference(request.param, PROMPT, NEW)
    return model, ref, fitted_nat_lm(model, ref)


@pytest.mark.parametrize("gamma", [1, 3, 4, 6])
def test_decoder_only_specdec_equals_target_greedy(fitted_lm, gamma):
    model, ref, nat = fitted_lm
    assert len(set(ref)) >= 5  # varied text, so equivalence is not vacuous
    out = generate(model, NatDrafter(nat), greedy(), PROMPT, max_new_tokens=NEW, gamma=gamma)
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.draft_calls == out.stats.target_calls  # one NAT forward per step, whatever k
    if gamma > 1:  # the drafts are used, and sometimes overruled: both paths of commit() run
        assert out.stats.accepted_tokens > 0 and out.stats.target_calls < NEW and out.stats.rejections > 0


@pytest.mark.parametrize("arch", CAUSAL)
def test_decoder_only_untrained_drafter_is_exact_too(arch):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    torch.manual_seed(1)
    nat = NatDecoder.for_target(model, layers=2, block_size=5, memory_window=WINDOW).double()
    assert nat.config.memory_window == WINDOW and nat.config.max_positions == 5
    out = generate(model, NatDrafter(nat), greedy(), PROMPT, max_new_tokens=NEW, gamma=5)
    assert out.new_tokens[0].tolist() == ref
    one_token = generate(model, NatDrafter(nat), greedy(), PROMPT[:, :1], max_new_tokens=6, gamma=3)
    assert one_token.new_tokens.shape[1] == 6  # nothing prefilled: the first step drafts nothing


def test_decoder_only_draft_reads_the_last_w_states_before_the_pending_token(fitted_lm, float64_softmax):
    """At every step the drafter's memory is the target's last hidden states of the committed tokens but the
    pending one (recomputed from scratch), and its draft is the decoder run on [pending, MASK x (k-1)] over them."""
    model, _, nat = fitted_lm
    seen = []

    class Spy(NatDrafter):
        def propose(self, state, gamma):
            draft = super().propose(state, gamma)
            seen.append((state.tokens.clone(), self._memory.clone(), draft.tokens.clone()))
            return draft

    generate(model, Spy(nat), greedy(), PROMPT, max_new_tokens=NEW, gamma=3)
    assert len(seen) > 3
    with torch.no_grad():
        for tokens, memory, draft in seen:
            states = model(tokens[:, :-1], output_hidden_states=True).hidden_states[-1][:, -WINDOW:]
            assert torch.allclose(memory, states, rtol=0, atol=forward_atol(model, states)), (
                (memory - states).abs().max()
            )
            k = draft.shape[1]
            inputs = torch.cat([tokens[:, -1:], tokens.new_zeros((1, k - 1))], dim=1)
            slots = torch.ones_like(inputs, dtype=torch.bool)
            slots[:, 0] = False
            logits = nat(model, inputs, slots, states, memory_end=torch.tensor([[states.shape[1]]]))
            assert torch.equal(draft, logits.argmax(dim=-1))


def test_blocks_of_one_pass_equal_blocks_run_alone(fitted_lm):
    """Training packs many blocks into one pass (block-diagonal self-attention, a window per block): each block's
    logits equal those of the block run alone over its own window, the way the drafter runs at generation time."""
    model, ref, nat = fitted_lm
    tokens = PROMPT[0].tolist() + ref
    with torch.no_grad():
        states = model(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1]  # [1, T, H]
        k, cuts = 3, [9, 14, 20]
        inputs = torch.tensor([sum(([tokens[p]] + [0] * (k - 1) for p in cuts), [])])
        slots = torch.ones_like(inputs, dtype=torch.bool)
        slots[:, ::k] = False
        packed = nat(model, inputs, slots, states, memory_end=torch.tensor([cuts]))
        for j, p in enumerate(cuts):
            alone = nat(
                model,
                inputs[:, j * k : (j + 1) * k],
                slots[:, :k],
                states[:, max(0, p - WINDOW) : p],
                memory_end=torch.tensor([[min(p, WINDOW)]]),
            )
            assert torch.allclose(packed[:, j * k : (j + 1) * k], alone, rtol=0, atol=forward_atol(nat, alone))


def test_decoder_only_sampling_is_coupled_and_independent_of_k(fitted_lm):
    model, _, nat = fitted_lm
    params = SamplingParams(temperature=1.0, seed=3)

    def run(gamma):
        verifier = build_verifier("exact", params, MethodOptions())
        return generate(model, NatDrafter(nat), verifier, PROMPT, params, max_new_tokens=NEW, gamma=gamma)

    assert run(4).new_tokens[0].tolist() == run(1).new_tokens[0].tolist()
    drafter = NatDrafter(nat)
    uncoupled = SamplingParams(temperature=1.0, coupling=False, seed=5)
    out = generate(
        model,
        drafter,
        build_verifier("exact", uncoupled, MethodOptions()),
        PROMPT,
        uncoupled,
        max_new_tokens=NEW,
        gamma=4,
    )  # speculative sampling: the drafter returns q
    assert out.new_tokens.shape[1] == NEW


def test_decoder_only_refusals_and_batches(fitted_lm, tmp_path):
    model, _, nat = fitted_lm
    other = build_model(model.config.model_type, layers=2, seed=7)  # same shapes, other weights
    with pytest.raises(DraftVerifyError, match="another target"):
        generate(other, NatDrafter(nat), greedy(), PROMPT, max_new_tokens=4)
    seq2seq, _ = target_and_reference("marian", SOURCE, NEW)
    with pytest.raises(DraftVerifyError, match="trained for a decoder-only target"):
        generate(seq2seq, NatDrafter(nat), greedy(), SOURCE, max_new_tokens=4)
    alone = generate(model, NatDrafter(nat), greedy(), PROMPT, max_new_tokens=4).new_tokens[0].tolist()
    assert generate(model, NatDrafter(nat), greedy(), PROMPT.repeat(2, 1), max_new_tokens=4).rows == [alone] * 2


def test_decoder_only_save_load_and_older_files(fitted_lm, tmp_path):
    import json

    model, ref, nat = fitted_lm
    nat.save(tmp_path / "nat")
    assert json.loads((tmp_path / "nat" / "nat.json").read_text())["memory_window"] == WINDOW
    drafter = build_drafter("nat", None, MethodOptions(nat_path=tmp_path / "nat"))
    out = generate(model, drafter, greedy(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    # a file written before memory_window existed is an encoder-decoder drafter
    seq2seq, _ = target_and_reference("marian", SOURCE, NEW)
    NatDecoder.for_target(seq2seq, layers=1, block_size=3).save(tmp_path / "old")
    info = json.loads((tmp_path / "old" / "nat.json").read_text())
    del info["memory_window"]
    (tmp_path / "old" / "nat.json").write_text(json.dumps(info))
    assert NatDecoder.load(tmp_path / "old").config.memory_window == 0
