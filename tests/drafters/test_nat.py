"""SpecDec's NAT drafter: k mask slots filled in one pass over the verifier's encoder states; vanilla SpecDec (greedy
verification) is exactly the target's greedy decoding on tiny random encoder-decoders, SpecDec++ (top-beta) keeps
at least what greedy keeps, and the drafter refuses targets it was not trained for."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import target_and_reference

from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.drafters import NatDecoder, NatDrafter
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.train.nat import nat_batch, nat_loss

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
            expected = nat(model, inputs, slots, memory).argmax(dim=-1)[:, L - 1:]
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
        out = generate(model, NatDrafter(nat), verifier, SOURCE, max_new_tokens=NEW, gamma=4,
                       on_tokens=lambda t: steps.append(t.shape[1]))
        return out, steps

    exact_again, strict_steps = run(1, 0.0)
    assert exact_again.new_tokens[0].tolist() == ref
    loose, loose_steps = run(5, 6.0)
    assert loose_steps[0] >= strict_steps[0]
    assert loose.stats.rejections <= loose.stats.target_calls


def test_sampling_returns_the_slot_distributions(fitted):
    model, _, nat = fitted
    out = generate(model, NatDrafter(nat), build_verifier("exact", SamplingParams(temperature=1.0, seed=3), MethodOptions()),
                   SOURCE, SamplingParams(temperature=1.0, seed=3), max_new_tokens=NEW, gamma=4)
    assert out.new_tokens.shape[1] >= 1
    coupled_ref = generate(model, NatDrafter(nat), build_verifier("exact", SamplingParams(temperature=1.0, seed=3), MethodOptions()),
                           SOURCE, SamplingParams(temperature=1.0, seed=3), max_new_tokens=NEW, gamma=1)
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
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
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
