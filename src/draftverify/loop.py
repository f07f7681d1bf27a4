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
from torch import nn

from .backends.base import LMBackend, defers_prefill
from .backends.registry import as_backend
from .draft_length import DEFAULT_GAMMA, DraftLength, make_draft_length
from .drafters.base import Drafter, add_drafter_times, empty_draft
from .errors import DraftVerifyError
from .sampling import RowParams, params_rows, row_params
from .threads import one_torch_thread_unless_models_use_it
from .types import (DecodingState, Draft, GenerationOutput, GenerationStats, SamplingParams, TargetOutput, Verdict,
                    VerifyExtras)
from .verifiers.base import Verifier

TokenCallback = Callable[[torch.Tensor], None]  # receives each step's emitted tokens [B, k]


def _check_input(input_ids: torch.Tensor, max_new_tokens: int | list[int]) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise DraftVerifyError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise DraftVerifyError(f"input_ids must be integer token ids of shape [batch, length], got {tuple(input_ids.shape)} {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise DraftVerifyError("the prompt is empty: give at least one token (e.g. the tokenizer's BOS token)")
    if input_ids.shape[0] == 0:
        raise DraftVerifyError("the batch is empty: give at least one row of input_ids")
    limits = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens]
    if isinstance(max_new_tokens, (list, tuple)) and len(limits) != input_ids.shape[0]:
        raise DraftVerifyError(f"max_new_tokens has {len(limits)} entries for {input_ids.shape[0]} rows")
    for limit in limits:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise DraftVerifyError(f"max_new_tokens must be an integer >= 1, got {limit!r}")
    return input_ids.long()


def _check_batch_support(drafter: Drafter, verifier: Verifier, params: SamplingParams) -> None:
    if not drafter.supports_batch:
        from .registry import DRAFTERS

        batched = sorted(name for name, cls in DRAFTERS.items() if cls.supports_batch)
        raise DraftVerifyError(
            f"the {drafter.name!r} drafter runs one row at a time; batches of several rows support the drafters "
            f"{', '.join(batched)} (method autoregressive: none)"
        )
    if not verifier.supports_batch:
        raise DraftVerifyError(
            f"the {verifier.name} verifier checks one row at a time; batches of several rows support greedy, "
            "speculative_sampling and gumbel_coupling (the 'exact' rule of every lossless chain method)"
        )


def _clock(device: torch.device, synchronise: bool) -> Callable[[], float]:
    """perf_counter, after waiting for queued GPU work when the caller reads the times (gamma auto): without the
    wait, CUDA's asynchronous launches would charge the target's forward to whatever syncs next."""
    if synchronise and device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return perf_counter()

        return now
    return perf_counter


def _verify_layout(target: LMBackend, draft: Draft, extras: VerifyExtras | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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


def _kept_positions(draft: Draft, verdict: Verdict) -> torch.Tensor:
    """What the target's cache keeps of this step's verify pass: each row's pending token and accepted draft
    tokens. A chain keeps a prefix: counts [B]; a tree keeps its accepted branch: tail offsets [B, 1+n], -1 past a
    row's own branch."""
    if draft.tree is None:
        return verdict.num_accepted + 1
    n = int(verdict.num_accepted.max())
    path = verdict.path[:, :n]  # [B, n] -1 where a row accepted fewer
    return torch.cat([path.new_zeros((path.shape[0], 1)), torch.where(path >= 0, 1 + path, -1)], dim=1)


def _scored_for_drafter(out: TargetOutput, kept: torch.Tensor, draft: Draft) -> TargetOutput:
    """The verify pass's outputs at each row's kept positions, right-aligned (column -1 is every row's last kept
    position; a row that kept fewer repeats its first kept one on the left), then at the drafter's extra
    positions. kept: a chain's counts [B], or a tree's tail offsets [B, k] (-1 padded)."""
    batch = out.logits.shape[0]
    device = out.logits.device
    kept = kept.to(device)
    if kept.dim() == 1:  # counts -> offsets 0..count-1
        width = int(kept.max())
        kept = torch.where(torch.arange(width, device=device)[None] < kept[:, None],
                           torch.arange(width, device=device)[None], -1)
    count = (kept >= 0).sum(dim=1, keepdim=True)  # [B, 1]
    shift = kept.shape[1] - count  # right-align: column j takes the row's kept entry j - shift
    source = (torch.arange(kept.shape[1], device=device)[None] - shift).clamp_min(0)
    aligned = kept.gather(1, source)  # [B, k]
    extra = torch.arange(1 + draft.length, out.logits.shape[1], device=device).expand(batch, -1)
    index = torch.cat([aligned, extra], dim=1)  # [B, k + E]
    pick = lambda x: None if x is None else x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))  # noqa: E731
    return TargetOutput(logits=pick(out.logits), hidden=pick(out.hidden))


