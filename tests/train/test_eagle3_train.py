"""train eagle3: the training-time test unrolls the head exactly as it drafts, and the command refuses bad input."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from conftest import varied_model
from draftverify.cli import app
from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head, HeadCache
from draftverify.train.eagle3 import acceptance, padded_batch, target_features, ttt_loss, unrolled_logits

torch.set_num_threads(1)


def random_head(model) -> Eagle3Head:
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(model.config, model.get_output_embeddings())).double()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    return head


@torch.no_grad()
def test_the_unrolled_steps_equal_drafting_with_the_heads_cache():
    """Step s at anchor j of training equals the s-th draft after the pair at j, run as the drafter runs it (cache
    of the real pairs 0..j, then its own prenorm states), with the same input tokens."""
    model = varied_model("llama", layers=4)
    head = random_head(model)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    sequence = torch.randint(4, 96, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    features, _ = target_features(model, sequence, head.config.aux_layers)
    features = features.double()[None]  # [1, T, 3H]
    tokens = torch.tensor([sequence])
    unrolled = unrolled_logits(head, embed, lm_head, features, tokens, steps=5)
    assert [u.shape[1] for u in unrolled] == [19, 18, 17, 16, 15]
    for j in (0, 6, 13):
        cache = HeadCache()
        g = head.fc(features[:, : j + 1])
        prenorm = head.step(cache, embed(tokens[:, 1 : j + 2]), g, torch.arange(j + 1)[None])[:, -1:]
        for s in range(5):
            assert torch.allclose(head.logits(prenorm, lm_head)[0, -1], unrolled[s][0, j], atol=1e-9), (j, s)
            token = tokens[:, j + 2 + s : j + 3 + s]
            prenorm = head.step(cache, embed(token), prenorm, torch.tensor([[j + 1 + s]]))


def test_training_lowers_the_loss_and_raises_held_out_acceptance():
    model = varied_model("llama", layers=4)
    head = Eagle3Head(Eagle3Config.for_target(model.config, model.get_output_embeddings())).double()
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    gen = torch.Generator().manual_seed(2)
    blob: dict = {"features": [], "tokens": [], "labels": []}
    for length in (24, 30, 18):  # ragged: padded_batch right-pads them
        sequence = torch.randint(4, 96, (length,), generator=gen).tolist()
        features, labels = target_features(model, sequence, head.config.aux_layers)
        blob["features"].append(features.double())
        blob["tokens"].append(torch.tensor(sequence))
        blob["labels"].append(labels)
    batch = padded_batch(blob, [0, 1, 2])
    assert batch[0].shape[:2] == (3, 30) and int(batch[3].sum()) == 72
    with torch.no_grad():
        before_loss = float(ttt_loss(head, embed, lm_head, batch, steps=3))
    before = acceptance(head, embed, lm_head, blob, steps=3)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(60):
        optimizer.zero_grad()
        ttt_loss(head, embed, lm_head, batch, steps=3).backward()
        optimizer.step()
    with torch.no_grad():
        assert float(ttt_loss(head, embed, lm_head, batch, steps=3)) < 0.75 * before_loss
    after = acceptance(head, embed, lm_head, blob, steps=3)
    assert after[0] > before[0] and after == sorted(after, reverse=True)  # a later position needs the earlier ones


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ttt-steps", "0"], "--ttt-steps must be in 1..16"),
        (["--intermediate-size", "0"], "--intermediate-size must be >= 1"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
    ],
)
def test_bad_settings_are_refused_in_one_line(args, message, tmp_path):
    result = CliRunner().invoke(app, ["train", "eagle3", "--max-steps", "1", "--work-dir", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
