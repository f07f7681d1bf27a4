"""Dataclasses passed between the loop, drafters and verifiers.

Shapes: B batch, N draft length (tree nodes), V vocabulary, H hidden size, n positions of one forward.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .checks import check_sampling
from .errors import DraftVerifyError
from .tree import TreeSpec

if TYPE_CHECKING:
    from .draft_length import StepCosts
    from .processing import Processing


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution p is turned into tokens; the same transform is applied to q.

    temperature 0 means greedy (argmax). top_k 0 and top_p 1.0 disable those filters.
    coupling: sample with position-keyed Gumbel noise shared by drafter and target (sampling.gumbel_noise), so a
    seeded text depends on neither the drafter nor the draft lengths; None = on exactly when a seed is given.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    coupling: bool | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed, self.coupling)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def coupled(self) -> bool:
        """True when sampled tokens come from position-keyed Gumbel noise (never at temperature 0)."""
        if self.greedy:
            return False
        return self.coupling if self.coupling is not None else self.seed is not None


class RowParams:
    """Sampling settings per row of a batch whose rows differ (each row its own temperature / top-k / top-p / seed,
    as vLLM serves requests): every transform runs once per group of rows that share their settings, so a row's
    tokens are exactly what its own settings give alone. One shared setting is a plain SamplingParams instead
    (`sampling.row_params`), so a uniform batch pays nothing for this."""

    def __init__(self, rows: list[SamplingParams]):
        self.rows = list(rows)

    @staticmethod
    def key(p: SamplingParams) -> tuple:
        """What groups rows: everything but the seed, which each row keeps anyway (DecodingState.seeds)."""
        return (p.temperature, p.top_k, p.top_p, p.coupled)

    def groups(self) -> list[tuple[SamplingParams, torch.Tensor]]:
        """(settings, row indices [G]) per group, in the order the groups first appear."""
        found: dict[tuple, tuple[SamplingParams, list[int]]] = {}
        for b, p in enumerate(self.rows):
            found.setdefault(self.key(p), (p, []))[1].append(b)
        return [(p, torch.tensor(rows)) for p, rows in found.values()]

    @property
    def greedy(self) -> bool:
        return all(p.greedy for p in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"RowParams({self.rows!r})"


def left_padded(rows, pad: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids of different lengths (lists or tuples) as one left-padded batch: ids [B, W] (int64, `pad`
    on the left) and the attention mask [B, W] (bool, False at the padding), W the longest row's length (Hugging
    Face's generate takes the mask as mask.long())."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=device)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows], device=device)
    return ids, mask


def append_rows(
    tokens: torch.Tensor, lengths: torch.Tensor, emitted: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
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
    return trim_rows(out, new_lengths)


def trim_rows(tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop leading columns that are padding in every row."""
    width = int(lengths.max())
    return tokens[:, tokens.shape[1] - width :], lengths


