"""generate(): the one decoding loop. propose -> score (one target forward) -> verify -> commit.

A draft is a chain or a token tree; the loop treats both alike: the verify pass scores the pending token, the
draft tokens and any extra positions the drafter asks for, with the tree's ancestor mask and depth positions when
there is a tree, and the target's cache keeps the verdict's path. Nothing here depends on the method.
"""
from __future__ import annotations

import os
from time import perf_counter
from typing import Callable

import torch
from transformers import PreTrainedModel

from .cached_lm import CachedLM
from .draft_length import DraftLength, make_draft_length
from .drafters.base import Drafter
from .errors import DraftVerifyError
from .types import (DecodingState, Draft, GenerationOutput, GenerationStats, SamplingParams, TargetOutput, Verdict,
                    VerifyExtras)
from .verifiers.base import Verifier

TokenCallback = Callable[[torch.Tensor], None]  # receives each step's emitted tokens [B, k]


def _check_input(input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise DraftVerifyError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise DraftVerifyError(f"input_ids must be integer token ids of shape [batch, length], got {tuple(input_ids.shape)} {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise DraftVerifyError("the prompt is empty: give at least one token (e.g. the tokenizer's BOS token)")
    if input_ids.shape[0] != 1:
        raise DraftVerifyError(
            f"batch size {input_ids.shape[0]} is not supported yet: draft-then-verify runs one sequence at a time; "
            "call generate once per prompt"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DraftVerifyError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    return input_ids.long()


def _clock(device: torch.device, synchronise: bool) -> Callable[[], float]:
    """perf_counter, after waiting for queued GPU work when the caller reads the times (gamma auto): without the
    wait, CUDA's asynchronous launches would charge the target's forward to whatever syncs next."""
    if synchronise and device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return perf_counter()

        return now
    return perf_counter


def _verify_layout(target: CachedLM, draft: Draft, extras: VerifyExtras | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Position ids [1, 1+N+E] and attention mask [1+N+E, 1+N+E] of the verify pass, or (None, None) for a plain
    chain (causal order). The pending token and the draft never see the extra positions; each extra sees and sits
    where the drafter says."""
    if draft.tree is None and extras is None:
        return None, None
    width = 1 + draft.length + (0 if extras is None else extras.count)
    mask = torch.zeros(width, width, dtype=torch.bool)
    if draft.tree is None:
        mask[: 1 + draft.length, : 1 + draft.length] = torch.ones(1 + draft.length, 1 + draft.length, dtype=torch.bool).tril()
        offsets = torch.arange(1 + draft.length)
    else:
        mask[: 1 + draft.length, : 1 + draft.length] = draft.tree.verify_mask()
        offsets = draft.tree.verify_positions()
    if extras is not None:
        mask[1 + draft.length :] = extras.mask
        offsets = torch.cat([offsets, extras.positions.cpu()])
    return target.length + offsets[None], mask


def _kept_positions(draft: Draft, verdict: Verdict, n: int) -> int | torch.Tensor:
    """What the target's cache keeps of this step's verify pass: the pending token and the accepted draft
    tokens. A chain keeps a prefix (count); a tree keeps its accepted branch (offsets [B, 1+n])."""
    if draft.tree is None:
        return 1 + n
    return torch.cat([verdict.path.new_zeros((verdict.path.shape[0], 1)), 1 + verdict.path[:, :n]], dim=1)


def _scored_for_drafter(out: TargetOutput, kept: int | torch.Tensor, draft: Draft) -> TargetOutput:
    """The verify pass's outputs at the kept positions, then at the drafter's extra positions."""
    batch = out.logits.shape[0]
    if isinstance(kept, int):
        kept = torch.arange(kept, device=out.logits.device).expand(batch, kept)
    extra = torch.arange(1 + draft.length, out.logits.shape[1], device=out.logits.device).expand(batch, -1)
    index = torch.cat([kept.to(out.logits.device), extra], dim=1)  # [B, k + E]
    pick = lambda x: None if x is None else x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))  # noqa: E731
    return TargetOutput(logits=pick(out.logits), hidden=pick(out.hidden))


def _first_stop(emitted: torch.Tensor, eos_ids: torch.Tensor | None) -> int | None:
    """Index of the first EOS in emitted [1, k], or None."""
    if eos_ids is None:
        return None
    hits = torch.isin(emitted[0], eos_ids).nonzero()
    return int(hits[0, 0]) if hits.numel() else None


@torch.inference_mode()
def generate(
    target: CachedLM | PreTrainedModel,
    drafter: Drafter,
    verifier: Verifier,
    input_ids: torch.Tensor,
    params: SamplingParams | None = None,
    *,
    max_new_tokens: int = 64,
    gamma: int | str | DraftLength = 5,
    eos_token_id: int | list[int] | None = None,
    on_tokens: TokenCallback | None = None,
) -> GenerationOutput:
    """Decode up to max_new_tokens after input_ids [B, L] (the source, for encoder-decoder targets).

    Output equals the target's own greedy decoding (greedy verifier) or is distributed as the target's samples
    (speculative_sampling, l = 1) whatever the drafter proposes; other verifiers trade that for speed.
    """
    started = perf_counter()
    params = params or SamplingParams()
    target = target if isinstance(target, CachedLM) else CachedLM(target, role="target")
    input_ids = _check_input(input_ids, max_new_tokens).to(target.device)
    length_policy = gamma if isinstance(gamma, DraftLength) else make_draft_length(gamma)
    verifier.check_params(params)
    decoder_start = 1 if target.is_encoder_decoder else input_ids.shape[1]
    target.check_fits(decoder_start + max_new_tokens)
    drafter.bind(target, decoder_start + max_new_tokens)
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    eos_ids = torch.tensor(eos_token_id, device=input_ids.device) if eos_token_id else None
    generator = None
    if not params.greedy:  # our own generator: the process-global RNG is never reseeded
        generator = torch.Generator(device=input_ids.device)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        generator.manual_seed(seed)
    if drafter.drafts_in_target_pass:
        length_policy.drafting_folded()
    now = _clock(target.device, length_policy.reads_timers)

    stats = GenerationStats(prompt_tokens=input_ids.shape[1])
    committed = target.start(input_ids, want_hidden=drafter.needs_target_hidden)  # [B, L0]; all but the last cached
    state = DecodingState(
        tokens=committed,
        source_ids=input_ids if target.is_encoder_decoder else None,
        prompt_length=committed.shape[1],
        params=params,
        generator=generator,
    )
    drafter.start(state, target.prefilled if drafter.needs_target_hidden else None)
    drafter_calls_before = drafter.forward_calls
    stats.time_prefill = perf_counter() - started
    callback_seconds = 0.0  # the caller's streaming time is not the loop's: excluded from time_total

    while stats.new_tokens < max_new_tokens:
        remaining = max_new_tokens - stats.new_tokens
        # drafting up to `remaining` (not remaining - 1) lets a drafter the target never overrules (BiLD with
        # alpha_FB = 0, huge alpha_RB) write the whole text; the surplus target token is then cut below
        step_gamma = min(length_policy.next(), remaining)
        t0 = now()
        draft = drafter.propose(state, step_gamma)  # step_gamma >= 1: remaining >= 1 and policies give >= 1
        if draft.tree is not None and not verifier.accepts_trees:
            raise DraftVerifyError(f"the {verifier.name} verifier checks chains only; this drafter proposed a tree")
        draft.position = state.tokens.shape[1]  # keys position-coupled sampling noise
        extras = drafter.verify_inputs(draft)  # E embedded positions after the draft, or None
        t1 = now()
        pending = state.tokens[:, target.length :]  # [B, 1]
        scored = torch.cat([pending, draft.tokens], dim=1)  # [B, 1+N]
        position_ids, mask = _verify_layout(target, draft, extras)
        out = target.forward(scored, position_ids, mask, want_hidden=drafter.needs_target_hidden,
                             extra_embeds=None if extras is None else extras.embeds,
                             prefix=None if extras is None else extras.prefix)  # [B, 1+N+E, ...]
        t2 = now()
        verdict = verifier.verify(draft, out.logits[:, : 1 + draft.length], params, generator)
        n = int(verdict.num_accepted[0])  # the step's one host sync
        t3 = now()

        emitted = verdict.tokens[:, : n + 1]  # [B, n+1]
        stop_at = _first_stop(emitted, eos_ids)
        if stop_at is not None:
            emitted = emitted[:, : stop_at + 1]
        emitted = emitted[:, :remaining]
        kept = _kept_positions(draft, verdict, n)
        target.commit(kept)  # the pending token and the accepted drafts; emitted[-1] is pending now
        state.tokens = torch.cat([state.tokens, emitted], dim=1)
        drafter.commit(state, verdict, _scored_for_drafter(out, kept, draft) if drafter.needs_target_hidden else None)

        rejected = n < draft.depth
        stats.target_calls += 1
        stats.new_tokens += emitted.shape[1]
        stats.drafted_tokens += draft.length
        stats.accepted_tokens += min(n, emitted.shape[1])
        stats.rejections += int(rejected)
        stats.gammas.append(draft.length)
        stats.time_draft += t1 - t0
        stats.time_target += t2 - t1
        stats.time_verify += t3 - t2
        length_policy.update(draft.length, n, rejected, t1 - t0, t2 - t1)
        if on_tokens is not None:
            t4 = perf_counter()
            on_tokens(emitted)
            callback_seconds += perf_counter() - t4
        if stop_at is not None:
            break

    stats.draft_calls = drafter.forward_calls - drafter_calls_before
    stats.time_total = perf_counter() - started - callback_seconds
    new = state.tokens[:, state.prompt_length :]
    return GenerationOutput(sequences=state.tokens, new_tokens=new, stats=stats)
