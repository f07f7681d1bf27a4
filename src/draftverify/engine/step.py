"""One decoding step as four verbs, after one prefill: propose (the drafter's draft), score (one target forward over
the pending token and the draft), verify (the verifier's verdict on the target's logits), commit (the target's
cache, the state and the drafter keep the verdict's tokens).

A draft is a chain or a token tree; the verbs treat both alike: the verify pass scores the pending token and the
draft tokens, with the tree's ancestor mask and depth positions when there is a tree, and the target's cache keeps
the verdict's path. A method that changes the target's forward wraps the target (Drafter.wrap_target); the verify
pass's outputs past the scored positions then reach the drafter after the kept ones; a backend whose verdicts need
more than the rule reading its logits wraps the verifier (backends/base.py wrap_verifier: llama.cpp settles a
greedy tree verdict against one-token decoding). Nothing here depends on the method or the backend.
"""

from __future__ import annotations

import torch

from ..backends.base import LMBackend, takes_host_ids
from ..draft_length import DraftLength
from ..drafters.base import Drafter
from ..errors import DraftVerifyError
from ..sampling import RowParams, host_array
from ..types import DecodingState, Draft, SamplingParams, TargetOutput, Verdict
from ..verifiers.base import Verifier


def prefill(
    target: LMBackend,
    drafter: Drafter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    params: SamplingParams | RowParams,
    generator: torch.Generator | None,
    seeds: list[int] | None,
    policy: DraftLength,
    prompt_logits: bool = False,
) -> tuple[DecodingState, int]:
    """The target's prefill of input_ids [B, L] (left-padded where attention_mask [B, L] is False) and the
    drafter's start; returns the decoding state and the prompt's real tokens. prompt_logits: the target keeps the
    prefill's logits at every prompt position (take_prompt_logits), for the prompt's log-probabilities."""
    keep = {"prompt_logits": True} if prompt_logits else {}  # asked of a backend only when wanted (its capability)
    committed = target.start(input_ids, want_hidden=drafter.needs_target_hidden, attention_mask=attention_mask, **keep)
    real = attention_mask.to(input_ids.device).long() if attention_mask is not None else None  # [B, L] or None
    if target.is_encoder_decoder or real is None:
        lengths = torch.full((input_ids.shape[0],), committed.shape[1], dtype=torch.long, device=input_ids.device)
    else:
        lengths = real.sum(dim=1)
    state = DecodingState(
        tokens=committed,
        source_ids=input_ids if target.is_encoder_decoder else None,
        prompt_length=committed.shape[1],
        params=params,
        generator=generator,
        lengths=lengths,
        seeds=seeds,
        draft_confidence=policy.confidence,
        costs=policy.sizing_costs,
    )
    drafter.start(state, target.prefilled if drafter.needs_target_hidden else None)
    return state, input_ids.numel() if real is None else int(real.sum())


def propose(drafter: Drafter, verifier: Verifier, state: DecodingState, gamma: int) -> Draft:
    """The drafter's draft of at most gamma tokens; gamma 0 (gamma auto, when no draft pays) is a plain decoding
    step: an empty draft, and the drafter only hears the commit."""
    draft = drafter.propose(state, gamma) if gamma else state.empty_draft()
    if draft.tree is not None and not verifier.accepts_trees:
        raise DraftVerifyError(f"the {verifier.name} verifier checks chains only; this drafter proposed a tree")
    if not state.params.greedy:  # [B] keys position-coupled sampling noise (a greedy verdict reads no noise)
        draft.position = state.next_position()
    draft.seeds = state.seeds
    return draft


def score(target: LMBackend, drafter: Drafter, state: DecodingState, draft: Draft) -> TargetOutput:
    """One target forward over each row's pending token (the one committed token its cache does not hold yet) and
    the draft: logits [B, 1+N, V] (and hidden states), then whatever a wrapping target appends. A ragged chain's
    columns past a row's own draft are padding (new_valid): a backend that decodes only real tokens (llama.cpp's
    rows) does not pay for the longest row's width in every row."""
    if draft.tree is None and takes_host_ids(target):  # Python ints in, none made into a tensor
        rows = [[last, *drafted] for last, drafted in zip(state.last_tokens(), draft.rows)]  # [B][1+N]
        valid = None
        if draft.lengths is not None and len(rows) > 1:  # pending + each row's own draft
            valid = [[column <= length for column in range(len(rows[0]))] for length in draft.lengths.tolist()]
        return target.forward(rows, want_hidden=drafter.needs_target_hidden, new_valid=valid)
    position_ids, mask = verify_layout(target, draft)
    pending = state.pending_column()  # [B, 1]
    scored = torch.cat([pending, draft.tokens], dim=1) if draft.length else pending  # [B, 1+N]
    new_valid = None
    if draft.tree is None and draft.lengths is not None and scored.shape[0] > 1:
        columns = torch.arange(scored.shape[1], device=scored.device)[None]
        new_valid = columns <= draft.lengths.to(scored.device)[:, None]  # [B, 1+N]: pending + the row's draft
    return target.forward(scored, position_ids, mask, want_hidden=drafter.needs_target_hidden, new_valid=new_valid)


