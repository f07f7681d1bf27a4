"""A target wrapped with extra embedded positions: its verify passes carry them, everything else is the target's."""

from __future__ import annotations

import pytest
import torch

from conftest import varied_model
from draftverify import DraftVerifyError
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters.extra_positions import ExtraPositionsTarget, VerifyExtras

PROMPT = torch.tensor([[5, 17, 33, 8, 41]])


def two_extras(model):
    embedding = model.get_input_embeddings()

    def extras(tree, length, batch):
        mask = torch.ones(2, 1 + length + 2, dtype=torch.bool).tril(diagonal=1 + length)  # [E, 1+N+E]
        return VerifyExtras(
            embeds=embedding(torch.tensor([[3, 4]])).expand(batch, -1, -1),
            positions=length + 1 + torch.arange(2),
            mask=mask,
        )

    return extras


def test_a_chain_pass_scores_the_same_and_returns_the_extras_after_it():
    model = varied_model("llama")
    plain, wrapped = CachedLM(model), ExtraPositionsTarget(CachedLM(model), two_extras(model), "test")
    tokens = torch.tensor([[41, 7, 9]])  # the pending token and two drafts
    outs = []
    for target in (plain, wrapped):
        target.start(PROMPT)
        outs.append(target.forward(tokens).logits)
    assert outs[1].shape[1] == 3 + 2
    torch.testing.assert_close(outs[1][:, :3], outs[0], rtol=0, atol=1e-5)
    wrapped.commit(2)  # everything else is the target's own: the extras are never committed
    assert wrapped.length == wrapped.target.length == PROMPT.shape[1] - 1 + 2


def test_a_backend_without_embedded_positions_is_refused():
    class TokenIdsOnly:
        name = "llamacpp"

    with pytest.raises(DraftVerifyError, match="the llamacpp backend does not take; run it with --backend hf"):
        ExtraPositionsTarget(TokenIdsOnly(), lambda *a: None, "bita")


def test_a_ragged_chains_padding_is_scored_like_every_column():
    """The extras follow every row's columns, so new_valid (a ragged chain's padding) changes nothing."""
    model = varied_model("llama")
    outs = []
    for new_valid in (None, torch.tensor([[True, True, False]])):
        wrapped = ExtraPositionsTarget(CachedLM(model), two_extras(model), "test")
        wrapped.start(PROMPT)
        outs.append(wrapped.forward(torch.tensor([[41, 42, 43]]), new_valid=new_valid).logits)
    assert outs[0].shape[1] == 3 + 2 and torch.equal(outs[0], outs[1])
