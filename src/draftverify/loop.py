"""generate(): the one decoding loop. propose -> score (one target forward) -> verify -> commit."""
from __future__ import annotations

from time import perf_counter
from typing import Callable

import torch
from transformers import PreTrainedModel

from .cached_lm import CachedLM
from .draft_length import DraftLength, make_draft_length
from .drafters.base import Drafter
from .errors import DraftVerifyError
from .types import DecodingState, GenerationOutput, GenerationStats, SamplingParams
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
    if not params.greedy:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())

    stats = GenerationStats(prompt_tokens=input_ids.shape[1])
    committed = target.start(input_ids)  # [B, L0]; all but the last token are cached
    state = DecodingState(
        tokens=committed,
        source_ids=input_ids if target.is_encoder_decoder else None,
        prompt_length=committed.shape[1],
        params=params,
        generator=generator,
    )
    drafter.start(state)
    drafter_calls_before = drafter.forward_calls
    stats.time_prefill = perf_counter() - started
    callback_seconds = 0.0  # the caller's streaming time is not the loop's: excluded from time_total

    while stats.new_tokens < max_new_tokens:
        remaining = max_new_tokens - stats.new_tokens
        # drafting up to `remaining` (not remaining - 1) lets a drafter the target never overrules (BiLD with
        # alpha_FB = 0, huge alpha_RB) write the whole text; the surplus target token is then cut below
        step_gamma = min(length_policy.next(), remaining)
        t0 = perf_counter()
        draft = drafter.propose(state, step_gamma)  # step_gamma >= 1: remaining >= 1 and policies give >= 1
        draft.position = state.tokens.shape[1]  # keys position-coupled sampling noise
        t1 = perf_counter()
        cached = target.cached_length
        scored = torch.cat([state.tokens[:, cached:], draft.tokens], dim=1)  # [B, 1+N]: pending token + draft
        logits = target.forward(scored)  # [B, 1+N, V]
        t2 = perf_counter()
        verdict = verifier.verify(draft, logits, params, generator)
        n = int(verdict.num_accepted[0])  # the step's one host sync
        t3 = perf_counter()

        emitted = verdict.tokens[:, : n + 1]  # [B, n+1]
        stop_at = _first_stop(emitted, eos_ids)
        if stop_at is not None:
            emitted = emitted[:, : stop_at + 1]
        emitted = emitted[:, :remaining]
        target.crop(cached + 1 + n)  # keep the pending token and the accepted drafts; emitted[-1] is pending now
        state.tokens = torch.cat([state.tokens, emitted], dim=1)
        drafter.commit(state, verdict)

        rejected = n < draft.length
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
