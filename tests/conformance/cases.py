"""The suite's cases and the promise each is held to (test_methods.py runs them; test_registry.py shows a newly
registered method among them)."""

from __future__ import annotations

import pytest

from conftest import ALL_ARCHS
from draftverify.types import SamplingParams

from .conftest import is_lossless, registered_methods
from .subjects import NEW, Refused, Subject, llamacpp_missing

MODES = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=1.0, seed=11)}
SUBJECTS = [("hf", arch) for arch in ALL_ARCHS] + [("llamacpp", "llama")]


def cases() -> list:
    """(method, backend, arch, mode) for every registered method; lossy methods marked `lossy`, ids `name[lossy]`."""
    out = []
    for name in registered_methods():
        lossless = is_lossless(name)
        for backend, arch in SUBJECTS:
            for mode in MODES:
                marks = [] if lossless else [pytest.mark.lossy]
                if backend == "llamacpp" and llamacpp_missing():
                    marks.append(pytest.mark.skip(reason=llamacpp_missing()))
                label = name if lossless else f"{name}[lossy]"
                out.append(pytest.param(name, backend, arch, mode, marks=marks, id=f"{label}-{backend}-{arch}-{mode}"))
    return out


def check(subject: Subject, name: str, params: SamplingParams) -> None:
    """Method `name` keeps its promise on this subject; pytest.skip where the subject refuses it as documented."""
    try:
        out = subject.run(name, params)
    except Refused as refusal:
        if not subject.refusals_allowed:
            pytest.fail(f"{name} refused on {subject}, which runs every method: {refusal}")
        pytest.skip(f"{subject} refuses {name}: {refusal}")
    tokens = out.new_tokens[0].tolist()
    vocab = subject.model.get_output_embeddings().weight.shape[0]
    assert 0 < len(tokens) <= NEW and all(0 <= t < vocab for t in tokens), tokens
    if is_lossless(name):
        reference = subject.reference(params)
        assert len(set(reference)) >= 4, f"{subject}: reference text too repetitive to test anything"
        assert tokens == reference, f"{name} on {subject}"
        stats = out.stats
        # each target call adds one token of its own, except that the last call's may fall past max_new_tokens
        assert (
            stats.accepted_tokens + stats.target_calls - 1
            <= stats.new_tokens
            <= stats.accepted_tokens + stats.target_calls
        )
        return
    assert subject.run(name, params).new_tokens[0].tolist() == tokens  # the same seed (or none), the same text
    eos = tokens[len(tokens) // 2]
    assert subject.run(name, params, eos=eos).new_tokens[0].tolist() == tokens[: tokens.index(eos) + 1]
