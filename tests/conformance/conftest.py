"""The conformance suite's one view of the method registry: which methods exist, what each declares it needs, and
whether its rule is lossless. Every other file of the suite reads the registry through these functions only."""

from __future__ import annotations

import pytest
import torch

from draftverify.methods import Method, MethodOptions, build_verifier, registered_methods as declared_methods
from draftverify.options import drafter_fields
from draftverify.types import SamplingParams

torch.set_num_threads(1)  # tiny models: threads cost more than they give (as in tests/drafters)

DRAFT_MODEL = "draft_model"  # the need of a method that runs a separate draft model (its option's name)


def registered_methods() -> dict[str, Method]:
    """Every registered method by name (each drafter's one declaration, registry.register_methods)."""
    return {method.name: method for method in declared_methods()}


def declared_needs(name: str) -> dict[str, str]:
    """What method `name` cannot run without, as option name -> what it is: a draft model when it declares one,
    and each file its drafter's declared options read (an n-gram table, blockwise heads, a BiTA adapter, ...)."""
    method = registered_methods()[name]
    needs = {DRAFT_MODEL: "draft model"} if method.needs_draft else {}
    for field, option in drafter_fields(method.drafter):
        if option.zoo is not None:  # a file option: the drafter reads trained weights or a table from it
            needs[field.name] = option.what or field.name
    return needs


def is_lossless(name: str) -> bool:
    """Whether the method's rule promises the target's own output: what its declaration says, which must be what its
    verifier at its declared defaults says."""
    method = registered_methods()[name]
    rule = build_verifier(method.verifier, SamplingParams(), MethodOptions()).lossless
    assert method.lossless == rule, f"method {name!r} is declared lossless={method.lossless}, its verifier says {rule}"
    return method.lossless


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "lossy: a method whose rule does not promise the target's output; the suite "
        "checks what it does promise (valid, bounded, stops at EOS, seeded)",
    )


@pytest.fixture(scope="session")
def subjects(tmp_path_factory):
    """subjects(backend, arch): built on first use and kept for the session, with the pieces and pipelines they
    built (subjects.py)."""
    from .subjects import HFSubject, LlamaCppSubject, Subject

    made: dict[tuple[str, str], Subject] = {}

    def get(backend: str, arch: str) -> Subject:
        if (backend, arch) not in made:
            folder = tmp_path_factory.mktemp(f"{backend}-{arch}")
            made[backend, arch] = HFSubject(arch, folder) if backend == "hf" else LlamaCppSubject(folder)
        return made[backend, arch]

    return get