@one_torch_thread_unless_models_use_it
@torch.inference_mode()
def generate(
    target: LMBackend | nn.Module,
    drafter: Drafter,
    verifier: Verifier,
    input_ids: torch.Tensor,
    params: SamplingParams | RowParams | list[SamplingParams] | None = None,
    *,
    max_new_tokens: int | list[int] = 64,
    gamma: int | str | DraftLength = DEFAULT_GAMMA,
    eos_token_id: int | list[int] | None = None,
    on_tokens: TokenCallback | None = None,
    attention_mask: torch.Tensor | None = None,
    seeds: list[int | None] | None = None,
    admit: Callable[[], list[tuple]] | None = None,
    first_token_allowed: torch.Tensor | list | None = None,
) -> GenerationOutput:
    """Decode up to max_new_tokens after input_ids [B, L] (the source, for encoder-decoder targets).

    Output equals the target's own greedy decoding (greedy verifier) or is distributed as the target's samples
    (speculative_sampling, l = 1) whatever the drafter proposes; other verifiers trade that for speed.

    Rows are the unit: one row is a batch of one, and every step's bookkeeping (commit, stopping, statistics) is
    per row. Rows of different lengths are left-padded, with attention_mask [B, L] False at the padding. Each row
    keeps its own number of accepted draft tokens, stops at its own EOS or max_new_tokens (an int, or one per row)
    and then leaves the batch; each row's output equals its own batch-1 output (greedy, and coupled sampling with
    seeds, one per row). on_tokens receives [B, k] with -1 where a row emitted fewer tokens (or has left) and may
    return the rows (indices into the batch) to stop now. Several rows need a backend that decodes rows
    (supports_rows) and a drafter that drafts for rows (supports_batch).

    params: one SamplingParams for every row, or one per row (a list, or sampling.RowParams): each row is then
    drafted and judged by its own temperature / top-k / top-p and keyed by its own seed (the verifier must judge
    per-row settings: the `exact` rule of the lossless methods does).

    admit (continuous batching; makes the run a batch even with one row): called between steps while rows are
    still decoding, returns new rows to join the batch as (prompt token ids, max_new_tokens, seed) or (prompt token
    ids, max_new_tokens, seed, first_token_allowed of that row[, SamplingParams of that row]); they take the next
    indices (in the order they joined) in on_tokens and in the output.

    first_token_allowed (token healing, healing.py): the tokens each row's FIRST new token may be, as token ids
    [K] for every row, or a list with one entry per row (ids, or None for a row without constraint). The target's
    logits for that token are set to -inf outside the set before the verifier sees them, whatever the method: the
    output is then the target's own decoding under that constraint (greedy: the best allowed token; sampling: the
    target's distribution renormalised over the set, then the usual temperature / top-k / top-p). Only the
    first token is constrained; drafts are unconstrained (a draft token outside the set is simply rejected).
    """
    started = perf_counter()
    params = row_params(params if params is not None else SamplingParams())
    target = as_backend(target, "target")  # any backend (backends/base.py); a plain HF model gets a CachedLM
    input_ids = _check_input(input_ids, max_new_tokens).to(target.device)
    batch = input_ids.shape[0]
    if admit is not None and attention_mask is None:  # rows will join: the target's cache takes the rows layout now
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * batch
    length_policy = gamma if isinstance(gamma, DraftLength) else make_draft_length(gamma)
    if isinstance(params, RowParams) and len(params) != batch:
        raise DraftVerifyError(f"params has {len(params)} entries for {batch} rows")
    _check_row_params(verifier, params)
    if batch > 1 or attention_mask is not None:
        if not target.supports_rows:
            raise DraftVerifyError(f"the {target.name} backend decodes one row at a time; batches of several rows "
                                   "run on --backend hf (backend='hf')")
        _check_batch_support(drafter, verifier, params)
    if seeds is not None and len(seeds) != batch:
        raise DraftVerifyError(f"seeds has {len(seeds)} entries for {batch} rows")
    first_allowed = _allowed_rows(first_token_allowed, batch, target.vocab_size)
    decoder_start = 1 if target.is_encoder_decoder else input_ids.shape[1]
    target.check_fits(decoder_start + max(limits))
    drafter.bind(target, decoder_start + max(limits))
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    eos_set = set(eos_token_id or [])
    # our own generator: the process-global RNG is never reseeded; rows that join later may sample
    generator = None
    row_seeds = None
    if not params.greedy or admit is not None:
        generator = torch.Generator(device=input_ids.device)
        generator.manual_seed(_generator_seed(params, batch))
        # each row's coupled noise is keyed by its own seed (a fresh one where none is given)
        given = seeds if seeds is not None else [p.seed for p in params_rows(params, batch)]
        row_seeds = [s if s is not None else _fresh_seed() for s in given]
    if drafter.drafts_in_target_pass:
        length_policy.drafting_folded()
    now = _clock(target.device, length_policy.reads_timers)

    committed = target.start(input_ids, want_hidden=drafter.needs_target_hidden, attention_mask=attention_mask)
    carries_prefill = defers_prefill(target)  # the first step's forward decodes the prompt too
    real = attention_mask.to(input_ids.device).long() if attention_mask is not None else None  # [B, L] or None
    if target.is_encoder_decoder or real is None:
        lengths = torch.full((batch,), committed.shape[1], dtype=torch.long, device=input_ids.device)
    else:
        lengths = real.sum(dim=1)
    stats = GenerationStats(prompt_tokens=input_ids.numel() if real is None else int(real.sum()))
    state = DecodingState(
        tokens=committed,
        source_ids=input_ids if target.is_encoder_decoder else None,
        prompt_length=committed.shape[1],
        params=params,
        generator=generator,
        lengths=lengths,
        seeds=row_seeds,
        draft_confidence=length_policy.confidence,
        costs=length_policy.sizing_costs,
    )
    drafter.start(state, target.prefilled if drafter.needs_target_hidden else None)
    drafter_calls_before = drafter.forward_calls
    drafter_timers_before = drafter.timers()  # a drafter's own timers (re-tokenizing), added to stats at the end
    stats.time_prefill = perf_counter() - started
    callback_seconds = 0.0  # the caller's streaming time is not the loop's: excluded from time_total
    rows = _Rows(batch, limits, [state.row(b).tolist() for b in range(batch)])

    while rows.active:
        remaining = rows.most_remaining()
        # drafting up to `remaining` (not remaining - 1) lets a drafter the target never overrules (BiLD with
        # alpha_FB = 0, huge alpha_RB) write the whole text; the surplus target token is then cut below
        step_rows = state.tokens.shape[0]  # the target scores step_rows x (1 + draft length) tokens
        step_gamma = min(length_policy.next(step_rows), remaining)
        t0 = now()
        # step_gamma 0 (gamma auto, when no draft pays): a plain decoding step; the drafter only hears the commit
        draft = drafter.propose(state, step_gamma) if step_gamma else empty_draft(state)
        if draft.tree is not None and not verifier.accepts_trees:
            raise DraftVerifyError(f"the {verifier.name} verifier checks chains only; this drafter proposed a tree")
        draft.position = state.next_position()  # [B] keys position-coupled sampling noise
        draft.seeds = state.seeds
        extras = drafter.verify_inputs(draft)  # E embedded positions after the draft, or None
        t1 = now()
        pending = state.tokens[:, -1:]  # [B, 1] the one committed token the target's cache does not hold yet
        scored = torch.cat([pending, draft.tokens], dim=1)  # [B, 1+N]
        position_ids, mask = _verify_layout(target, draft, extras)
        out = target.forward(scored, position_ids, mask, want_hidden=drafter.needs_target_hidden,
                             extra_embeds=None if extras is None else extras.embeds,
                             prefix=None if extras is None else extras.prefix)  # [B, 1+N+E, ...]
        t2 = now()
        logits = out.logits[:, : 1 + draft.length]  # [B, 1+N, V]
        if first_allowed is not None:  # some rows take their first new token now: constrain it
            logits = _constrain_first(logits, first_allowed)
            first_allowed = None
        verdict = verifier.verify(draft, logits, state.params, generator)
        accepted = verdict.num_accepted.tolist()  # the step's one host sync
        t3 = now()
        emitted_rows = rows.emitted(verdict.tokens.tolist(), accepted, eos_set)
        kept = _kept_positions(draft, verdict)
        if draft.tree is None:
            target.commit_rows(kept)  # each row: its pending token and accepted drafts; its last emitted is pending now
        else:
            target.commit(kept)
        state.tokens, state.lengths = _append_rows(state.tokens, state.lengths, emitted_rows)
        drafter.commit(state, verdict, _scored_for_drafter(out, kept, draft) if drafter.needs_target_hidden else None)
        row_lengths = draft.row_depths(len(accepted))
        rejected = sum(a < length for a, length in zip(accepted, row_lengths))
        stats.new_tokens += sum(len(r) for r in emitted_rows)
        stats.drafted_tokens += (sum(row_lengths) if draft.lengths is not None else int(draft.valid.sum())
                                 if draft.valid is not None else draft.length * len(accepted))
        stats.accepted_tokens += sum(min(a, len(r)) for a, r in zip(accepted, emitted_rows))
        stats.rejections += rejected
        stats.target_calls += 1
        stats.gammas.append(draft.length)
        stats.chosen_gammas.append(step_gamma)
        stats.time_verify += t3 - t2
        if carries_prefill:  # this step also decoded the prompt (the target's and a draft's): the prefill's time
            carries_prefill = False
            stats.prefill_steps += 1
            stats.prefill_draft_calls += drafter.forward_calls - drafter_calls_before
            stats.time_prefill += t2 - t0
            length_policy.update(draft.length, sum(accepted), rejected, None, None, step_rows)  # untimed
        else:
            stats.time_draft += t1 - t0
            stats.time_target += t2 - t1
            length_policy.update(draft.length, sum(accepted), rejected, t1 - t0, t2 - t1, step_rows)  # batch totals
        length_policy.update_rows(row_lengths, accepted)
        stop_rows = None
        if on_tokens is not None:
            t4 = perf_counter()
            stop_rows = on_tokens(rows.padded(emitted_rows, input_ids.device))
            callback_seconds += perf_counter() - t4
        leaving = rows.finish(stop_rows)
        if leaving is not None and rows.active:
            target.drop_rows(leaving)
            drafter.drop_rows(leaving)
            keep = leaving.to(state.tokens.device)
            state.tokens, state.lengths = _trim_rows(state.tokens[keep], state.lengths[keep])
            if state.seeds is not None:
                state.seeds = [s for s, k in zip(state.seeds, leaving.tolist()) if k]
            if isinstance(state.params, RowParams):
                state.params = row_params([p for p, k in zip(state.params.rows, leaving.tolist()) if k])
        if admit is not None and rows.active:
            joining = admit()
            if joining:
                t5 = perf_counter()
                joined = [_allowed_row(row[3] if len(row) > 3 else None, target.vocab_size) for row in joining]
                _join(target, drafter, state, rows, joining, stats)
                _check_row_params(verifier, state.params)
                stats.time_prefill += perf_counter() - t5
                if any(a is not None for a in joined):  # the joined rows take their first token next step
                    first_allowed = [None] * (state.tokens.shape[0] - len(joined)) + joined

    stats.draft_calls = drafter.forward_calls - drafter_calls_before
    add_drafter_times(stats, drafter, drafter_timers_before)
    stats.time_total = perf_counter() - started - callback_seconds
    return rows.output(input_ids, stats)


