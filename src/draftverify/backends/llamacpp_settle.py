"""A greedy verdict on a token tree, settled against one-token decoding: the verifier wrapper the llama.cpp backend
puts around the loop's verifier (LlamaCppLM.wrap_verifier, read by backends/base.py wrap_verifier), so the step
keeps its four verbs and no other backend or verifier learns of it.

Why: llama.cpp's tree pass may round a node's logits otherwise than one-token decoding does (a node whose cell sits
past masked siblings moves cells between the SIMD lanes of the attention-times-V product: llamacpp_kernels.py).
Where a chain's rows do round as one-token decoding does (LlamaCppLM.chains_exact), a greedy verdict on a tree is
made exact by scoring its kept branch again as a chain (LlamaCppLM.rescore_branch): the verdict is cut where the
chain's argmax parts from the branch, and its next token is the chain's. The seconds of that second forward ride
on the verdict (Verdict.target_s), so the step's statistics count them as target time and a second target call.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import torch

from ..errors import DraftVerifyError
from ..sampling import argmax
from ..types import Draft, SamplingParams, Verdict
from ..verifiers.base import Verifier
from ..verifiers.tree import tree_verdict

# tail offsets of the kept branch (the pending token, then its nodes) -> None when the whole branch was scored as a
# chain already, else (m, the target's logits after kept[m], kept[m + 1], ... [1, len(kept) - m, V])
Rescore = Callable[[list[int]], tuple[int, torch.Tensor] | None]


class SettlingVerifier(Verifier):
    """`verifier` (a lossless rule that checks trees), whose greedy verdicts on trees are settled by `rescore`
    (LlamaCppLM.rescore_branch); chains, and trees at a temperature, keep the inner verdict as it is."""

    def __init__(self, verifier: Verifier, rescore: Rescore):
        self.verifier = verifier
        self.rescore = rescore
        # the loop and its checks read the rule's own flags and name
        self.name = verifier.name
        self.lossless = verifier.lossless
        self.accepts_trees = verifier.accepts_trees
        self.supports_batch = verifier.supports_batch
        self.per_row_params = verifier.per_row_params

    def check_params(self, params: SamplingParams) -> None:
        self.verifier.check_params(params)

    def verify(
        self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> Verdict:
        verdict = self.verifier.verify(draft, target_logits, params, generator)
        if draft.tree is None or not params.greedy:
            return verdict
        started = perf_counter()
        settled = settle(self.rescore, draft, verdict)
        if settled is None:
            return verdict
        settled.target_s = perf_counter() - started
        return settled


def settle(rescore: Rescore, draft: Draft, verdict: Verdict) -> Verdict | None:
    """A greedy verdict on a one-row tree draft, checked against the chain scores `rescore` gives for its kept
    branch: cut where the chain's argmax parts from the branch, with the chain's token next. None when `rescore`
    scored nothing again (the branch's logits already were a chain's)."""
    n = verdict.accepted[0]
    kept = [0, *(1 + node for node in verdict.path[0, :n].tolist())]  # tail offsets: the pending token, the branch
    rescored = rescore(kept)
    if rescored is None:
        return None
    m, logits = rescored  # the target's logits after kept[m], kept[m + 1], ... [1, len(kept) - m, V]
    if m < 1:
        raise DraftVerifyError("a re-scored branch must keep the pending token's own logits (they were processed)")
    if draft.process is not None:  # the rows' logits processors, at the verify positions these logits stand for
        logits = draft.process(logits, kept[m:])
    choice = argmax(logits[0]).tolist()  # [len(kept) - m]
    branch = verdict.path[0, :n]  # [n] node indices
    tokens = draft.tokens[0, branch].tolist()  # the node after kept[i] is tokens[i]
    accepted = m
    while accepted < n and choice[accepted - m] == tokens[accepted]:
        accepted += 1
    device = verdict.num_accepted.device
    return tree_verdict(
        draft.tokens,
        verdict.path,
        torch.tensor([accepted], device=device),
        torch.tensor([choice[accepted - m]], device=device),
    )
