"""The protocol's module calls (backends/base.py: ModuleBackend), which drafters with weights of their own read the
target through: the hf backend answers them, the others declare has_modules False and are refused by name."""

from __future__ import annotations

import pytest
import torch

from draftverify.backends.base import (
    LMBackend,
    ModuleBackend,
    TargetModules,
    check_backend,
    kept_positions,
    require_modules,
)
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.backends.hf.shallow_view import shallow_view
from draftverify.backends.lean_draft import LeanDraft
from draftverify.backends.llamacpp import LlamaCppLM
from draftverify.errors import DraftVerifyError

IDS = torch.tensor([[5, 17, 33, 8, 41, 5]])


def test_the_hf_backend_answers_the_module_calls_and_the_others_declare_they_lack_them(models):
    lm = CachedLM(models("llama"))
    assert lm.has_modules and isinstance(lm, ModuleBackend) and isinstance(lm, LMBackend)
    for kind in (LlamaCppLM, LeanDraft):
        assert kind.has_modules is False and not hasattr(kind, "modules")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@torch.no_grad()
def test_modules_score_the_last_hidden_state_as_the_model_does(models, arch):
    model = models(arch)
    modules = CachedLM(model).modules()
    assert modules.input_embeddings is model.get_input_embeddings()
    assert modules.output_embeddings is model.get_output_embeddings()
    out = model(input_ids=IDS, output_hidden_states=True)
    assert torch.allclose(modules.logits(out.hidden_states[-1]), out.logits, atol=1e-5)
    assert torch.equal(modules.input_embeddings(IDS), model.get_input_embeddings()(IDS))


@torch.no_grad()
def test_modules_add_the_logits_bias_of_bart(models):
    model = models("bart")
    with torch.no_grad():
        model.final_logits_bias.normal_()  # a bias that is not zero, so leaving it out would show
    modules = CachedLM(model).modules()
    assert modules.logits_bias is model.final_logits_bias
    out = model(input_ids=IDS, decoder_input_ids=IDS[:, :3], output_hidden_states=True)
    assert torch.allclose(modules.logits(out.decoder_hidden_states[-1]), out.logits, atol=1e-5)
    assert TargetModules.of(model) == modules


@torch.no_grad()
def test_first_layers_is_a_backend_over_the_shared_first_layers(models):
    model = models("llama")
    early = CachedLM(model).first_layers(1, "early-exit draft")
    assert isinstance(early, CachedLM) and early.role == "early-exit draft" and early.config.num_hidden_layers == 1
    assert early.modules().output_embeddings is model.get_output_embeddings()  # weights shared, never copied
    early.start(IDS)
    want = shallow_view(model, 1)(input_ids=IDS).logits[:, -1:]
    assert torch.allclose(early.forward(IDS[:, -1:]).logits, want, atol=1e-5)


@torch.no_grad()
def test_encoder_states_are_this_generations_after_start(models):
    lm = CachedLM(models("t5"))
    with pytest.raises(DraftVerifyError, match="no encoder states"):
        lm.encoder_states()
    lm.start(IDS)
    states, mask = lm.encoder_states()
    assert states.shape[:2] == IDS.shape and torch.equal(mask, torch.ones_like(IDS))


def test_module_is_the_whole_model(models):
    model = models("llama")
    assert CachedLM(model).module() is model
    assert CachedLM(model).dtype == next(model.parameters()).dtype == torch.float64  # the test models are float64


def test_a_backend_without_modules_is_refused_by_name():
    class Plain:
        name = "plain"
        has_modules = False

    lm = CachedLM.__new__(CachedLM)
    assert require_modules(lm, "x") is lm
    with pytest.raises(
        DraftVerifyError,
        match="^early_exit needs the target's modules, which the plain backend does "
        "not offer; run it with --backend hf",
    ):
        require_modules(Plain(), "early_exit")


def test_check_backend_reads_what_the_backend_kind_offers_not_what_one_model_can(models):
    from draftverify import drafters  # noqa: F401  (fills the registry)
    from draftverify.registry import DRAFTERS

    t5 = CachedLM(models("t5"))
    assert not t5.takes_positions  # this model cannot score trees: the drafter's bind says why, with its reason
    check_backend(t5, DRAFTERS["model_tree"], "model_tree")
    with pytest.raises(DraftVerifyError, match="method 'early_exit' needs the target's own layers.*llamacpp backend"):
        check_backend(LlamaCppLM, DRAFTERS["early_exit"], "early_exit")


def test_logits_to_keep_counts_the_last_positions_as_hugging_faces_argument_does():
    assert [kept_positions(k, 4) for k in (0, 1, 3, 4, 9, -1)] == [4, 1, 3, 4, 4, 4]