class DecodingState:
    """What a drafter may read when proposing: the committed sequence so far.

    tokens [B, L]: committed decoder-side tokens (prompt + generated), left-padded (every row ends in the last
    column); the last one is not yet in the target cache. lengths [B] counts each row's real tokens. source_ids
    [B, S]: the encoder input of an encoder-decoder target, else None. prompt_length: leading entries of `tokens`
    that came from the prompt. params: one SamplingParams, or RowParams for rows with settings of their own.
    generator: the seeded RNG shared by drafter and verifier (None when greedy). seeds [B] key each row's coupled
    sampling noise (None when greedy). draft_confidence: the length policy's confidence stop (DraftLength.confidence):
    a drafter that draws from a model's q ends its draft at the first token whose max q is <= this (that token
    included), each row on its own; 0 = never. costs: the length policy's measured costs of this run (StepCosts:
    seconds of a target call over n tokens) when it chooses the draft length itself (gamma auto, conf), read by a
    drafter that sizes its draft by cost (model_tree); None for a fixed gamma or cap.

    Each step's tokens are appended as host ints (append) and joined to the `tokens` / `lengths` tensors only when
    someone reads them: a drafter that never reads them (the autoregressive baseline, a lookup over last_tokens)
    costs the step no tensor op, which is what a step costs after a llama.cpp forward has cooled the caches.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        source_ids: torch.Tensor | None,
        prompt_length: int,
        params: SamplingParams | RowParams,
        generator: torch.Generator | None,
        lengths: torch.Tensor | None = None,
        seeds: list[int] | None = None,
        draft_confidence: float = 0.0,
        costs: StepCosts | None = None,
    ):
        self.source_ids = source_ids
        self.prompt_length = prompt_length
        self.params = params
        self.generator = generator
        self.seeds = seeds
        self.draft_confidence = draft_confidence
        self.costs = costs
        self._tokens = tokens
        self._batch, self._device = tokens.shape[0], tokens.device  # read every step: kept as Python objects
        # no padding: every row holds all of `tokens`
        self._lengths = (
            lengths
            if lengths is not None
            else torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)
        )
        self._behind: list[list[int]] = []  # per row, the tokens appended since `tokens` was last joined (equal counts)
        self._host: list[list[int]] | None = None  # each row's real tokens as host ints (row_ids), once asked for
        self._empty: Draft | None = None  # a plain step's draft for this batch size (empty_draft)

    @property
    def tokens(self) -> torch.Tensor:
        """[B, L] long (see the class)."""
        self._join()
        return self._tokens

    @tokens.setter
    def tokens(self, value: torch.Tensor) -> None:
        self._join()
        self._tokens = value
        self._batch, self._device = value.shape[0], value.device
        self._host = self._empty = None

    @property
    def lengths(self) -> torch.Tensor:
        """[B] long, each row's real tokens."""
        self._join()
        return self._lengths

    @lengths.setter
    def lengths(self, value: torch.Tensor) -> None:
        self._join()
        self._lengths = value
        self._host = None

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def device(self) -> torch.device:
        return self._device

    def empty_draft(self) -> Draft:
        """No draft tokens [B, 0] (a plain decoding step), made once per batch size and handed out again: nothing a
        step reads of it changes (the loop sets its position and seeds on every draft), and a plain step after a
        llama.cpp forward is cheaper for the objects it does not make."""
        if self._empty is None:
            self._empty = Draft.of_rows([[]] * self._batch, self._device)
        return self._empty

    def append(self, emitted: list[list[int]]) -> None:
        """Each row's new tokens (host ints, one list per row). Equal counts wait as host ints until `tokens` is
        read; different counts are joined now (every row must end in the last column again)."""
        if self._host is not None:
            for held, row in zip(self._host, emitted):
                held.extend(row)
        if len(emitted) == 1 or len({len(row) for row in emitted}) == 1:  # equal counts (one row: no set made)
            if emitted[0]:
                if not self._behind:
                    self._behind = [list(row) for row in emitted]
                else:
                    for waiting, row in zip(self._behind, emitted):
                        waiting.extend(row)
            return
        self._join()
        self._tokens, self._lengths = append_rows(self._tokens, self._lengths, emitted)

    def row_ids(self, b: int) -> list[int]:
        """Row b's real tokens as host ints (the state's own list, kept up to date by append: read it, do not
        change it). A drafter that reads the text as ints (lookups, n-grams) makes no tensor op and no copy."""
        if self._host is None:
            tokens, lengths = self.tokens, self.lengths.tolist()
            width = tokens.shape[1]
            self._host = [row[width - length :] for row, length in zip(tokens.tolist(), lengths)]
        return self._host[b]

    def last_tokens(self) -> list[int]:
        """Each row's last committed token [B] as host ints (the pending one the target scores next)."""
        if self._behind:
            return [row[-1] for row in self._behind]
        return self._tokens[:, -1].tolist()

    def pending_column(self) -> torch.Tensor:
        """Each row's last committed token as a column [B, 1] on the state's device."""
        if self._behind:
            return torch.tensor([[row[-1]] for row in self._behind], dtype=self._tokens.dtype, device=self.device)
        return self._tokens[:, -1:]

    def _join(self) -> None:
        if self._behind:
            behind, self._behind = self._behind, []
            new = torch.tensor(behind, dtype=self._tokens.dtype, device=self._tokens.device)  # [B, k]
            self._tokens = torch.cat([self._tokens, new], dim=1)
            self._lengths = self._lengths + new.shape[1]

    @property
    def padded(self) -> bool:
        """True when some row is shorter than `tokens` (left padding)."""
        return bool((self.lengths < self.tokens.shape[1]).any())

    def row(self, b: int) -> torch.Tensor:
        """Row b's real tokens [L_b] (without the left padding of a batch)."""
        return self.tokens[b, self.tokens.shape[1] - int(self.lengths[b]) :]

    def next_position(self, offset: int = 0) -> torch.Tensor:
        """Decoder index [B] of each row's token `offset` after its last committed one."""
        return self.lengths + offset