def _check_row_params(verifier: Verifier, params: SamplingParams | RowParams) -> None:
    if isinstance(params, RowParams) and not verifier.per_row_params:
        raise DraftVerifyError(f"the {verifier.name} verifier takes one sampling setting for the whole batch; rows "
                               "with different temperature / top-k / top-p need a lossless method (its 'exact' rule)")
    verifier.check_params(params)


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def _generator_seed(params: SamplingParams | RowParams, batch: int) -> int:
    """The shared generator's seed (uncoupled sampling draws from it): the given seed; with per-row settings the
    first sampled row's seed when every sampled row has one, so a fully seeded batch is reproducible; else fresh."""
    if isinstance(params, SamplingParams):
        return params.seed if params.seed is not None else _fresh_seed()
    sampled = [p.seed for p in params_rows(params, batch) if not p.greedy]
    return sampled[0] if sampled and all(s is not None for s in sampled) else _fresh_seed()


def _allowed_row(allowed, vocab_size: int) -> torch.Tensor | None:
    """One row's first-token set as ids [K] (validated), or None."""
    if allowed is None:
        return None
    ids = torch.as_tensor(allowed).reshape(-1).long()
    if ids.numel() == 0:
        raise DraftVerifyError("first_token_allowed: a row's set of allowed first tokens is empty")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftVerifyError(f"first_token_allowed: token ids must be in [0, {vocab_size}), got "
                               f"{int(ids.min())}..{int(ids.max())}")
    return ids


