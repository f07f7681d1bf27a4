"""Logits processors: what the target's verify logits go through before the verifier judges them.

A verify pass scores several positions at once (logits [B, 1+N, V]; position 0 scores the row's next token, position
1+j the token after draft node j). Each position is processed with the state it would have had when decoding token
by token: the tokens generated so far plus the draft tokens it follows (a chain's earlier tokens, a tree node's
ancestors: `Step`, processor.py, beside the interface every processor here implements). So the verdict, whatever
the method, is the target's own decoding under the same processing: greedy, the best token the processing leaves;
sampling, the processed distribution.

A processor takes (logits, state, step) and returns the logits. Some forbid tokens outright (`Mask`: the first
token of a healed prompt, min_tokens, structured output); a draft token one of them forbids is cut from the draft
before the target scores it (`Processors.cut`, after propose, whatever the drafter), and a drafter's q is
renormalised over what is allowed there, which keeps speculative sampling exact (the cut token would have been
rejected; its siblings and the positions before it are then judged against the q they are drawn from, restricted).
The rest change values (logit_bias, penalties). Application order follows vLLM: bias, penalties, then the masks
(a -inf stays -inf through the penalties, so their order does not matter).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import DraftVerifyError
from ..processing import PLAIN, Processing, ProcessingError, Structured
from ..types import DecodingState, Draft
from .grammar import GrammarMask
from .processor import NEUTRAL, Mask, Processor, RowStart, Step, kept_rows, wide_dtype


def allowed_ids(allowed, vocab_size: int) -> torch.Tensor | None:
    """One row's set of allowed first tokens as ids [K] (validated), or None for a row without constraint."""
    if allowed is None:
        return None
    ids = torch.as_tensor(allowed).reshape(-1).long()
    if ids.numel() == 0:
        raise DraftVerifyError("first_token_allowed: a row's set of allowed first tokens is empty")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftVerifyError(
            f"first_token_allowed: token ids must be in [0, {vocab_size}), got {int(ids.min())}..{int(ids.max())}"
        )
    return ids


class FirstTokenAllowed(Mask):
    """The tokens each row's FIRST new token may be (token healing, healing.py): position 0 of the next verify pass
    only; spent once that step is committed. Rows that join bring their own sets."""

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__(vocab_size, device)
        self.rows: list[torch.Tensor | None] = []

    @staticmethod
    def needed(row: RowStart) -> bool:
        return row.first_allowed is not None

    @property
    def active(self) -> bool:
        return any(a is not None for a in self.rows)

    def add(self, rows: list[RowStart]) -> None:
        self.rows += [None if r.first_allowed is None else r.first_allowed.to(self.device) for r in rows]

    def drop(self, keep: list[bool]) -> None:
        self.rows = kept_rows(self.rows, keep)

    def commit(self, emitted: list[list[int]]) -> None:
        self.rows = [None] * len(self.rows)  # every row has taken its first token

    def _keep(self) -> torch.Tensor:  # [B, V] True where the first token may be
        keep = torch.ones(len(self.rows), self.vocab_size, dtype=torch.bool, device=self.device)
        for b, ids in enumerate(self.rows):
            if ids is not None:
                keep[b] = False
                keep[b, ids] = True
        return keep

    def allows(self, step: Step) -> torch.Tensor:
        tokens = step.draft.tokens  # [B, N]
        first = tokens.new_tensor(step.parents) < 0  # [N] the root's children
        return self._keep().gather(1, tokens) | ~first[None]

    def forbid(self, values: torch.Tensor, step: Step, positions: torch.Tensor) -> torch.Tensor:
        at_zero = (positions == 0).nonzero().flatten().tolist()
        if at_zero:
            keep = self._keep()
            for i in at_zero:
                values[:, i] = values[:, i].masked_fill(~keep, float("-inf"))
        return values


