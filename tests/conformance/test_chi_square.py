"""Sampling through the loop is distributed as the target, past the first position: the joint distribution of
the first two new tokens from thousands of seeded rows of one batch (the `model` method with a draft model unlike
the target, speculative sampling without coupling, two tokens drafted per step) against the target's exact joint
p(x1) p(x2 | x1), by chi-square at the 0.001 level.

The same run with a deliberately wrong rule fails the same test, so the test can catch one: resampling from p
instead of the residual norm(max(0, p - q)) after a rejection, and judging only the first draft token (which
leaves the first token's distribution right, so only a test past the first position sees it)."""

from __future__ import annotations

import pytest
import torch

from conftest import build_model, chi2_critical, chi2_statistic
from draftverify import generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.methods import (
    MethodOptions,
    build_drafter,
    build_verifier,
    resolve_method,
)
from draftverify.sampling import probs_from_logits, residual, sample
from draftverify.types import Draft, SamplingParams, Verdict
from draftverify.verifiers.base import (
    Verifier,
    accepted_prefix_length,
    gather_at,
    make_verdict,
    within_draft,
)

VOCAB = 10  # 100 cells in the joint of two tokens
ROWS = 3000
PROMPT = [5, 7, 2, 9, 5, 7]
PARAMS = SamplingParams(temperature=1.0, seed=3, coupling=False)  # seeded speculative sampling


class WrongRule(Verifier):
    """Speculative sampling with one mistake: "resample_from_p" draws the token after a rejection from p;
    "first_only" judges the first draft token and keeps the rest of the draft whenever it keeps that one."""

    supports_batch = True

    def __init__(self, mistake: str):
        self.mistake = mistake

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        x = draft.tokens  # [B, N]
        p = probs_from_logits(target_logits, params)  # [B, N+1, V]
        q = draft.q_probs.float()  # [B, N, V]
        p_x = p[:, : x.shape[1]].gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        q_x = q.gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        accept = torch.rand(x.shape, generator=generator) * q_x < p_x  # [B, N]
        if self.mistake == "first_only":
            accept[:, 1:] = True
        n = accepted_prefix_length(within_draft(draft, accept))  # [B]
        if self.mistake == "resample_from_p":
            return make_verdict(x, n, sample(gather_at(p, n), generator))
        q_padded = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)  # [B, N+1, V]: the bonus token draws from p
        return make_verdict(x, n, sample(residual(gather_at(p, n), gather_at(q_padded, n)), generator))


def models():
    """One-layer float32 models (a distribution test needs no float64): thousands of rows stay fast."""
    target = build_model("llama", layers=1, seed=0, vocab=VOCAB).float()
    draft = build_model("llama", layers=1, seed=5, vocab=VOCAB, scale=2.0).float()  # another, peakier: q far from p
    return target, draft


@torch.no_grad()
def exact_joint(target) -> torch.Tensor:
    """p(x1, x2) [V, V] from the target's own probabilities."""
    first = probs_from_logits(target(torch.tensor([PROMPT])).logits[0, -1], PARAMS)  # [V]
    contexts = torch.cat([torch.tensor([PROMPT]).expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)  # [V, L+1]
    second = probs_from_logits(target(contexts).logits[:, -1], PARAMS)  # [V, V]
    return (first[:, None] * second).double()


def joint_counts(target, draft, verifier: Verifier | None = None) -> torch.Tensor:
    """Counts [V, V] of (x1, x2) over ROWS rows, decoded by the `model` method (or its drafter and `verifier`)."""
    method = resolve_method("model")
    options = MethodOptions(draft_model=draft)
    drafter = build_drafter(method.drafter, CachedLM(target), options)
    verifier = verifier or build_verifier(method.verifier, PARAMS, options)
    out = generate(target, drafter, verifier, torch.tensor([PROMPT] * ROWS), PARAMS, max_new_tokens=2, gamma=2)
    tokens = out.new_tokens  # [ROWS, 2]
    assert tokens.shape == (ROWS, 2) and out.stats.accepted_tokens > 0 and out.stats.rejections > 0
    return torch.bincount(tokens[:, 0] * VOCAB + tokens[:, 1], minlength=VOCAB * VOCAB).double().view(VOCAB, VOCAB)


def passes(counts: torch.Tensor, p: torch.Tensor) -> bool:
    return chi2_statistic(counts.flatten(), p.flatten()) < chi2_critical(counts.flatten(), p.flatten())


@pytest.fixture(scope="module")
def pair():
    target, draft = models()
    return target, draft, exact_joint(target)


def test_the_first_two_tokens_are_distributed_as_the_target(pair):
    target, draft, p = pair
    assert passes(joint_counts(target, draft), p)


@pytest.mark.parametrize("mistake", ["resample_from_p", "first_only"])
def test_a_wrong_rule_fails_the_same_test(pair, mistake):
    target, draft, p = pair
    counts = joint_counts(target, draft, WrongRule(mistake))
    assert not passes(counts, p)
    if mistake == "first_only":  # right at the first position: only the second token shows the mistake
        assert passes(counts.sum(dim=1), p.sum(dim=1))