def _allowed_rows(allowed, batch: int, vocab_size: int) -> list[torch.Tensor | None] | None:
    """first_token_allowed -> one entry per row (None: unconstrained), or None when no row is constrained."""
    if allowed is None:
        return None
    if isinstance(allowed, torch.Tensor):
        rows = [_allowed_row(allowed, vocab_size)] * batch
    else:
        rows = list(allowed)
        if len(rows) != batch:
            raise DraftVerifyError(f"first_token_allowed has {len(rows)} entries for {batch} rows")
        rows = [_allowed_row(a, vocab_size) for a in rows]
    return rows if any(a is not None for a in rows) else None


def _constrain_first(logits: torch.Tensor, allowed: list[torch.Tensor | None]) -> torch.Tensor:
    """logits [B, 1+N, V] with position 0 (the next token) at -inf outside each constrained row's allowed set."""
    keep = torch.ones(logits.shape[0], logits.shape[-1], dtype=torch.bool, device=logits.device)  # [B, V]
    for b, ids in enumerate(allowed):
        if ids is not None:
            keep[b] = False
            keep[b, ids.to(logits.device)] = True
    logits = logits.clone()
    logits[:, 0] = logits[:, 0].masked_fill(~keep, float("-inf"))
    return logits


def _join(target: LMBackend, drafter: Drafter, state: DecodingState, rows: "_Rows",
          joining: list[tuple], stats: GenerationStats) -> None:
    """Continuous batching: prefill the joining rows and append them to the batch (target, drafter and state);
    a row without its own SamplingParams takes the batch's first row's."""
    prompts = [list(row[0]) for row in joining]
    limits = [row[1] for row in joining]
    for ids, limit in zip(prompts, limits):
        if not ids:
            raise DraftVerifyError("a joining row needs at least one prompt token")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise DraftVerifyError(f"max_new_tokens must be an integer >= 1, got {limit!r}")
        target.check_fits(len(ids) + limit)
        drafter.bind(target, len(ids) + limit)
    width = max(len(r) for r in prompts)
    device = state.tokens.device
    ids = torch.tensor([[0] * (width - len(r)) + r for r in prompts], device=device)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in prompts], device=device)
    target.join_rows(ids, mask)
    drafter.join_rows(ids, mask)
    total = max(width, state.tokens.shape[1])
    pad = lambda t: torch.cat([t.new_zeros((t.shape[0], total - t.shape[1])), t], dim=1)  # noqa: E731
    state.tokens = torch.cat([pad(state.tokens), pad(ids)])
    state.lengths = torch.cat([state.lengths, mask.long().sum(dim=1)])
    batch_rows = params_rows(state.params, state.tokens.shape[0] - len(joining))
    joined = [row[4] if len(row) > 4 and row[4] is not None else batch_rows[0] for row in joining]
    state.params = row_params(batch_rows + joined)
    if state.seeds is not None:
        state.seeds = state.seeds + [row[2] if row[2] is not None else _fresh_seed() for row in joining]
    stats.prompt_tokens += sum(len(r) for r in prompts)
    rows.add(prompts, limits)