class MinTokens(Mask):
    """min_tokens: a row's stop tokens (EOS unless ignore_eos, stop_token_ids) are forbidden at every position before
    its min_tokens-th new token (the draft tokens before a position count)."""

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__(vocab_size, device)
        self.least: list[int] = []
        self.generated: list[int] = []
        self.stops: list[torch.Tensor] = []

    @staticmethod
    def needed(row: RowStart) -> bool:
        return row.processing.min_tokens > 0 and bool(row.stops)

    @property
    def active(self) -> bool:
        return any(g < m for g, m in zip(self.generated, self.least))

    def add(self, rows: list[RowStart]) -> None:
        self.least += [r.processing.min_tokens for r in rows]
        self.generated += [0] * len(rows)
        self.stops += [torch.tensor(sorted(r.stops), dtype=torch.long, device=self.device) for r in rows]

    def drop(self, keep: list[bool]) -> None:
        self.least, self.generated, self.stops = (kept_rows(x, keep) for x in (self.least, self.generated, self.stops))

    def commit(self, emitted: list[list[int]]) -> None:
        self.generated = [g + len(e) for g, e in zip(self.generated, emitted)]

    def _early(self, depth: torch.Tensor) -> torch.Tensor:
        """[B, P] True where a position (of these depths [P]) comes before the row's min_tokens-th token."""
        generated = torch.tensor(self.generated, device=self.device)
        least = torch.tensor(self.least, device=self.device)
        return (generated[:, None] + depth[None]) < least[:, None]

    def allows(self, step: Step) -> torch.Tensor:
        tokens = step.draft.tokens  # [B, N]
        early = self._early(step.all_depth[step.node_position])  # [B, N]
        stopping = torch.stack([torch.isin(tokens[b], self.stops[b]) for b in range(tokens.shape[0])])
        return ~(early & stopping)

    def forbid(self, values: torch.Tensor, step: Step, positions: torch.Tensor) -> torch.Tensor:
        early = self._early(step.all_depth[positions])  # [B, P]
        for b, stops in enumerate(self.stops):
            at = early[b].nonzero().flatten()
            if at.numel() and stops.numel():
                values[b, at[:, None], stops[None, :]] = float("-inf")
        return values


class LogitBias(Processor):
    """logit_bias: each row's bias added to its logits at every position."""

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__(vocab_size, device)
        self.bias = torch.zeros(0, vocab_size, dtype=wide_dtype(device), device=device)  # [B, V]

    @staticmethod
    def needed(row: RowStart) -> bool:
        return bool(row.processing.bias)

    def add(self, rows: list[RowStart]) -> None:
        bias = torch.zeros(len(rows), self.vocab_size, dtype=wide_dtype(self.device), device=self.device)
        for b, row in enumerate(rows):
            for token, value in row.processing.bias:
                bias[b, token] = value
        self.bias = torch.cat([self.bias, bias])

    def drop(self, keep: list[bool]) -> None:
        self.bias = self.bias[torch.tensor(keep, device=self.device)]

    def __call__(self, logits: torch.Tensor, state: DecodingState, step: Step) -> torch.Tensor:
        return logits.add_(self.bias[:, None].to(logits.dtype))


def penalize(
    logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, repetition, frequency, presence
) -> torch.Tensor:
    """vLLM's penalties on logits [..., K] of tokens generated `counts` times [..., K] and present in the prompt or
    the output (seen [..., K]): repetition divides a positive logit and multiplies a negative one, then frequency x
    count and presence (count > 0) are subtracted. The settings broadcast against the logits ([B, 1, 1])."""
    factor = torch.where(seen, repetition, torch.ones_like(logits))
    logits = torch.where(logits > 0, logits / factor, logits * factor)
    return logits - frequency * counts - presence * (counts > 0)


class Penalties(Processor):
    """presence / frequency / repetition penalties. Each position counts the row's generated tokens and the draft
    tokens it follows; repetition also the prompt. The penalty of every token is taken from the committed counts,
    and the tokens a position's draft path holds get theirs again with the path counted (a scatter: no [B, P, V]
    count tensor)."""

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__(vocab_size, device)
        self.counts = torch.zeros(0, vocab_size, device=device)  # [B, V] generated tokens
        self.seen = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)  # [B, V] in the prompt or the output
        # [B, 3]: each row's repetition, frequency and presence penalties
        self.settings = torch.zeros(0, 3, dtype=wide_dtype(device), device=device)

    @staticmethod
    def needed(row: RowStart) -> bool:
        return row.processing.penalized

    def add(self, rows: list[RowStart]) -> None:
        seen = torch.zeros(len(rows), self.vocab_size, dtype=torch.bool, device=self.device)
        for b, row in enumerate(rows):
            if row.processing.repetition_penalty != 1 and row.prompt:
                seen[b, torch.tensor(row.prompt, device=self.device)] = True
        p = [
            (r.processing.repetition_penalty, r.processing.frequency_penalty, r.processing.presence_penalty)
            for r in rows
        ]
        self.counts = torch.cat([self.counts, torch.zeros(len(rows), self.vocab_size, device=self.device)])
        self.seen = torch.cat([self.seen, seen])
        self.settings = torch.cat([self.settings, torch.tensor(p, dtype=wide_dtype(self.device), device=self.device)])

    def drop(self, keep: list[bool]) -> None:
        rows = torch.tensor(keep, device=self.device)
        self.counts, self.seen, self.settings = self.counts[rows], self.seen[rows], self.settings[rows]

    def commit(self, emitted: list[list[int]]) -> None:
        rows = [b for b, e in enumerate(emitted) for _ in e]
        if rows:
            tokens = torch.tensor([t for e in emitted for t in e], device=self.device)
            index = torch.tensor(rows, device=self.device)
            self.counts.index_put_((index, tokens), torch.ones(len(rows), device=self.device), accumulate=True)
            self.seen[index, tokens] = True

    def __call__(self, logits: torch.Tensor, state: DecodingState, step: Step) -> torch.Tensor:
        settings = self.settings.to(logits.dtype)
        repetition, frequency, presence = (settings[:, i, None, None] for i in range(3))  # [B, 1, 1] each
        tokens = step.draft.tokens  # [B, N]
        batch, width = logits.shape[0], logits.shape[1]
        n = tokens.shape[1]
        if n:  # the draft tokens' own logits, before the committed penalties overwrite them
            index = tokens[:, None, :].expand(batch, width, n)  # [B, P, N]
            raw = logits.gather(-1, index)
        out = penalize(logits, self.counts[:, None], self.seen[:, None], repetition, frequency, presence)
        if n:
            same = tokens[:, :, None] == tokens[:, None, :]  # [B, N, N]: node j' holds node j's token
            # times the token of node j occurs on the path before position p: [B, P, N]
            extra = (step.follows[None, :, :, None] & same[:, None]).sum(dim=2).float()
            counts = self.counts.gather(1, tokens)[:, None] + extra
            seen = self.seen.gather(1, tokens)[:, None] | (extra > 0)
            out.scatter_(-1, index, penalize(raw, counts, seen, repetition, frequency, presence))
        return out


