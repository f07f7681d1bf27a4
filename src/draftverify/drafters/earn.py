"""Drafts chosen by what they earn: each step the suffix cache, prompt lookup and the draft model each offer a draft
with its expected accepted tokens, and the step takes the one with the most expected tokens per second: its
drafting cost plus the verify cost of its width on this target (the measured cost curve), against plain decoding.

llama.cpp's drafter chains (and `lookup_model` here) take the first drafter that answers, in a fixed order; on a
target whose verify pass grows dear with its width (a quantized file on a CPU) a long, doubtful copy then costs more
than it earns, and on one where width is nearly free (f32) a short sure copy leaves the draft model's longer run
unused. Here every offer is priced:

- expected accepted tokens of a chain whose token k is kept with chance a_k given the ones before: sum over k of
  a_1 ... a_k. The suffix cache gives a_k itself (its continuation's frequency, scaled by how its estimates fared
  in this run: observed over predicted accepted tokens); prompt lookup has per-position acceptance rates measured
  in this run for each length of the n-gram that matched (draft_length._Rate, prior 0.5). Both drafts are cut to
  the width that earns most;
- the draft model is priced by what its own steps earned in this run (draft tokens kept per row, its draft's width,
  its drafting seconds: running means; an optimistic guess for its first steps); when chosen it drafts as `model`
  does (the same drafter from the same options: staged drafting with prompt lookup, lookup's agreement as
  confidence), its confidence stop (gamma conf) ending the draft;
- seconds: the verify pass over rows x (1 + width) tokens: the target's cost curve where it has one (llama.cpp),
  its level set by this run's steps (the time between a proposal and its verdict; draft_length.VerifyCost), else a
  line fitted to those steps. Lookups cost microseconds and count as free;
- plain decoding (no draft) is an offer too, at one token per one-token pass.

A source not chosen for `explore_every` steps is taken once when it has a draft, so its rates stay measured. In a
batch every row drafts from the same source (the batch's expected tokens over the batch's pass). Every component
hears every commit (the model's cache catches up lazily on what it skipped, as in lookup_model), so the choice
changes what is proposed, never what is kept: the verifier keeps the output the target's own.
"""

from __future__ import annotations

from time import perf_counter

import torch

from ..backends.base import LMBackend
from ..draft_length import VerifyCost, _Rate
from ..errors import DraftVerifyError
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, DraftModel, empty_draft
from .model import ModelDrafter, require_shared_vocabulary
from .prompt_lookup import PromptLookupDrafter, ragged_draft
from .suffix import SuffixDrafter

SOURCES = ("suffix", "lookup", "model")
MAX_POSITIONS = 64  # draft positions whose acceptance rates are kept
MIN_MODEL_STEPS = 8  # timed steps of the draft model before what they earned prices its offer


def expected_kept(chances: list[float]) -> float:
    """Expected accepted tokens of a chain whose token k is kept with chance chances[k] given the ones before."""
    total, reach = 0.0, 1.0
    for chance in chances:
        reach *= chance
        total += reach
    return total