@dataclass(frozen=True)
class Logprobs:
    """The log-probabilities a row reports (generate's `logprobs`, RowRequest.logprobs): each emitted token's under
    the target's own distribution at its position (log_softmax of the verify pass's logits, before any logits
    processor, temperature, top-k or top-p: what the target alone gives whatever the method drafts), with the `top`
    most likely tokens there (0: none listed); `prompt`: the prompt's tokens' too, each given the ones before it
    (the first has none), from the prefill."""

    top: int = 0
    prompt: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0:
            raise DraftVerifyError(f"logprobs top must be an integer >= 0, got {self.top!r}")
        if not isinstance(self.prompt, bool):
            raise DraftVerifyError(f"logprobs prompt must be True or False, got {self.prompt!r}")


@dataclass(frozen=True)
class TokenLogprob:
    """One position's: the token there, its log-probability, and the most likely tokens there with theirs (most
    likely first; as many as Logprobs.top asked)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RowLogprobs:
    """A row's log-probabilities: its emitted tokens' (in order) and, when asked, its prompt's from the second
    token on (None: not asked)."""

    tokens: list[TokenLogprob] = field(default_factory=list)
    prompt: list[TokenLogprob] | None = None


@dataclass
class RowRequest:
    """A row that joins a running batch (generate's admit returns a list of them); it takes the next row index.

    prompt_ids: its prompt token ids (at least one); max_new_tokens: its own limit; seed: keys its coupled sampling
    noise (None: a fresh one); first_token_allowed: the token ids its first new token may be (token healing), or
    None; params: its own SamplingParams, or None for the batch's first row's; logprobs: what log-probabilities
    it reports (Logprobs), or None; processing: its logits processing (processing.Processing: penalties, logit
    bias, min_tokens, stop tokens, structured output), or None."""

    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None = None
    first_token_allowed: torch.Tensor | list[int] | None = None
    params: SamplingParams | None = None
    logprobs: Logprobs | None = None
    processing: Processing | None = None

    def __post_init__(self) -> None:
        ids = self.prompt_ids
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist() if not ids.is_floating_point() else ids
        try:
            if isinstance(ids, (str, bytes, torch.Tensor)) or any(isinstance(t, bool) for t in ids):
                raise TypeError
            self.prompt_ids = [operator.index(t) for t in ids]
        except TypeError:
            raise DraftVerifyError(
                f"a joining row's prompt_ids must be a list of token ids (ints), got {self.prompt_ids!r}"
            ) from None
        if not self.prompt_ids:
            raise DraftVerifyError("a joining row needs at least one prompt token")
        limit = self.max_new_tokens
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise DraftVerifyError(f"max_new_tokens must be an integer >= 1, got {limit!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise DraftVerifyError(f"a joining row's seed must be an integer or None, got {self.seed!r}")
        if self.params is not None and not isinstance(self.params, SamplingParams):
            raise DraftVerifyError(
                f"a joining row's params must be a SamplingParams or None, got {type(self.params).__name__}"
            )
        if self.logprobs is not None and not isinstance(self.logprobs, Logprobs):
            raise DraftVerifyError(
                f"a joining row's logprobs must be a Logprobs or None, got {type(self.logprobs).__name__}"
            )


@dataclass
class TargetOutput:
    """What one model forward returns: next-token logits and, only when asked for, the last hidden state."""

    logits: torch.Tensor  # [B, n, V]
    hidden: torch.Tensor | None = None  # [B, n, H] last layer's hidden state (after the final norm)


@dataclass
class Draft:
    """Proposed continuation: a chain (tree None) or a token tree whose topology is `tree`.

    q_probs None means a deterministic proposal (q is one-hot at each token). For a tree, q_probs[:, j] is the
    distribution node j was drawn from (conditioned on its parent). lengths None means every row uses all N.

    A draft made from host ints (of_rows) makes its `tokens` tensor only when something reads it: a chain verified
    on the host (a llama.cpp target) never does, and a tensor made right after a llama.cpp forward costs the step
    what the forward left cold (torch's code and objects), many times its own work.
    """

    tokens: torch.Tensor  # [B, N] long; node j of the tree, or position j of the chain
    q_probs: torch.Tensor | None = None  # [B, N, V] drafter probabilities the tokens were drawn from
    tree: TreeSpec | None = None  # None = chain (node j's parent is node j-1)
    lengths: torch.Tensor | None = None  # [B] long, valid draft tokens per row (ragged batches)
    valid: torch.Tensor | None = None  # [B, N] bool, a tree's nodes each row proposes (tree.row_trees); None: all
    position: int | torch.Tensor | None = None  # decoder index of tokens[:, 0] ([B] in a batch; set by the loop)
    seeds: list[int] | None = None  # per-row coupled-noise seeds of a batch (set by the loop)
    # the step's logits processing of target logits at given verify positions (set by the loop when rows have
    # processors; engine/processors.py): what a verdict that scores positions again (llama.cpp's settling) applies
    process: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = field(default=None, repr=False, compare=False)
    _rows: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)
    # what the `tokens` property (below the class) keeps, and what of_rows / __post_init__ set: not set by __init__
    _tokens: Any = field(init=False, repr=False, compare=False)  # the tensor, or _PENDING until first read
    _length: int = field(init=False, repr=False, compare=False)
    _device: torch.device = field(init=False, repr=False, compare=False)

    @classmethod
    def of_rows(cls, rows: list[list[int]], device: torch.device | None = None) -> Draft:
        """A chain per row from host ints [B][n_b], padded with 0 to the longest; lengths [B] when they differ.
        Its tokens tensor is made on `device` when first read."""
        if len(rows) == 1:  # one row: nothing to pad
            padded, longest, ragged = [list(rows[0])], len(rows[0]), False
        else:
            longest = max(len(r) for r in rows)
            padded = [r + [0] * (longest - len(r)) if len(r) < longest else list(r) for r in rows]
            ragged = any(len(r) < longest for r in rows)
        draft = cls(
            tokens=_PENDING,
            lengths=torch.tensor([len(r) for r in rows], device=device) if ragged else None,
        )
        draft._rows, draft._length, draft._device = padded, longest, device or torch.device("cpu")
        return draft

    @property
    def rows(self) -> list[list[int]]:
        """tokens as Python ints [B][N], read off once (the step's verify pass and a host verdict both read it)."""
        if self._rows is None:
            self._rows = self.tokens.tolist()
        return self._rows

    def __post_init__(self) -> None:
        if self._tokens is _PENDING:  # of_rows sets the length and device
            return
        self._length = self._tokens.shape[1]
        if self.tree is not None and self.tree.size != self._length:
            raise DraftVerifyError(f"a tree of {self.tree.size} nodes cannot carry {self._length} draft tokens")

    @property
    def length(self) -> int:
        return self._length

    @property
    def device(self) -> torch.device:
        """Where the tokens tensor is (or will be made)."""
        return self._device if self._tokens is _PENDING else self._tokens.device

    @property
    def depth(self) -> int:
        """Most draft tokens one step can accept: N for a chain, the deepest path for a tree."""
        return self.tree.max_depth if self.tree is not None else self.length

    def row_depths(self, rows: int) -> list[int]:
        """Most draft tokens each of `rows` rows can accept: its own length (ragged chains), the deepest node it
        proposes (a batch's trees on one shape, `valid`), else the draft's depth."""
        if self.lengths is not None:
            return self.lengths.tolist()
        if self.tree is not None and self.valid is not None:
            depth = self.tree.depth.to(self.valid.device)  # [N]
            return (self.valid.long() * depth[None]).amax(dim=1).tolist()
        return [self.depth] * rows


_PENDING: Any = object()  # Draft.tokens not made yet (of_rows): made from the rows when first read


def _draft_tokens(draft: Draft) -> torch.Tensor:
    if draft._tokens is _PENDING:
        rows = draft._rows or []
        draft._tokens = torch.tensor(rows, dtype=torch.long, device=draft._device).reshape(len(rows), draft._length)
    return draft._tokens


def _set_draft_tokens(draft: Draft, value: torch.Tensor) -> None:
    draft._tokens = value


# `tokens` is the dataclass's first field (its __init__, replace, repr and eq read and write it through this
# property), stored as _tokens: made from the rows on first read where of_rows gave host ints only
Draft.tokens = property(_draft_tokens, _set_draft_tokens, doc="[B, N] long draft tokens")  # type: ignore[assignment]


PrefixKV = tuple  # tuple over layers of (keys, values), each [KV heads, P, head dim]


class Verdict:
    """Outcome of verification. tokens holds accepted drafts then one target token, padded with -1.

    path names the kept draft nodes in order (for a chain: 0, 1, ..., num_accepted - 1), so caches can keep a
    tree's accepted branch; make_verdict fills it for chains, so chain verifiers never deal with it.

    A verdict is read both as tensors (drafters, tree caches) and as Python lists (the loop: what each row emits
    and how many drafts it kept). Each form is made from the other on first use, once: a verifier that judged on
    the host (a greedy chain on the CPU) gives lists and no tensor is made unless someone reads one; a verifier that
    judged in tensors gives tensors, and the loop's first read of the lists is the step's one host sync.

    target_s: seconds of target forwards that verifying ran itself (a backend's verifier wrapper that scored the
    kept branch again: backends/llamacpp_settle.py), counted as target time and one more target call; None when
    verifying ran none (the rule only read the step's logits).
    """

    __slots__ = ("_tokens", "_num_accepted", "_path", "_rows", "_accepted", "_device", "target_s")

    def __init__(
        self,
        tokens: torch.Tensor | None = None,
        num_accepted: torch.Tensor | None = None,
        path: torch.Tensor | None = None,
    ):
        if tokens is None or num_accepted is None or path is None:
            raise DraftVerifyError("a Verdict needs tokens, num_accepted and path (or Verdict.of_chain's lists)")
        self._tokens: torch.Tensor | None = tokens
        self._num_accepted: torch.Tensor | None = num_accepted
        self._path: torch.Tensor | None = path
        self._rows: list[list[int]] | None = None
        self._accepted: list[int] | None = None
        self._device = tokens.device
        self.target_s: float | None = None

    @classmethod
    def of_chain(cls, rows: list[list[int]], accepted: list[int], device: torch.device | None = None) -> Verdict:
        """A chain's verdict from host lists: rows [B][N+1] (each row's accepted drafts, its next token, then -1)
        and accepted [B] (draft tokens each row kept); its tensors are made on first read, on `device`."""
        verdict = cls.__new__(cls)
        verdict._tokens = verdict._num_accepted = verdict._path = None
        verdict._rows, verdict._accepted = rows, accepted
        verdict._device = device if device is not None else torch.device("cpu")
        verdict.target_s = None
        return verdict

    @property
    def tokens(self) -> torch.Tensor:  # [B, N+1] long, -1 padded
        if self._tokens is None:
            self._tokens = torch.tensor(self._rows, dtype=torch.long, device=self._device)
        return self._tokens

    @property
    def num_accepted(self) -> torch.Tensor:  # [B] long, draft tokens kept (0..N); emitted tokens = num_accepted + 1
        if self._num_accepted is None:
            self._num_accepted = torch.tensor(self._accepted, dtype=torch.long, device=self._device)
        return self._num_accepted

    @property
    def path(self) -> torch.Tensor:  # [B, N] long, kept draft node indices in order, -1 padded
        if self._path is None:  # a chain (of_chain): nodes 0..accepted-1
            rows, accepted = self.rows, self.accepted
            width = len(rows[0]) - 1 if rows else 0
            self._path = torch.tensor(
                [list(range(a)) + [-1] * (width - a) for a in accepted], dtype=torch.long, device=self._device
            ).reshape(len(accepted), width)
        return self._path

    @property
    def rows(self) -> list[list[int]]:
        """tokens as lists [B][N+1] (-1 padded)."""
        if self._rows is None:
            self._rows = self.tokens.tolist()
        return self._rows

    @property
    def accepted(self) -> list[int]:
        """num_accepted as a list [B]."""
        if self._accepted is None:
            self._accepted = self.num_accepted.tolist()
        return self._accepted

    def __repr__(self) -> str:
        return f"Verdict(rows={self.rows}, accepted={self.accepted})"


@dataclass
class GenerationStats:
    """Counters and timers the loop fills. Times are seconds of wall clock."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_calls: int = 0  # target forwards after prefill (one per step; two where verifying re-scored a branch)
    draft_calls: int = 0  # drafter model forwards (0 for model-free drafters)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # steps that stopped at a rejected draft token
    gammas: list[int] = field(default_factory=list)  # each step's draft length
    chosen_gammas: list[int] = field(default_factory=list)  # each step's gamma from the length policy (0: no draft)
    time_prefill: float = 0.0
    # steps whose time is in time_prefill: the first step of a backend that decodes the prompt with its first forward
    # (backends/base.py defers_prefill); time_draft and time_target cover the other target_calls - prefill_steps
    # steps and draft_calls - prefill_draft_calls draft forwards
    prefill_steps: int = 0
    prefill_draft_calls: int = 0
    time_draft: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    # part of time_draft: moving text between the draft's tokenizer and the target's (cross_tokenizer drafter);
    # filled from the drafter's timers() by Pipeline and the bench (drafters.base.add_drafter_times)
    time_retokenize: float = 0.0

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_target - self.time_verify)

    @property
    def tokens_per_call(self) -> float:
        """Mean tokens emitted per target call (accepted drafts + the target's own token)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance rate: MLE of the capped-geometric success probability (Leviathan eq. 1).

        Draft tokens after a rejection are never judged, so accepted / drafted would underestimate alpha;
        accepted / (accepted + rejections) counts only the tokens the verifier actually judged.
        """
        judged = self.accepted_tokens + self.rejections
        return self.accepted_tokens / judged if judged else 0.0

    @property
    def mean_chosen_gamma(self) -> float:
        return sum(self.chosen_gammas) / len(self.chosen_gammas) if self.chosen_gammas else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    @property
    def loop_overhead_fraction(self) -> float:
        """Share of wall time spent outside model forwards (verification rule + bookkeeping)."""
        if self.time_total <= 0:
            return 0.0
        return (self.time_verify + self.time_other) / self.time_total

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "tokens_per_call": self.tokens_per_call,
            "alpha": self.alpha,
            "time_prefill": self.time_prefill,
            "prefill_steps": self.prefill_steps,
            "prefill_draft_calls": self.prefill_draft_calls,
            "time_draft": self.time_draft,
            "time_target": self.time_target,
            "time_verify": self.time_verify,
            "time_retokenize": self.time_retokenize,
            "time_other": self.time_other,
            "time_total": self.time_total,
            "tokens_per_second": self.tokens_per_second,
            "loop_overhead_fraction": self.loop_overhead_fraction,
            "mean_gamma": sum(self.gammas) / len(self.gammas) if self.gammas else 0.0,
            "mean_chosen_gamma": self.mean_chosen_gamma,
        }


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [B, L_prompt + new] prompt followed by generated tokens (decoder side)
    new_tokens: torch.Tensor  # [B, new]; a batch of rows pads the shorter ones on the right with -1
    stats: GenerationStats  # a batch's stats add up its rows (target_calls counts shared steps once)
    rows: list[list[int]] | None = None  # a batch's new tokens per row, without padding (None for one row)
    logprobs: list[RowLogprobs | None] | None = None  # per row, those it asked for (generate's logprobs); else None