class Processors:
    """The processors of one generation, in their order (bias, penalties, then the masks), made when a row first
    needs one. Empty, every verb returns what it was given: a generation without processing pays nothing."""

    def __init__(self, vocab_size: int, eos: set[int], device: torch.device):
        self.vocab_size = vocab_size
        self.eos = eos
        self.device = device
        self.present: list[Processor] = []  # extended in place, never rebound: the loop holds this list and skips
        # the processors while it is empty
        self.rows = 0
        self.stops: list[list[int]] = []  # each row's stop tokens (what a position the masks leave empty allows)
        self._step: Step | None = None

    def check(self, processing, allowed, batch: int) -> list[tuple[Processing, torch.Tensor | None]]:
        """Each row's settings (one Processing for all, or one per row, None: none) and allowed first tokens (one
        set for all, or one per row), validated against the vocabulary before anything runs."""
        settings = _per_row(processing, batch, "processing")
        for p in settings:
            if not isinstance(p, Processing):
                raise DraftVerifyError(f"processing must be a draftverify Processing, got {type(p).__name__}")
            p.check_vocabulary(self.vocab_size)
            _check_structured(p, self.vocab_size)
        if isinstance(allowed, torch.Tensor):
            allowed = [allowed] * batch
        firsts = [None] * batch if allowed is None else list(allowed)
        if len(firsts) != batch:
            raise DraftVerifyError(f"first_token_allowed has {len(firsts)} entries for {batch} rows")
        return list(zip(settings, [allowed_ids(a, self.vocab_size) for a in firsts]))

    def add(self, checked: list[tuple[Processing, torch.Tensor | None]], prompts: list[list[int]]) -> list[set[int]]:
        """Rows that start (or join) with their checked settings and prompts; returns each row's stop tokens."""
        rows = [RowStart(p, prompt, first, p.stops(self.eos)) for (p, first), prompt in zip(checked, prompts)]
        present = [type(p) for p in self.present]
        for kind in kinds():
            if kind not in present and any(kind.needed(r) for r in rows):
                made = kind(self.vocab_size, self.device)
                made.add([NEUTRAL] * self.rows)
                self.present.append(made)
        self.present.sort(key=lambda p: kinds().index(type(p)))
        for processor in self.present:
            processor.add(rows)
        self.rows += len(rows)
        self.stops += [sorted(r.stops) for r in rows]
        return [r.stops for r in rows]

    def drop(self, keep: list[bool]) -> None:
        for processor in self.present:
            processor.drop(keep)
        self.rows = sum(keep)
        self.stops = kept_rows(self.stops, keep)

    def commit(self, emitted: list[list[int]]) -> None:
        for processor in self.present:
            processor.commit(emitted)

    def live(self) -> list[Processor]:
        return [p for p in self.present if p.active]

    def cut(self, draft: Draft, state: DecodingState) -> Draft:
        """The draft without the tokens a mask forbids (and all that follow them), before the target pays for them:
        a chain ends before its first forbidden token (its width shrinks to the longest row's), a tree's forbidden
        nodes and their subtrees leave `valid`; a drafter's q is renormalised over the allowed tokens."""
        live = self.live() if self.present else None
        if not live:
            self._step = None
            return draft
        step = Step(draft)
        masks = [p for p in live if isinstance(p, Mask)]
        for mask in masks:
            mask.prepare(state, step)
        cut = self._without_forbidden(draft, step, masks) if masks and draft.length else draft
        if cut is not draft:
            step = Step(cut) if cut.tree is None else step  # a chain may have lost columns; a tree keeps its nodes
            step.draft = cut
        self._step = step
        cut.process = lambda logits, positions: self(logits, state, cut, positions)
        return cut

    @staticmethod
    def _without_forbidden(draft: Draft, step: Step, masks: list[Mask]) -> Draft:
        allowed = masks[0].allows(step)
        for mask in masks[1:]:
            allowed = allowed & mask.allows(step)  # [B, N]
        if bool(allowed.all()) and draft.q_probs is None:
            return draft
        # [B, N]: a forbidden node on the path to a node (itself, or one of its ancestors)
        blocked = (~allowed[:, None, :] & step.all_follows[1:][None]).any(dim=-1)
        q = draft.q_probs
        if q is not None:
            free = torch.zeros(q.shape, device=q.device)
            for mask in masks:
                mask.forbid(free, step, step.node_position)
            q = torch.where(free == 0, q, torch.zeros((), dtype=q.dtype, device=q.device))
            mass = q.sum(dim=-1, keepdim=True)
            q = q / torch.where(mass > 0, mass, torch.ones_like(mass))
        if draft.tree is not None:
            valid = ~blocked if draft.valid is None else draft.valid.to(blocked.device) & ~blocked
            return replace(draft, q_probs=q, valid=valid)
        lengths = (~blocked).sum(dim=1)  # a chain's allowed nodes are a prefix
        if draft.lengths is not None:
            lengths = torch.minimum(lengths, draft.lengths.to(lengths.device))
        width = int(lengths.max())
        ragged = bool((lengths < width).any())
        return replace(
            draft,
            tokens=draft.tokens[:, :width],
            q_probs=None if q is None else q[:, :width],
            lengths=lengths.to(draft.tokens.device) if ragged else None,
        )

    def __call__(
        self, logits: torch.Tensor, state: DecodingState, draft: Draft, positions: list[int] | None = None
    ) -> torch.Tensor:
        """The verify logits [B, P, V] processed: at every position of the step (P = 1+N), or at the given verify
        positions (a re-scored branch: backends/llamacpp_settle.py). Unprocessed, the logits as they are."""
        live = self.live() if self.present else None
        if not live:
            return logits
        step = self._step if self._step is not None and self._step.draft is draft else Step(draft)
        if positions is not None:
            step = step.at(positions)
        # a copy (the target's own logits stay as they are), in float32 at least
        processed = logits.clone() if logits.dtype in (torch.float32, torch.float64) else logits.float()
        for processor in live:
            processed = processor(processed, state, step)
        if sum(isinstance(p, Mask) for p in live) > 1:  # one mask alone never forbids every token (GrammarMask.prepare)
            self._never_empty(processed, logits)
        return processed

    def _never_empty(self, processed: torch.Tensor, logits: torch.Tensor) -> None:
        """Where the masks together forbid every token (min_tokens against a complete grammar, a grammar that admits
        nothing), the row's stop tokens are allowed (the text ends there); a row without stop tokens keeps the
        target's own logits there. Never a position with no token to take."""
        dead = (processed == float("-inf")).all(dim=-1)  # [B, P]
        if not bool(dead.any()):
            return
        for b, position in dead.nonzero().tolist():
            if self.stops[b]:
                processed[b, position, self.stops[b]] = 0.0
            else:
                processed[b, position] = logits[b, position].to(processed.dtype)


