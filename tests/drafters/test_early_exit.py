"""shallow_view (BiLD section 4.4 early exit): the target's first L layers, sharing its weights, config untouched."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import build_model, forward_atol
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.backends.hf.shallow_view import shallow_view
from draftverify.drafters import EarlyExitDrafter
from draftverify.errors import DraftVerifyError

torch.set_num_threads(1)

ARCHS = ["llama", "gpt2", "gpt_neox"]
LAYERS = 3
IDS = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 60]])
LAYER_LISTS = {"llama": "model.layers", "gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers"}


def layer_list(model, arch):
    obj = model
    for part in LAYER_LISTS[arch].split("."):
        obj = getattr(obj, part)
    return obj


_targets: dict = {}


def target(arch):
    if arch not in _targets:
        _targets[arch] = build_model(arch, layers=LAYERS, seed=3, scale=1.5)
    return _targets[arch]


def truncated_reference(arch, model, num_layers):
    """An independently built num_layers-layer model of the same architecture loaded with the target's weights."""
    small = build_model(arch, layers=num_layers, seed=99)  # other random weights, overwritten below
    prefix = LAYER_LISTS[arch] + "."
    keep = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(prefix) and int(name[len(prefix) :].split(".")[0]) >= num_layers:
            continue
        keep[name] = tensor
    small.load_state_dict(keep, strict=True)
    return small


@pytest.mark.parametrize("arch", ARCHS)
def test_shares_parameters(arch):
    model = target(arch)
    view = shallow_view(model, 1)
    own = dict(model.named_parameters())
    names = dict(view.named_parameters())
    assert names, "the view has no parameters"
    for name, p in names.items():
        assert name in own, name
        assert p.data_ptr() == own[name].data_ptr(), name
        assert p is own[name]
    # only layer 0 of the decoder stack is part of the view
    prefix = LAYER_LISTS[arch] + "."
    layer_ids = {n[len(prefix) :].split(".")[0] for n in names if n.startswith(prefix)}
    assert layer_ids == {"0"}
    # and nothing was copied: total storage is a subset of the target's
    assert sum(p.numel() for p in view.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2])
@torch.no_grad()
def test_logits_equal_truncated_model(arch, num_layers):
    model = target(arch)
    view = shallow_view(model, num_layers)
    reference = truncated_reference(arch, model, num_layers)
    got = view(input_ids=IDS).logits
    want = reference(input_ids=IDS).logits
    assert torch.allclose(got, want, atol=1e-10, rtol=0), (got - want).abs().max()
    # and it is not the full model
    full = model(input_ids=IDS).logits
    assert not torch.allclose(got, full, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_runs_exactly_the_first_layers(arch):
    model = target(arch)
    view = shallow_view(model, 2)
    calls = [0] * LAYERS
    handles = [
        layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(layer_list(model, arch))
    ]
    try:
        view(input_ids=IDS)
    finally:
        for h in handles:
            h.remove()
    assert calls == [1, 1, 0]


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_cached_view_matches_truncated_model_incrementally(arch):
    """Through CachedLM (its own KV cache of L layers): prefill + one token per step equals the truncated model."""
    model = target(arch)
    lm = CachedLM(shallow_view(model, 1), role="early-exit draft")
    reference = truncated_reference(arch, model, 1)
    lm.start(IDS[:, :4])
    steps = [lm.forward(IDS[:, 3:4]).logits[:, -1]] + [lm.forward(IDS[:, i : i + 1]).logits[:, -1] for i in range(4, 8)]
    assert lm.length == 8
    assert len(lm.cache.layers) == 1
    want = reference(input_ids=IDS).logits[:, 3:]
    got = torch.stack(steps, dim=1)
    assert torch.allclose(got, want, rtol=0, atol=forward_atol(model, want)), (got - want).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_target_config_and_layers_untouched(arch):
    model = target(arch)
    config_before = copy.deepcopy(model.config.to_dict())
    layers = layer_list(model, arch)
    layer_objects = list(layers)
    logits_before = model(input_ids=IDS).logits
    view = shallow_view(model, 1)
    view(input_ids=IDS)
    EarlyExitDrafter(model, num_layers=2)
    assert model.config.to_dict() == config_before
    assert model.config.num_hidden_layers == LAYERS
    assert layer_list(model, arch) is layers
    assert list(layers) == layer_objects and len(layers) == LAYERS
    assert view.config is not model.config and view.config.num_hidden_layers == 1
    assert len(layer_list(view, arch)) == 1
    assert torch.equal(model(input_ids=IDS).logits, logits_before)


@pytest.mark.parametrize("num_layers", [0, -1, LAYERS, LAYERS + 1])
def test_rejects_layer_count_out_of_range(num_layers):
    with pytest.raises(DraftVerifyError, match=r"\[1, 2\]"):
        shallow_view(target("llama"), num_layers)
    with pytest.raises(DraftVerifyError):
        EarlyExitDrafter(target("gpt2"), num_layers=num_layers)


def test_accepts_cached_lm_target():
    drafter = EarlyExitDrafter(CachedLM(target("llama")), num_layers=2)
    assert drafter.num_layers == 2 and drafter.lm.config.num_hidden_layers == 2


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_rejects_encoder_decoder(arch):
    model = build_model(arch, layers=2)
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        shallow_view(model, 1)
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        EarlyExitDrafter(model, num_layers=1)