class _Rows:
    """Bookkeeping of the rows (one row is a batch of one): which are still decoding, what each has emitted, when
    each ends."""

    def __init__(self, batch: int, limits: list[int], prompts: list[list[int]]):
        self.batch = batch
        self.limits = list(limits)
        self.prompts = prompts
        self.active = list(range(batch))  # original indices of the rows still in the batch, in batch order
        self.new: list[list[int]] = [[] for _ in range(batch)]
        self.ended: list[bool] = [False] * batch

    def add(self, prompts: list[list[int]], limits: list[int]) -> None:
        """Rows joining (continuous batching) take the next indices and the end of the batch."""
        self.active.extend(range(self.batch, self.batch + len(prompts)))
        self.batch += len(prompts)
        self.prompts.extend(prompts)
        self.limits.extend(limits)
        self.new.extend([] for _ in prompts)
        self.ended.extend(False for _ in prompts)

    def most_remaining(self) -> int:
        return max(self.limits[r] - len(self.new[r]) for r in self.active)

    def emitted(self, tokens: list[list[int]], accepted: list[int], eos: set[int]) -> list[list[int]]:
        """Each active row's emitted tokens this step: accepted drafts + the target's token, cut after the first
        EOS and at the row's max_new_tokens."""
        out = []
        for i, row in enumerate(self.active):
            toks = tokens[i][: accepted[i] + 1]
            for j, t in enumerate(toks):
                if t in eos:
                    toks = toks[: j + 1]
                    self.ended[row] = True
                    break
            toks = toks[: self.limits[row] - len(self.new[row])]
            self.new[row].extend(toks)
            if len(self.new[row]) >= self.limits[row]:
                self.ended[row] = True
            out.append(toks)
        return out

    def padded(self, emitted: list[list[int]], device) -> torch.Tensor:
        """[B_original, k] of this step's tokens, -1 where a row emitted fewer (or has left the batch)."""
        width = max((len(r) for r in emitted), default=0)
        grid = torch.full((self.batch, width), -1, dtype=torch.long)
        for i, row in enumerate(self.active):
            if emitted[i]:
                grid[row, : len(emitted[i])] = torch.tensor(emitted[i])
        return grid.to(device)

    def finish(self, stop_rows) -> torch.Tensor | None:
        """Mark rows the caller stopped; returns keep [B_active] (bool) when some rows leave, else None."""
        for row in stop_rows or ():
            self.ended[int(row)] = True
        keep = [not self.ended[row] for row in self.active]
        if all(keep):
            return None
        self.active = [row for row, k in zip(self.active, keep) if k]
        return torch.tensor(keep)

    def output(self, input_ids: torch.Tensor, stats) -> GenerationOutput:
        """new_tokens [B, max new] and sequences [B, max prompt + new] (each row's prompt and new tokens),
        right-padded with -1."""
        def grid(lists: list[list[int]]) -> torch.Tensor:
            out = torch.full((len(lists), max((len(r) for r in lists), default=0)), -1, dtype=torch.long)
            for b, r in enumerate(lists):
                if r:
                    out[b, : len(r)] = torch.tensor(r)
            return out.to(input_ids.device)

        return GenerationOutput(sequences=grid([p + n for p, n in zip(self.prompts, self.new)]),
                                new_tokens=grid(self.new), stats=stats, rows=[list(r) for r in self.new])


