"""The next-token losses the CPU recipes and the GPU one (scripts/gpu_zoo.py train) share."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from draftverify.train import losses  # noqa: E402
from draftverify.train.presets import make_config  # noqa: E402

TINY = dict(
    hidden_size=16,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=32,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(make_config("tiny", 50, 0, **TINY)).eval()


def _ce(logits, x):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))


def test_the_early_layer_loss_is_that_of_the_early_exit_drafters_model(model):
    """Training and drafting read layer L the same way: the early loss is the cross-entropy of the logits of
    backends.hf.shallow_view (first L layers, then the target's own final norm and LM head)."""
    from draftverify.backends.hf.shallow_view import shallow_view

    x = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for layer in (1, 2):
            final, early = losses.next_token_losses(model, x, layer)
            assert final == pytest.approx(float(_ce(model(input_ids=x[:, :-1]).logits, x)), rel=1e-5)
            view_logits = shallow_view(model, layer)(input_ids=x[:, :-1]).logits
            assert early == pytest.approx(float(_ce(view_logits, x)), rel=1e-5)
            assert abs(float(early) - float(final)) > 1e-4  # a different layer, a different loss
        assert losses.next_token_losses(model, x)[1] is None


def test_averaged_loss_is_bilds_plain_mean():
    assert float(losses.averaged_loss(torch.tensor(2.0), torch.tensor(3.0))) == 2.5


def test_held_out_losses_batch_independent_and_mode_restoring(model):
    windows = torch.randint(0, 50, (5, 9), generator=torch.Generator().manual_seed(2))
    model.train()
    one = losses.held_out_losses(model, windows, False, 1, exit_layer=2)
    assert model.training
    many = losses.held_out_losses(model, windows, False, 4, exit_layer=2)
    assert one == pytest.approx(many, rel=1e-5)
    assert losses.evaluate(model, windows, False, 5) == pytest.approx(one[0], rel=1e-5)
    assert losses.held_out_losses(model, windows, False, 5)[1] is None
    model.eval()


def test_a_model_without_a_final_norm_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32))
    with pytest.raises(losses.TrainError, match="Llama-style"):
        losses.next_token_losses(gpt2, torch.randint(0, 50, (1, 5)), 1)


def test_autocast_takes_a_device_or_its_name_and_none_means_every_local_kind():
    from draftverify.train.losses import autocast

    x = torch.ones(2, 2)
    for device in (None, "cpu", torch.device("cpu")):
        with autocast(True, device):
            assert torch.mm(x, x).dtype == torch.bfloat16
    with autocast(False, torch.device("cpu")):
        assert torch.mm(x, x).dtype == torch.float32