def scored_logits(out: TargetOutput, draft: Draft) -> torch.Tensor:
    """The verify pass's logits at the pending token and the draft [B, 1+N, V], without the positions a wrapping
    target appended (no new view when there are none)."""
    logits = out.logits
    host = host_array(logits)  # a host backend's view: its width read without a torch call
    width = host.shape[1] if host is not None else logits.shape[1]
    return logits if width == 1 + draft.length else logits[:, : 1 + draft.length]


def verify(verifier: Verifier, draft: Draft, logits: torch.Tensor, state: DecodingState) -> tuple[Verdict, list[int]]:
    """The verifier's verdict on the target's logits [B, 1+N, V] and each row's accepted count (the step's one
    host sync). A verdict that took target forwards of its own (a backend's verifier wrapper) says so in
    Verdict.target_s."""
    # RowParams reach only per_row_params verifiers (exact), which take them (loop's _check_row_params)
    verdict = verifier.verify(draft, logits, state.params, state.generator)  # type: ignore[arg-type]
    return verdict, verdict.accepted


def commit(
    target: LMBackend,
    drafter: Drafter,
    state: DecodingState,
    draft: Draft,
    verdict: Verdict,
    out: TargetOutput,
    emitted: list[list[int]],
) -> None:
    """The target's cache keeps each row's pending token and accepted drafts (its last emitted token is pending
    now), the state appends each row's emitted tokens, and the drafter hears the verdict."""
    if draft.tree is None:
        target.commit_rows([a + 1 for a in verdict.accepted])  # counts [B], as host ints: no tensor op
    else:
        target.commit(kept_positions(draft, verdict))
    state.append(emitted)
    scored = scored_for_drafter(out, kept_positions(draft, verdict), draft) if drafter.needs_target_hidden else None
    drafter.commit(state, verdict, scored)


def verify_layout(target: LMBackend, draft: Draft) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Position ids [1, 1+N] and attention mask [1+N, 1+N] of a tree's verify pass, or (None, None) for a chain
    (causal order)."""
    if draft.tree is None:
        return None, None
    return target.length + draft.tree.verify_positions()[None], draft.tree.verify_mask()


def kept_positions(draft: Draft, verdict: Verdict) -> torch.Tensor:
    """What the target's cache keeps of this step's verify pass: each row's pending token and accepted draft
    tokens. A chain keeps a prefix: counts [B]; a tree keeps its accepted branch: tail offsets [B, 1+n], -1 past a
    row's own branch."""
    if draft.tree is None:
        return verdict.num_accepted + 1
    n = int(verdict.num_accepted.max())
    path = verdict.path[:, :n]  # [B, n] -1 where a row accepted fewer
    return torch.cat([path.new_zeros((path.shape[0], 1)), torch.where(path >= 0, 1 + path, -1)], dim=1)


def scored_for_drafter(out: TargetOutput, kept: torch.Tensor, draft: Draft) -> TargetOutput:
    """The verify pass's outputs at each row's kept positions, right-aligned (column -1 is every row's last kept
    position; a row that kept fewer repeats its first kept one on the left), then at any positions a wrapping
    target appended after the scored ones. kept: a chain's counts [B], or a tree's tail offsets [B, k] (-1
    padded)."""
    batch = out.logits.shape[0]
    device = out.logits.device
    kept = kept.to(device)
    if kept.dim() == 1:  # counts -> offsets 0..count-1
        width = int(kept.max())
        kept = torch.where(
            torch.arange(width, device=device)[None] < kept[:, None], torch.arange(width, device=device)[None], -1
        )
    count = (kept >= 0).sum(dim=1, keepdim=True)  # [B, 1]
    shift = kept.shape[1] - count  # right-align: column j takes the row's kept entry j - shift
    source = (torch.arange(kept.shape[1], device=device)[None] - shift).clamp_min(0)
    aligned = kept.gather(1, source)  # [B, k]
    extra = torch.arange(1 + draft.length, out.logits.shape[1], device=device).expand(batch, -1)
    index = torch.cat([aligned, extra], dim=1)  # [B, k + E]

    def pick(x: torch.Tensor) -> torch.Tensor:  # [B, n, D] -> [B, k + E, D]
        return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))

    return TargetOutput(logits=pick(out.logits), hidden=None if out.hidden is None else pick(out.hidden))
