"""The target backend seam (backends/base.py): CachedLM is one implementation; a third backend plugs into the
loop and the drafters without touching them; methods a backend cannot run are refused by name."""

from __future__ import annotations

import pytest
import torch

from conftest import target_and_reference
from draftverify import CachedLM, DraftVerifyError, generate
from draftverify.backends.base import LMBackend, OneRow, check_backend, is_backend
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.registry import DRAFTERS, lookup
from draftverify.types import SamplingParams, TargetOutput


class RecomputingLM(OneRow):
    """A deliberately naive backend: no KV cache, every forward recomputes the whole text with the HF model; chains
    only, one row (OneRow answers the row calls from commit). What the loop needs of a target is the protocol, so
    this runs every chain method unchanged."""

    name = "recompute"
    is_encoder_decoder = False
    takes_positions = False
    exposes_hidden = False
    has_modules = False

    def __init__(self, model):
        self.model, self.role = model, "target"
        self.device = torch.device("cpu")
        self.vocab_size = model.config.vocab_size
        self.max_positions = None
        self.ids: list[int] = []  # committed positions, then the tail
        self.committed = 0
        self.prefilled = None

    @property
    def length(self) -> int:
        return len(self.ids)

    def check_fits(self, decoder_positions: int) -> None:
        pass

    def start(self, input_ids, want_hidden=False, attention_mask=None):
        self.ids, self.committed = input_ids[0, :-1].tolist(), input_ids.shape[1] - 1
        return input_ids

    def forward(
        self, tokens, position_ids=None, attention_mask=None, want_hidden=False, new_valid=None, logits_to_keep=0
    ) -> TargetOutput:
        assert position_ids is None and attention_mask is None, "chains only"
        self.ids += tokens[0].tolist()
        logits = self.model(input_ids=torch.tensor([self.ids])).logits
        return TargetOutput(logits=logits[:, -(logits_to_keep or tokens.shape[1]) :])

    def commit(self, kept) -> None:
        self.committed += int(kept)
        self.ids = self.ids[: self.committed]


def test_cached_lm_is_a_backend_and_a_hf_model_is_not(models):
    model = models("llama")
    assert is_backend(CachedLM(model)) and isinstance(CachedLM(model), LMBackend)
    assert not is_backend(model)


@pytest.mark.parametrize("drafter", ["none", "prompt_lookup", "model"])
def test_a_third_backend_runs_the_loop_unchanged(drafter):
    prompt = torch.tensor([[5, 17, 42, 8, 5, 17, 42, 8, 5]])
    model, want = target_and_reference("llama", prompt, 16)
    backend = RecomputingLM(model)
    options = MethodOptions(draft_model=model)  # the HF draft on its own CachedLM beside a non-HF target
    out = generate(
        backend,
        build_drafter(drafter, backend, options),
        build_verifier("exact", SamplingParams(), options),
        prompt,
        max_new_tokens=16,
        gamma=3,
    )
    assert out.new_tokens[0].tolist() == want
    if drafter == "model":
        assert out.stats.target_calls < 16


@pytest.mark.parametrize(
    "method, needs",
    [
        ("bpd", "hidden states and LM head"),
        ("bita", "extra embedded positions"),
        ("early_exit", "own layers"),
        ("specdec", "Hugging Face modules"),
        ("model_tree", "token trees"),
    ],
)
def test_a_method_needing_what_a_backend_lacks_is_refused_by_name(method, needs):
    from draftverify import drafters  # noqa: F401
    from draftverify.methods import resolve_method

    with pytest.raises(DraftVerifyError, match=f"method '{method}' needs .*{needs}.*recompute backend.*--backend hf"):
        check_backend(RecomputingLM, lookup(DRAFTERS, "drafter", resolve_method(method).drafter), method)
    check_backend(RecomputingLM, lookup(DRAFTERS, "drafter", "prompt_lookup"), "prompt_lookup")  # chains are fine


def test_a_batch_on_a_one_row_backend_is_refused(models):
    backend = RecomputingLM(models("llama"))
    with pytest.raises(DraftVerifyError, match="recompute backend decodes one row at a time"):
        generate(
            backend,
            build_drafter("none", backend, MethodOptions()),
            build_verifier("exact", SamplingParams(), MethodOptions()),
            torch.tensor([[5, 6], [7, 8]]),
            max_new_tokens=2,
        )


def test_generate_backend_llamacpp_without_the_extra_exits_2_with_the_install_command(monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from draftverify.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    result = CliRunner().invoke(app, ["generate", "--zoo", "code", "-p", "x", "--backend", "llamacpp"])
    assert result.exit_code == 2
    assert 'pip install -e ".[llamacpp]"' in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = CliRunner().invoke(app, ["generate", "--zoo", "code", "-p", "x", "--backend", "vllm"])
    assert result.exit_code == 2 and "--backend must be one of hf, llamacpp" in result.stderr
