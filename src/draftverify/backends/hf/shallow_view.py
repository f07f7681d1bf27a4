"""A Hugging Face model's first layers as a model of their own, sharing its weights (the HF backend's
first_layers: BiLD's early-exit draft, section 4.4; the early-exit trainer's losses)."""

from __future__ import annotations

import copy

from torch import nn
from transformers import PreTrainedModel

from ...errors import DraftVerifyError

# (attribute path of the decoder body, name of its layer list, config field holding the layer count)
_LAYER_LAYOUTS = (
    ("model", "layers", "num_hidden_layers"),  # Llama, Qwen2, Mistral, Gemma, Phi, ...
    ("transformer", "h", "n_layer"),  # GPT-2, GPT-J, Bloom
    ("gpt_neox", "layers", "num_hidden_layers"),  # GPT-NeoX, Pythia
    ("model.decoder", "layers", "num_hidden_layers"),  # OPT
)


def _find_layers(model: PreTrainedModel) -> tuple[nn.Module, str, str]:
    for body_path, layers_attr, count_attr in _LAYER_LAYOUTS:
        body = model
        for part in body_path.split("."):
            body = getattr(body, part, None)
            if body is None:
                break
        if body is not None and isinstance(getattr(body, layers_attr, None), nn.ModuleList):
            return body, layers_attr, count_attr
    raise DraftVerifyError(
        f"early_exit does not know where the decoder layers of {type(model).__name__} are; supported: "
        "Llama-style (model.layers), GPT-2 style (transformer.h), GPT-NeoX (gpt_neox.layers), OPT "
        "(model.decoder.layers)"
    )


def shallow_view(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A model object running only the first num_layers decoder layers of `model`, sharing its weights."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise DraftVerifyError(
            "early_exit supports decoder-only targets; for encoder-decoder targets use a draft model"
        )
    body, layers_attr, count_attr = _find_layers(model)
    total = len(getattr(body, layers_attr))
    if not (1 <= num_layers < total):
        raise DraftVerifyError(
            f"early-exit layer count must be in [1, {total - 1}] for this {total}-layer target, got {num_layers}"
        )
    config = copy.deepcopy(model.config)  # never mutate the target's config
    config.num_hidden_layers = num_layers
    if hasattr(config, count_attr):
        setattr(config, count_attr, num_layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    new_body = copy.copy(body)
    new_body._modules = dict(body._modules)
    new_body._modules[layers_attr] = nn.ModuleList(list(getattr(body, layers_attr))[:num_layers])
    new_body.config = config
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.config = config
    # re-attach the shallow body at the same path
    parent, path = view, _body_path(model, body)
    for part in path[:-1]:
        child = copy.copy(getattr(parent, part))
        child._modules = dict(child._modules)
        parent._modules[part] = child
        parent = child
    parent._modules[path[-1]] = new_body
    return view


def _body_path(model: nn.Module, body: nn.Module) -> list[str]:
    for name, module in model.named_modules():
        if module is body:
            return name.split(".")
    raise AssertionError("decoder body not found in its own model")
