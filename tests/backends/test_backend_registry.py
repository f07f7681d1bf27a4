"""The backend registry (backends/registry.py): --backend and load(backend=...) are a lookup, with one error that
lists the names; a backend of one's own plugs in with register_backend."""

from __future__ import annotations

import pytest

from draftverify import load
from draftverify.backends import registry
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.backends.registry import BACKENDS, BackendEntry, as_backend, register_backend, target_backend
from draftverify.errors import DraftVerifyError

CALLS: list[tuple] = []


def toy_loader(target, draft, method, *rest):
    CALLS.append((target, draft, method))
    return "a pipeline"


def test_the_registered_backends_and_the_ones_that_run_a_target():
    assert list(BACKENDS) == ["hf", "llamacpp", "lean"]
    assert registry.target_backends() == ["hf", "llamacpp"]  # lean runs draft models only
    for entry in BACKENDS.values():
        assert entry.backend_class().name == entry.name  # the class's name is the one it is registered under
    assert target_backend("hf").backend_class() is CachedLM
    assert registry.backends_that("compiles") == "hf" and registry.backends_that("batches") == "hf or llamacpp"


@pytest.mark.parametrize("name", ["vllm", "lean", None, 3])
def test_an_unknown_backend_is_one_line_listing_the_known_ones(name):
    with pytest.raises(DraftVerifyError, match=r"^backend must be one of hf, llamacpp, got "):
        target_backend(name)
    with pytest.raises(DraftVerifyError, match=r"^--backend must be one of hf, llamacpp, got "):
        target_backend(name, "--backend")
    with pytest.raises(DraftVerifyError, match=r"^backend must be one of hf, llamacpp, got "):
        load(target="nowhere", backend=name)  # before anything is read


def test_a_backend_of_ones_own_is_chosen_by_load(monkeypatch):
    monkeypatch.setattr(registry, "BACKENDS", dict(BACKENDS))
    entry = register_backend(
        BackendEntry("toy", "a toy", "draftverify.backends.hf.cached_lm:CachedLM", loader=f"{__name__}:toy_loader")
    )
    assert registry.target_backends() == ["hf", "llamacpp", "toy"]
    assert load(target="t", draft="d", method="model", backend="toy") == "a pipeline"
    assert CALLS[-1] == ("t", "d", "model")
    with pytest.raises(DraftVerifyError, match="named 'toy' is registered already"):
        register_backend(entry)
    with pytest.raises(DraftVerifyError, match="on the toy backend the draft loads at dtype"):
        load(target="t", backend="toy", draft_gguf="q8_0")  # an option only the llamacpp backend reads


def test_as_backend_keeps_a_backend_and_puts_a_model_on_the_hf_backend(models):
    model = models("llama")
    lm = as_backend(model, "draft")
    assert isinstance(lm, CachedLM) and lm.role == "draft" and lm.module() is model
    assert as_backend(lm, "target") is lm
