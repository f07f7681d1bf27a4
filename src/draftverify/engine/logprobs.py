"""Log-probabilities of the target, taken at one place in the loop whatever the method: the step's verify logits as
the target gave them (before any logits processor and the sampling transform), at the positions whose next tokens
the row emitted. A chain's emitted token j was scored at verify position j; a tree's at the pending token's position
and then at each kept node's. The prompt's come from the prefill: the backend keeps its logits when asked
(`start` / `join_rows` with prompt_logits=True) and hands them over once (`take_prompt_logits`), after the forward
that decoded them (llama.cpp decodes a prompt with the first step's forward).

What is reported is the target's own distribution, log_softmax of its logits: the numbers the target alone gives
for the same text, which a drafter cannot change and a sampling setting does not (vLLM's default, raw logprobs).
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..types import Draft, Logprobs, RowLogprobs, TokenLogprob, Verdict


def position_logprobs(logits: torch.Tensor, tokens: list[int], tops: list[int]) -> list[TokenLogprob]:
    """Each position's log-probabilities: logits [n, V] at n positions, the token chosen at each [n] and how many
    of the most likely tokens each lists [n]. The chosen token's value and the listed ones come from the same
    tensor, so a chosen token that is the most likely one has exactly the top value."""
    if not tokens:
        return []
    logprobs = logits.float().log_softmax(dim=-1)  # [n, V]
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()
    most = min(max(tops), logprobs.shape[-1])
    if most:
        values, ids = logprobs.topk(most, dim=-1)  # [n, most], most likely first
        top_values, top_ids = values.tolist(), ids.tolist()
    out = []
    for j, (token, value, count) in enumerate(zip(tokens, chosen, tops)):
        listed = tuple(zip(top_ids[j][:count], top_values[j][:count])) if count else ()
        out.append(TokenLogprob(token, value, listed))
    return out


class LogprobsRecorder:
    """The log-probabilities the rows asked for (Logprobs per row, None: none), in rows as the Scheduler counts them
    (a joined row takes the next index). Each step's verify logits go through step(); a forward that decoded
    prompts whose logits were asked for is followed by prompt()."""

    def __init__(self, asked: list[Logprobs | None], prompts: list[list[int]]):
        self.asked: list[Logprobs | None] = []
        self.rows: list[RowLogprobs | None] = []
        self.prompts: list[list[int]] = []
        self.waiting: set[int] = set()  # rows whose prompt's logits the backend keeps, not taken yet
        self.add(asked, prompts)

    @classmethod
    def requested(
        cls, target, logprobs: Logprobs | list[Logprobs | None] | None, batch: int, joins: bool
    ) -> list[Logprobs | None] | None:
        """generate's `logprobs` (one Logprobs for every row, or one per row) as one entry per row, checked against
        the target (check); None when no row asks and none can join (rows that join may ask)."""
        rows = cls._per_row(logprobs, batch, joins)
        if rows is not None:
            cls.check(target, rows)
        return rows

    @staticmethod
    def keeps_prompts(asked: list[Logprobs | None] | None) -> bool:
        """Whether the prefill must keep the prompts' logits (some row asks for its prompt's log-probabilities)."""
        return asked is not None and any(a is not None and a.prompt for a in asked)

    @staticmethod
    def _per_row(
        logprobs: Logprobs | list[Logprobs | None] | None, batch: int, joins: bool
    ) -> list[Logprobs | None] | None:
        if logprobs is None:
            return [None] * batch if joins else None
        rows: list[Logprobs | None] = [logprobs] * batch if isinstance(logprobs, Logprobs) else list(logprobs)
        if len(rows) != batch:
            raise DraftVerifyError(f"logprobs has {len(rows)} entries for {batch} rows")
        for entry in rows:
            if entry is not None and not isinstance(entry, Logprobs):
                raise DraftVerifyError(f"logprobs entries must be Logprobs or None, got {type(entry).__name__}")
        return rows if joins or any(entry is not None for entry in rows) else None

    def add(self, asked: list[Logprobs | None], prompts: list[list[int]]) -> bool:
        """Rows that start or join; True when the backend must keep their prompts' logits."""
        first = len(self.asked)
        self.asked.extend(asked)
        self.prompts.extend(prompts)
        self.rows.extend(None if a is None else RowLogprobs(prompt=[] if a.prompt else None) for a in asked)
        self.waiting.update(first + i for i, a in enumerate(asked) if a is not None and a.prompt)
        return any(a is not None and a.prompt for a in asked)

    @staticmethod
    def check(target, asked: list[Logprobs | None]) -> None:
        """Refuse prompt log-probabilities the target cannot give (an encoder-decoder's prompt is its source; a
        backend that does not keep the prefill's logits)."""
        if not any(a is not None and a.prompt for a in asked):
            return
        if target.is_encoder_decoder:
            raise DraftVerifyError(
                "the prompt's log-probabilities are a decoder-only target's (an encoder-decoder's prompt is its source)"
            )
        if not callable(getattr(target, "take_prompt_logits", None)):
            raise DraftVerifyError(f"the {target.name} backend does not keep the prompt's logits (prompt logprobs)")

    def prompt(self, target, active: list[int]) -> list[list[TokenLogprob] | None] | None:
        """After a forward: the prompt log-probabilities of the rows waiting for theirs (per active row, None for
        the others), from the logits the backend kept; None when no row waits."""
        if not self.waiting:
            return None
        kept = target.take_prompt_logits()  # per active row: logits [P, V] at every prompt position but the last
        out: list[list[TokenLogprob] | None] = [None] * len(active)
        for i, row in enumerate(active):
            if row not in self.waiting or kept[i] is None:
                continue
            asked = self.asked[row]
            assert asked is not None
            tokens = self.prompts[row][1:]  # position p scores prompt token p + 1
            logits = kept[i][-len(tokens) :] if tokens else kept[i][:0]
            out[i] = position_logprobs(logits, tokens, [asked.top] * len(tokens))
            record = self.rows[row]
            assert record is not None
            record.prompt = out[i]
        self.waiting.clear()
        return out

    def of_step(
        self, logits: torch.Tensor, draft: Draft, verdict: Verdict, emitted: list[list[int]], target, active: list[int]
    ) -> tuple[list[list[TokenLogprob] | None], list[list[TokenLogprob] | None] | None]:
        """A step's (StepRecord.logprobs, .prompt_logprobs): its emitted tokens' (step) and, after a forward that
        decoded prompts whose logits were asked for, theirs (prompt). Read before commit: the logits may be a view
        the backend's next decode overwrites."""
        return self.step(logits, draft, verdict, emitted, active), self.prompt(target, active)

    def step(
        self, logits: torch.Tensor, draft: Draft, verdict: Verdict, emitted: list[list[int]], active: list[int]
    ) -> list[list[TokenLogprob] | None]:
        """The step's emitted tokens' log-probabilities, per active row (None where a row asked for none), from
        the verify logits [B, 1+N, V] before any processor. One log_softmax over the positions that emitted."""
        rows, positions, tokens, tops, owners = [], [], [], [], []
        for i, row in enumerate(active):
            asked = self.asked[row]
            if asked is None or not emitted[i]:
                continue
            count = len(emitted[i])
            if draft.tree is None:
                at = list(range(count))
            else:  # the pending token's position, then the kept nodes' (path: node indices, position = 1 + node)
                at = [0, *(1 + node for node in verdict.path[i, : count - 1].tolist())]
            rows.extend([i] * count)
            positions.extend(at)
            tokens.extend(emitted[i])
            tops.extend([asked.top] * count)
            owners.append((i, row, count))
        out: list[list[TokenLogprob] | None] = [None] * len(active)
        if not tokens:
            return out
        picked = logits[torch.tensor(rows), torch.tensor(positions)]  # [M, V]
        entries = position_logprobs(picked, tokens, tops)
        start = 0
        for i, row, count in owners:
            out[i] = mine = entries[start : start + count]
            record = self.rows[row]
            assert record is not None
            record.tokens.extend(mine)
            start += count
        return out
