"""EAGLE-3 heads for the tiny test targets: a random one and one fitted to the target's own greedy text, shared by
the eagle3 and eagle3_tree tests. Imported as `from eagle3_heads import ...` (tests/ is on sys.path: its
conftest.py lives there)."""

from __future__ import annotations

import torch

from conftest import reference_greedy
from draftverify import SamplingParams
from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head
from draftverify.methods import MethodOptions, build_verifier
from draftverify.train.eagle3 import target_features, ttt_loss


def head_for(model, seed: int = 0, aux_layers: tuple[int, int, int] | None = None) -> Eagle3Head:
    torch.manual_seed(seed)
    config = Eagle3Config.for_target(model.config, model.get_output_embeddings(), aux_layers=aux_layers)
    return Eagle3Head(config).double()


def trained_head(
    model, prompts: list[list[int]], new: int, steps: int = 150, aux_layers: tuple[int, int, int] | None = None
) -> Eagle3Head:
    """A head fitted to the target's own greedy continuations (`new` tokens) of `prompts` (the recipe's loss)."""
    head = head_for(model, aux_layers=aux_layers)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    batch = []
    for prompt in prompts:
        sequence = prompt + reference_greedy(model, torch.tensor([prompt]), new)
        features, labels = target_features(model, sequence, head.config.aux_layers)
        batch.append((features.double(), torch.tensor(sequence), labels))
    width = max(len(b[1]) for b in batch)  # sequences of different lengths: right-padded, the padding not valid

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((width - t.shape[0], *t.shape[1:]))])

    features = torch.stack([pad(b[0]) for b in batch])
    tokens = torch.stack([pad(b[1]) for b in batch])
    labels = torch.stack([pad(b[2]) for b in batch])
    valid = torch.stack([pad(torch.ones(len(b[1]), dtype=torch.bool)) for b in batch])
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        ttt_loss(head, embed, lm_head, (features, tokens, labels, valid), steps=4).backward()
        optimizer.step()
    return head.eval()


def exact(params: SamplingParams | None = None):
    """The exact verifier (greedy by default)."""
    return build_verifier("exact", params or SamplingParams(), MethodOptions())
