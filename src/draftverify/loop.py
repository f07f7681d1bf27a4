"""generate(): the one decoding loop. Prefill, then per step propose -> score (one target forward) -> verify -> commit
(engine/step.py), while the scheduler lets rows leave and join (engine/scheduler.py), logits processors shape
what the target may say at every verified position and cut the draft tokens they forbid (engine/processors.py) and
a recorder keeps the statistics (engine/stats.py).
Nothing here depends on the method or the backend: a method that changes the target's forward wraps the target
(Drafter.wrap_target), and a backend whose verdicts need more than the rule reading its logits wraps the verifier
(backends/base.py wrap_verifier: llama.cpp's tree settling).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import torch

from .backends.base import LMBackend, check_backend, defers_prefill, wrap_verifier
from .backends.registry import as_backend
from .draft_length import DEFAULT_GAMMA, DraftLength, FixedGamma, make_draft_length
from .drafters.base import Drafter
from .engine.logprobs import LogprobsRecorder
from .engine.processors import Processors
from .engine.scheduler import Scheduler, row_generator
from .engine.stats import StatsRecorder, StepRecord, inform_policy
from .engine.step import commit, prefill, propose, score, scored_logits, verify
from .errors import DraftVerifyError
from .processing import Processing
from .sampling import RowParams, row_params
from .threads import one_torch_thread_unless_models_use_it
from .types import GenerationOutput, Logprobs, RowRequest, SamplingParams
from .verifiers.base import Verifier

TokenCallback = Callable[[torch.Tensor], None]  # receives each step's emitted tokens [B, k]


@one_torch_thread_unless_models_use_it
@torch.inference_mode()
def generate(
    target: LMBackend | torch.nn.Module,
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
    admit: Callable[[], list[RowRequest]] | None = None,
    first_token_allowed: torch.Tensor | list | None = None,
    on_step: Callable[[StepRecord, list[int]], None] | None = None,
    processing: Processing | list[Processing | None] | None = None,
    logprobs: Logprobs | list[Logprobs | None] | None = None,
) -> GenerationOutput:
    """Decode up to max_new_tokens after input_ids [B, L] (the source, for encoder-decoder targets) with any backend
    as target. Output equals the target's own greedy decoding (greedy verifier) or is distributed as the target's
    samples (speculative_sampling, l = 1) whatever the drafter proposes.

    Rows are the unit: left-padded rows (attention_mask [B, L] False at the padding) each stop at their own EOS or
    max_new_tokens (an int, or one per row) and equal their batch-1 output. params: one SamplingParams, or one per
    row. on_tokens receives [B, k] (-1 where a row emitted fewer or has left) and may return the rows to stop now;
    on_step each step's StepRecord and the rows it describes, before on_tokens. admit (continuous batching) returns
    the RowRequests that join between steps. For every row or one per row: first_token_allowed (token healing),
    processing (processing.py: penalties, logit bias, min_tokens, stop tokens, structured output, applied at every
    verified position: engine/processors.py) and logprobs (types.Logprobs: engine/logprobs.py).
    """
    started = perf_counter()
    backend = as_backend(target, "target")
    target = drafter.wrap_target(backend)
    verifier = wrap_verifier(target, verifier)
    input_ids, params, limits, attention_mask = _checked(
        target, drafter, verifier, input_ids, params, max_new_tokens, attention_mask, seeds, admit
    )
    policy = _draft_length(gamma, drafter)
    batch = input_ids.shape[0]
    processors = Processors(target.vocab_size, _eos_ids(eos_token_id), target.device)
    checked = processors.check(processing, first_token_allowed, batch)
    asked = LogprobsRecorder.requested(target, logprobs, batch, admit is not None)
    generator, row_seeds = row_generator(params, batch, seeds, admit is not None, input_ids.device)
    now = _clock(target.device, policy.reads_timers)

    keep = LogprobsRecorder.keeps_prompts(asked)  # the prompts' logits: some row asks for its prompt's logprobs
    state, prompt_tokens = prefill(
        target, drafter, input_ids, attention_mask, params, generator, row_seeds, policy, keep
    )
    recorder = StatsRecorder(drafter, prompt_tokens, started, carries_prefill=defers_prefill(target))
    prompts = [state.row(b).tolist() for b in range(batch)]
    rows = Scheduler(limits, prompts, processors.add(checked, prompts))
    scores = None if asked is None else LogprobsRecorder(asked, prompts)
    # What a step skips when it has nothing to do, decided here, not per step: right after a llama.cpp forward the
    # caches are cold, and each call the step makes costs many times its own work.
    device = input_ids.device  # read once: a torch call right after a llama.cpp forward costs the step dearly
    learns = policy.learns  # a fixed length hears nothing about the steps
    calls_back = on_step is not None or on_tokens is not None
    appends = target is not backend  # only a wrapping target may append positions past the scored ones
    shaping = processors.present  # the processors' own list (rows that join may add to it): empty, none to run
    while rows.active:
        step_rows = state.batch_size  # the target scores step_rows x (1 + draft length) tokens
        step_gamma = policy.next(step_rows)
        if step_gamma:
            # drafting up to `remaining` (not remaining - 1) lets a drafter the target never overrules (BiLD with
            # alpha_FB = 0, huge alpha_RB) write the whole text; the surplus target token is cut at max_new_tokens
            step_gamma = min(step_gamma, rows.most_remaining())
        t0 = now()
        draft = propose(drafter, verifier, state, step_gamma)
        if shaping:
            draft = processors.cut(draft, state)
        t1 = now()
        out = score(target, drafter, state, draft)
        t2 = now()
        # the target's own logits at the scored positions: what logprobs report (processors do not change them)
        logits = scored_logits(out, draft) if appends else out.logits
        verdict, accepted = verify(verifier, draft, processors(logits, state, draft) if shaping else logits, state)
        t3 = now()
        emitted = rows.emitted(verdict.rows, accepted)
        # before commit: a backend's logits may be a view its next decode overwrites
        scored = None if scores is None else scores.of_step(logits, draft, verdict, emitted, target, rows.active)
        commit(target, drafter, state, draft, verdict, out, emitted)
        if shaping:
            processors.commit(emitted)
        recorder.step(draft, accepted, emitted, step_gamma, step_rows, (t0, t1, t2, t3), verdict.target_s)
        stop_rows = None
        if learns or calls_back:  # the step's record, made only for those who read it
            record = recorder.record()
            record.logprobs, record.prompt_logprobs = scored if scored is not None else (None, None)
            if learns:
                inform_policy(policy, record)
            if calls_back:
                stop_rows = _call_back(record, emitted, rows, device, recorder, on_step, on_tokens)
        if stop_rows or rows.ending:  # some row ended: it leaves
            rows.leave(stop_rows, target, drafter, state, processors)
        joining = admit() if admit is not None and rows.active else None
        if joining:
            _join(joining, rows, target, drafter, verifier, state, processors, recorder, scores)
    return rows.output(input_ids, recorder.finish(), None if scores is None else scores.rows)


def _eos_ids(eos_token_id: int | list[int] | None) -> set[int]:
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or [])


def _draft_length(gamma: int | str | DraftLength, drafter: Drafter) -> DraftLength:
    """The draft-length policy `gamma` names (a DraftLength as it is), told before the first step when the drafter
    drafts inside the target's verify forward (its drafting then has no cost of its own); a fixed 0 for a drafter
    that never drafts (autoregressive: every step is a plain one, and the drafter is not asked). A name is made
    into a policy bounded by the drafter's longest draft (Drafter.longest_draft)."""
    policy = gamma if isinstance(gamma, DraftLength) else make_draft_length(gamma, longest=drafter.longest_draft)
    if not drafter.drafts:
        return FixedGamma(0)
    if drafter.drafts_in_target_pass:
        policy.drafting_folded()
    return policy