def kinds() -> tuple[type[Processor], ...]:
    """Every kind of processor, in the order they apply: values first (bias, penalties), then the masks."""
    return (LogitBias, Penalties, FirstTokenAllowed, MinTokens, GrammarMask)


def _per_row(value, batch: int, name: str) -> list:
    if value is None:
        return [PLAIN] * batch
    if isinstance(value, (list, tuple)):
        if len(value) != batch:
            raise DraftVerifyError(f"{name} has {len(value)} entries for {batch} rows")
        return [PLAIN if v is None else v for v in value]
    return [value] * batch


def _check_structured(processing: Processing, vocab_size: int) -> None:
    """A row's structured output must come compiled for this model (structured.GrammarCompiler)."""
    grammar = processing.structured
    if grammar is None:
        return
    if isinstance(grammar, Structured):
        raise ProcessingError(
            "structured",
            "compile it for the model's tokenizer first: Pipeline.generate does (processing=...), or "
            "draftverify.structured.compiler_for(tokenizer, vocab_size, eos_ids).compile(structured)",
        )
    if getattr(grammar, "vocab_size", None) != vocab_size:
        raise ProcessingError(
            "structured", f"compiled for {getattr(grammar, 'vocab_size', '?')} logits; this target has {vocab_size}"
        )
