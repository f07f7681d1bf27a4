"""torch's threads around a generation (threads.py): one thread when no model computes in torch (llama.cpp's
backend declares computes_in_torch = False), the caller's setting otherwise and after."""

from __future__ import annotations

import pytest
import torch

from draftverify import DraftVerifyError, generate
from draftverify.drafters.base import NoDrafter
from draftverify.drafters.prompt_lookup import PromptLookupDrafter
from draftverify.methods import MethodOptions, build_verifier
from draftverify.threads import torch_threads
from draftverify.types import SamplingParams
from test_backends import RecomputingLM


class ThreadsSeen(PromptLookupDrafter):
    """Prompt lookup that records torch's thread setting each time it proposes."""

    def __init__(self):
        super().__init__()
        self.seen: list[int] = []

    def propose(self, state, gamma):
        self.seen.append(torch.get_num_threads())
        return super().propose(state, gamma)


class ElsewhereLM(RecomputingLM):
    computes_in_torch = False  # as llama.cpp's backend: its forward runs on its own threads


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


@pytest.mark.parametrize("backend, during", [(ElsewhereLM, 1), (RecomputingLM, 2)])
def test_the_loop_runs_on_one_torch_thread_only_when_no_model_computes_in_torch(models, two_threads, backend, during):
    drafter = ThreadsSeen()
    prompt = torch.tensor([[5, 17, 42, 8, 5, 17, 42, 8, 5]])
    generate(
        backend(models("llama")),
        drafter,
        build_verifier("greedy", SamplingParams(), MethodOptions()),
        prompt,
        max_new_tokens=6,
        gamma=3,
    )
    assert drafter.seen and set(drafter.seen) == {during}
    assert torch.get_num_threads() == 2  # the caller's setting, restored


def test_a_drafter_with_a_torch_model_keeps_torch_threads(models):
    from draftverify.drafters.lookup_model import LookupModelDrafter
    from draftverify.drafters.model import ModelDrafter

    model = models("llama")
    assert ModelDrafter(model).computes_in_torch and LookupModelDrafter(model).computes_in_torch
    assert not ModelDrafter(ElsewhereLM(model)).computes_in_torch
    assert not LookupModelDrafter(ElsewhereLM(model)).computes_in_torch
    assert not NoDrafter().computes_in_torch and not PromptLookupDrafter().computes_in_torch


def test_threads_are_restored_when_generation_fails(models, two_threads):
    with pytest.raises(DraftVerifyError, match="max_new_tokens"):
        generate(
            ElsewhereLM(models("llama")),
            NoDrafter(),
            build_verifier("greedy", SamplingParams(), MethodOptions()),
            torch.tensor([[5, 17]]),
            max_new_tokens=-1,
        )
    assert torch.get_num_threads() == 2