class EarnedDrafter(Drafter):
    supports_batch = True

    def __init__(
        self,
        suffix: SuffixDrafter,
        lookup: PromptLookupDrafter,
        model: ModelDrafter | None = None,
        explore_every: int = 16,
    ):
        super().__init__()
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 1:
            raise DraftVerifyError(f"explore_every must be an integer >= 1, got {explore_every!r}")
        self.suffix, self.lookup, self.model = suffix, lookup, model
        self.explore_every = explore_every
        self.rates: dict[str, _Rate] = {}  # acceptance per draft position: per source (lookup: per n-gram length)
        self.suffix_predicted = self.suffix_observed = 1.0  # the suffix cache's estimates against what was kept
        self.verify = VerifyCost()  # seconds of a verify pass ~ tokens it scores (rows x (1 + width))
        # what the draft model's steps earned (running means): draft tokens kept per row, draft width, seconds drafting
        self.model_earned: tuple[float, float, float] | None = None
        self.model_steps = 0  # timed steps the model drafted
        self.chosen: dict[str, int] = {name: 0 for name in (*SOURCES, "none")}  # steps each source drafted
        self._idle = {name: 0 for name in SOURCES}  # steps since each source was last chosen
        # this step's source, its rows' draft lengths, the rate key each row's draft is judged under, when the
        # proposal ended and the seconds it took
        self._step: tuple[str, list[int], list[str], float, float] | None = None
        self._timed = False  # the next verify pass is a step's alone (not a prompt's decode)
        self._previous = "none"  # the last step's source
        self._suffix_chances: list[list[float]] = []  # the suffix offer's chances, cut to its priced width

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "EarnedDrafter":
        model = None
        if options.draft_model is not None:
            require_shared_vocabulary(options, cls.name)
            model = ModelDrafter.from_options(target, options)  # as `model` drafts: staged, lookup confirming
        return cls(
            SuffixDrafter.from_options(target, options),
            PromptLookupDrafter.from_options(target, options),
            model,
            options.earn_explore_every,
        )

    @property
    def computes_in_torch(self) -> bool:
        return self.model.computes_in_torch if self.model is not None else False

    def models(self) -> list[DraftModel]:
        if self.model is None:
            return []
        return [DraftModel(m.lm, lags=True) for m in self.model.models()]  # idle on lookup steps, then catches up

    def bind(self, target: LMBackend, max_positions: int) -> None:
        if self.model is not None:
            self.model.bind(target, max_positions)
        curve = getattr(target, "cost_curve", None)
        if curve is not None and not self.verify.known:
            self.verify.seed(curve())  # the target's measured curve, worth one step per width

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self.suffix.start(state, prefilled)
        if self.model is not None:
            self.model.start(state, prefilled)
        self._step, self._timed, self._previous = None, False, "none"

    # ---- the offers -------------------------------------------------------------------------------------------
    def _rates(self, key: str) -> _Rate:
        if key not in self.rates:
            self.rates[key] = _Rate(MAX_POSITIONS)
        return self.rates[key]

    def _verify_seconds(self, tokens: float) -> float:
        return self._verify_seconds_at([tokens])[0]

    def _verify_seconds_at(self, tokens: list[float]) -> list[float]:
        """Seconds of a verify pass over each entry of `tokens` (1.0 each until a cost is known)."""
        if not self.verify.known:
            return [1.0] * len(tokens)
        return [max(s, 1e-9) for s in self.verify.at(tokens)]

    def _rate(self, kept: float, rows: int, width: float, draft_seconds: float = 0.0) -> float:
        """Expected tokens per second of a step whose rows keep `kept` draft tokens in all over a draft `width`
        wide: the rows' own next tokens, over the drafting and the verify pass."""
        return (rows + kept) / (draft_seconds + self._verify_seconds(rows * (1 + width)))

    def _priced_prefix(self, rows: list[list[int]], chances: list[list[float]]) -> tuple[float, int]:
        """The best (rate, width) of a batch of host drafts cut to a common width: each row's tokens kept with
        chances[b][k] given the ones before, the verify pass over every row's pending token and the width. Each
        row's expected kept tokens grow by one term per width (expected_kept of each prefix, summed as it does),
        and the verify seconds of every width are read in one call: this runs every step, over drafts up to the
        longest draft's width."""
        count, longest = len(rows), max(len(r) for r in rows)
        seconds = self._verify_seconds_at([count * (1 + width) for width in range(1, longest + 1)])
        totals, reaches = [0.0] * len(chances), [1.0] * len(chances)
        best = (0.0, 0)
        for width in range(1, longest + 1):
            for b, c in enumerate(chances):
                if width <= len(c):
                    reaches[b] *= c[width - 1]
                    totals[b] += reaches[b]
            rate = (count + sum(totals)) / seconds[width - 1]
            if rate > best[0]:
                best = (rate, width)
        return best

    def _model_offer(self, rows: int) -> float:
        """The draft model's rate from what its steps earned in this run (tokens kept per row, its draft's width
        and seconds, running means); until MIN_MODEL_STEPS were timed an optimistic guess (a draft of 4 kept
        whole), so it is tried, and measured where it drafts step after step, not only when explored."""
        earned = self.model_earned if self.model_steps >= MIN_MODEL_STEPS else None
        kept, width, seconds = earned if earned is not None else (4.0, 4.0, 0.0)
        return self._rate(rows * kept, rows, width, seconds)

    def offers(self, state: DecodingState, gamma: int) -> dict[str, tuple[float, list[list[int]] | None, list[str]]]:
        """Each source's offer: (expected tokens per second, each row's draft as host ints (the model's: None, it
        drafts when chosen), the rate key each row's draft is judged under)."""
        rows = state.batch_size
        out: dict[str, tuple[float, list[list[int]] | None, list[str]]] = {}
        scale = self.suffix_observed / self.suffix_predicted
        found, chances = [], []
        for b in range(rows):
            text = state.row_ids(b)
            tokens, odds = self.suffix.index.continuation_with_odds(
                text[-self.suffix.max_match :], gamma, self.suffix.min_prob
            )
            found.append(tokens)
            chances.append([min(1.0, o * scale) for o in odds])
        if any(found):
            rate, width = self._priced_prefix(found, chances)
            out["suffix"] = (rate, [tokens[:width] for tokens in found], ["suffix"] * rows)
            self._suffix_chances = [c[:width] for c in chances]
        matches = [self.lookup.find(state, b, gamma) for b in range(rows)]  # (tokens, n-gram length)
        copied, keys = [tokens for tokens, _ in matches], [f"lookup{n}" for _, n in matches]
        if any(copied):
            rates = [self._rates(key).rates()[1 : len(tokens) + 1] for tokens, key in zip(copied, keys)]
            rate, width = self._priced_prefix(copied, rates)
            out["lookup"] = (rate, [tokens[:width] for tokens in copied], keys)
        if self.model is not None:
            out["model"] = (self._model_offer(rows), None, ["model"] * rows)
        return out

    def choose(self, offers: dict, rows: int) -> str:
        """The source whose offer earns most ("none": plain decoding earns more), or one passed over for
        explore_every steps that has a draft."""
        source = max(offers, key=lambda name: offers[name][0], default="none")
        if source != "none" and offers[source][0] <= self._rate(0.0, rows, 0):
            source = "none"
        for name in offers:
            if name != source and self._idle[name] >= self.explore_every:
                source = name
                break
        for name in SOURCES:
            self._idle[name] = 0 if name == source else self._idle[name] + 1
        self.chosen[source] += 1
        return source

    def _earned_by_model(self, kept: float, width: float, drafting: float) -> None:
        """A timed step of the model's into what it earned (running means of draft tokens kept per row, the draft's
        width, its drafting seconds). After another source's step the model first caught up on what it skipped:
        those seconds are not what a step of its costs, and are left out."""
        seen = self.model_earned
        if self._previous != "model":
            drafting = seen[2] if seen is not None else 0.0
        step = (kept, width, drafting)
        self.model_earned = step if seen is None else tuple(0.8 * a + 0.2 * b for a, b in zip(seen, step))
        self.model_steps += 1

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        rows = state.batch_size
        offers = self.offers(state, gamma)
        source = self.choose(offers, rows)
        started = perf_counter()
        if source == "model":
            assert self.model is not None
            before = self.model.forward_calls
            draft = self.model.propose(state, gamma)  # its own confidence stop ends it (the length policy's)
            self.forward_calls += self.model.forward_calls - before
        elif source == "none":
            draft = empty_draft(state)
        else:
            drafts = offers[source][1]
            assert drafts is not None
            draft = ragged_draft(drafts, state)
        if source == "suffix":
            self.suffix_predicted += sum(expected_kept(c) for c in self._suffix_chances)
        lengths = draft.lengths.tolist() if draft.lengths is not None else [draft.length] * rows
        keys = offers[source][2] if source != "none" else ["none"] * rows
        self._step = (source, lengths, keys, perf_counter(), perf_counter() - started)
        return draft

    # ---- what was kept ----------------------------------------------------------------------------------------
    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        if self._step is not None:
            source, lengths, keys, proposed, drafting = self._step
            if self._timed:
                self.verify.add(len(lengths) * (1 + max(lengths, default=0)), perf_counter() - proposed)
            if source == "model" and self._timed:
                self._earned_by_model(sum(verdict.accepted) / len(lengths), float(max(lengths, default=0)), drafting)
            if source != "none":
                for key, length, accepted in zip(keys, lengths, verdict.accepted):
                    rates = self._rates(key)
                    for k in range(1, min(length, MAX_POSITIONS) + 1):
                        if k > accepted + 1:
                            break
                        rates.add(k, k <= accepted)
                if source == "suffix":
                    self.suffix_observed += sum(verdict.accepted)
            self._previous = source
        self._step, self._timed = None, True
        self.suffix.commit(state, verdict, scored)
        if self.model is not None:
            self.model.commit(state, verdict, scored)

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.suffix.drop_rows(keep)
        if self.model is not None:
            self.model.drop_rows(keep)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.suffix.join_rows(input_ids, attention_mask)
        if self.model is not None:
            self.model.join_rows(input_ids, attention_mask)
        self._timed = False  # the next pass decodes the joined prompts too (on backends that defer them)

    def forget(self) -> None:
        self.suffix.forget()