def _append_rows(tokens: torch.Tensor, lengths: torch.Tensor, emitted: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded tokens [B, T] plus each row's new tokens -> left-padded [B, T'] (every row ends in the last
    column again) and the new lengths."""
    counts = [len(r) for r in emitted]
    if len(set(counts)) == 1:  # every row emitted as many: plain concatenation keeps the alignment
        if counts[0] == 0:
            return tokens, lengths
        new = torch.tensor(emitted, dtype=tokens.dtype, device=tokens.device)
        return torch.cat([tokens, new], dim=1), lengths + counts[0]
    grow = max(counts)
    out = torch.cat([tokens.new_zeros((tokens.shape[0], grow)), tokens], dim=1)
    width = out.shape[1]
    for b, r in enumerate(emitted):
        if r:  # move the row left by what it emits, then write its tokens at the end
            out[b, : width - len(r)] = out[b, len(r) :].clone()
            out[b, width - len(r) :] = torch.tensor(r, dtype=tokens.dtype, device=tokens.device)
    new_lengths = lengths + torch.tensor(counts, device=lengths.device)
    return _trim_rows(out, new_lengths)


def _trim_rows(tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop leading columns that are padding in every row."""
    width = int(lengths.max())
    return tokens[:, tokens.shape[1] - width :], lengths