def _call_back(
    record: StepRecord,
    emitted: list[list[int]],
    rows: Scheduler,
    device: torch.device,
    recorder: StatsRecorder,
    on_step: Callable[[StepRecord, list[int]], None] | None,
    on_tokens: TokenCallback | None,
) -> list[int] | None:
    """One step handed to the caller: on_step(record, the active rows), then on_tokens(the emitted tokens [B, k],
    -1 where a row emitted fewer or has left). Returns what on_tokens returns (the rows to stop now, or None); the
    callbacks' time is recorded apart from decoding's."""
    started = perf_counter()
    stop_rows = None
    if on_step is not None:
        on_step(record, rows.active)
    if on_tokens is not None:
        stop_rows = on_tokens(rows.padded(emitted, device))
    recorder.callback(perf_counter() - started)
    return stop_rows


def _join(
    joining: list[RowRequest],
    rows: Scheduler,
    target: LMBackend,
    drafter: Drafter,
    verifier: Verifier,
    state,
    processors: Processors,
    recorder: StatsRecorder,
    scores: LogprobsRecorder | None,
) -> None:
    """Rows admitted between steps (continuous batching) join the batch, their sampling parameters checked against
    the verifier; the time the join took is recorded."""
    started = perf_counter()
    joined = rows.join(joining, target, drafter, state, processors, scores)
    _check_row_params(verifier, state.params)
    recorder.joined(joined, perf_counter() - started)


def _checked(
    target: LMBackend,
    drafter: Drafter,
    verifier: Verifier,
    input_ids: torch.Tensor,
    params,
    max_new_tokens: int | list[int],
    attention_mask: torch.Tensor | None,
    seeds: list | None,
    admit,
) -> tuple[torch.Tensor, SamplingParams | RowParams, list[int], torch.Tensor | None]:
    """The request checked against the target, drafter and verifier: input_ids on the target's device, the
    sampling settings (one, or per row), each row's limit and the attention mask (rows that will join need the
    rows layout from the start)."""
    params = row_params(params if params is not None else SamplingParams())
    input_ids = _check_input(input_ids, max_new_tokens).to(target.device)
    batch = input_ids.shape[0]
    if admit is not None and attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * batch
    if isinstance(params, RowParams) and len(params) != batch:
        raise DraftVerifyError(f"params has {len(params)} entries for {batch} rows")
    _check_row_params(verifier, params)
    if batch > 1 or attention_mask is not None:
        if not target.supports_rows:
            raise DraftVerifyError(
                f"the {target.name} backend decodes one row at a time; batches of several rows "
                "run on --backend hf (backend='hf')"
            )
        _check_batch_support(drafter, verifier, params)
        check_backend(target, type(drafter), drafter.name, batched=True)
    if seeds is not None and len(seeds) != batch:
        raise DraftVerifyError(f"seeds has {len(seeds)} entries for {batch} rows")
    positions = (1 if target.is_encoder_decoder else input_ids.shape[1]) + max(limits)
    target.check_fits(positions)
    drafter.bind(target, positions)
    return input_ids, params, limits, attention_mask


def _check_input(input_ids: torch.Tensor, max_new_tokens: int | list[int]) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise DraftVerifyError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise DraftVerifyError(
            f"input_ids must be integer token ids of shape [batch, length], got {tuple(input_ids.shape)} "
            f"{input_ids.dtype}"
        )
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


def _check_row_params(verifier: Verifier, params: SamplingParams | RowParams) -> None:
    if isinstance(params, RowParams) and not verifier.per_row_params:
        raise DraftVerifyError(
            f"the {verifier.name} verifier takes one sampling setting for the whole batch; rows "
            "with different temperature / top-k / top-p need a lossless method (its 'exact' rule)"
        )
    # past the check above, RowParams reach only per_row_params verifiers (exact), which take them
    verifier.check_params(params)  # type: ignore[arg-type]


def _clock(device: torch.device, synchronise: bool) -> Callable[[], float]:
    """perf_counter, after waiting for queued GPU work when the caller reads the times (gamma auto): without the
    wait, CUDA's asynchronous launches would charge the target's forward to whatever syncs next."""
    if synchronise and device.type == "cuda":

        def now() -> float:
            torch.cuda.synchronize(device)
            return perf_counter()

        return now
    return perf_counter
