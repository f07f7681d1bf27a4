"""Build the n-gram drafter's table (:class:`draftverify.drafters.ngram.NgramTable`) from token data.

Sources: the corpus training split (manifest + tokenizer, tokenized like ``train lm`` does: one sequence per
file, eos-terminated) or a JSONL of target generations written by ``draftverify train align`` (only the n-grams
whose predicted token is in a continuation are counted: the table then models the target's own outputs).

Counting is vectorised: every n-gram (context of k tokens + next token) is packed into one int64 key
(``bits`` per token), ``np.unique(keys, return_counts=True)`` counts them, and since the keys sort by context
first, each context's next tokens are a contiguous run. ~8.5M tokens at order 3 take seconds, not minutes.

Pruning, for shipping: contexts (k >= 1) seen fewer than ``min_count`` times are dropped (the drafter backs off
to the longest seen suffix, exactly as for unseen contexts) and each kept context keeps its ``top_k`` most
frequent next tokens (original counts; ties -> smaller token id). The empty context (the unigram) is never
pruned, so every context, seen or not, has a distribution to back off to. Kept contexts are closed under
taking suffixes (a context's count is at most its suffix's), so the backoff chain has no holes.

The file is written by ``NgramTable.save`` (per context length k: ``ctx{k}``, ``offsets{k}``, ``tokens{k}``,
``counts{k}``; metadata ``order`` / ``vocab_size``) plus provenance metadata.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from ..options.declare import option
from .settings import TrainError
from .shared_flags import OWN_DATA, recipe_options, shared


@dataclass
class Level:
    """All kept contexts of one length k, sorted by packed key."""

    k: int
    keys: np.ndarray  # [M] int64 packed contexts (sorted)
    contexts: np.ndarray  # [M, k] int32
    offsets: np.ndarray  # [M+1] int64; next tokens of context m are tokens[offsets[m]:offsets[m+1]]
    tokens: np.ndarray  # [E] int32, per context by count descending then id ascending
    counts: np.ndarray  # [E] float32
    dropped_contexts: int = 0  # contexts pruned by min_count
    dropped_entries: int = 0  # (context, next token) pairs pruned by min_count or top_k

    @property
    def best(self) -> np.ndarray:
        """[M] the most frequent next token of each context (what the greedy drafter proposes)."""
        return self.tokens[self.offsets[:-1]]


@dataclass
class NgramCounts:
    order: int
    vocab_size: int
    bits: int
    levels: dict[int, Level]
    tokens_counted: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def n_contexts(self) -> int:
        return sum(len(lv.keys) for lv in self.levels.values())

    @property
    def n_entries(self) -> int:
        return sum(len(lv.tokens) for lv in self.levels.values())

    def to_table(self):
        """The drafter's NgramTable over the same arrays."""
        from ..drafters.ngram import NgramTable

        arrays = {k: (lv.contexts, lv.offsets, lv.tokens, lv.counts) for k, lv in self.levels.items()}
        return NgramTable.from_arrays(self.order, self.vocab_size, arrays)

    def save(self, path: str | os.PathLike, metadata: Optional[dict] = None) -> int:
        """Write the NgramTable safetensors file (plus provenance metadata); returns the file size in bytes."""
        meta = {
            str(key): value if isinstance(value, str) else json.dumps(value)
            for key, value in {**self.meta, **(metadata or {})}.items()
        }
        return self.to_table().save(path, metadata=meta)

    def predict(self, tokens: np.ndarray, seg_start: np.ndarray) -> np.ndarray:
        """Greedy next-token prediction at every position i from tokens[seg_start[i]:i], longest seen suffix first
        (the NgramDrafter's backoff): [N] int64."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pred = np.full(n, int(self.levels[0].best[0]), dtype=np.int64)
        pos = np.arange(n, dtype=np.int64)
        for k in range(1, self.order):
            lv = self.levels.get(k)
            if lv is None or len(lv.keys) == 0 or n <= k:
                continue
            # context of position i (i >= k): tokens[i-k:i]
            key = tokens[0 : n - k].copy()
            for j in range(1, k):
                key = (key << self.bits) | tokens[j : n - k + j]
            ok = seg_start[k:] <= pos[: n - k]  # the context stays inside the sequence
            idx = np.searchsorted(lv.keys, key)
            idx_c = np.minimum(idx, len(lv.keys) - 1)
            found = ok & (lv.keys[idx_c] == key)
            pred[k:][found] = lv.best[idx_c[found]]
        return pred

    def accuracy(
        self, tokens: np.ndarray, seg_start: np.ndarray, mask: Optional[np.ndarray] = None
    ) -> tuple[float, int]:
        """Top-1 next-token accuracy (and the number of positions judged) over the positions in mask."""
        pred = self.predict(tokens, seg_start)
        hit = pred == np.asarray(tokens, dtype=np.int64)
        if mask is not None:
            hit = hit[mask]
        return (float(hit.mean()) if len(hit) else 0.0), int(len(hit))


# --------------------------------------------------------------------------- counting


def key_bits(vocab_size: int) -> int:
    return max(1, int(vocab_size - 1).bit_length())


def segment_starts(lengths: Iterable[int]) -> tuple[np.ndarray, int]:
    """Per-position start index of its sequence, for sequences of the given lengths laid end to end."""
    lengths = np.asarray(list(lengths), dtype=np.int64)
    total = int(lengths.sum())
    seg = np.zeros(total, dtype=np.int64)
    if total:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        starts = starts[lengths > 0]
        seg[starts] = starts
        seg = np.maximum.accumulate(seg)
    return seg, total


def eos_segments(flat: np.ndarray, eos_id: int) -> np.ndarray:
    """Segment starts for an eos-terminated document stream (a new sequence begins after every eos)."""
    n = len(flat)
    seg = np.zeros(n, dtype=np.int64)
    after = np.flatnonzero(np.asarray(flat) == eos_id) + 1
    after = after[after < n]
    seg[after] = after
    return np.maximum.accumulate(seg) if n else seg


def count_ngrams(
    tokens: np.ndarray,
    seg_start: np.ndarray,
    order: int,
    vocab_size: int,
    *,
    min_count: int = 2,
    top_k: int = 8,
    mask: Optional[np.ndarray] = None,
) -> NgramCounts:
    """Count next tokens for contexts of length 0..order-1 that stay inside their sequence, then prune.

    tokens [N] ids; seg_start [N] start index of each position's sequence; mask [N] bool: count only the
    n-grams whose predicted token is at a masked position (None = all).
    """
    if order < 2:
        raise TrainError(f"n-gram order must be >= 2 (bigram and up), got {order}")
    if min_count < 1:
        raise TrainError(f"--min-count must be >= 1, got {min_count}")
    if top_k < 1:
        raise TrainError(f"--top-k must be >= 1, got {top_k}")
    bits = key_bits(vocab_size)
    if order * bits > 62:
        raise TrainError(
            f"order {order} with a vocabulary of {vocab_size} needs {order * bits} bits per n-gram key; "
            "at most 62 fit in int64: lower --order"
        )
    tokens = np.asarray(tokens).astype(np.int64, copy=False)
    n = len(tokens)
    if n and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = int(tokens.max()) if tokens.max() >= vocab_size else int(tokens.min())
        raise TrainError(f"token id {bad} is outside the vocabulary of size {vocab_size}")
    seg_start = np.asarray(seg_start, dtype=np.int64)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
    counted = int(mask.sum()) if mask is not None else n
    if counted == 0:
        raise TrainError("no tokens to count: the n-gram table would be empty")
    pos = np.arange(n, dtype=np.int64)
    low = np.int64((1 << bits) - 1)
    levels: dict[int, Level] = {}
    for k in range(order):
        if n <= k:
            break
        # n-gram ending at position i = k..n-1: tokens[i-k..i]
        key = tokens[0 : n - k].copy()
        for j in range(1, k + 1):
            key <<= bits
            key |= tokens[j : n - k + j]
        ok = seg_start[k:] <= pos[: n - k]
        if mask is not None:
            ok &= mask[k:]
        key = key[ok]
        if len(key) == 0:
            continue
        uniq, cnt = np.unique(key, return_counts=True)
        del key
        ctx = uniq >> bits
        nxt = (uniq & low).astype(np.int32)
        change = np.empty(len(ctx), dtype=bool)
        change[0] = True
        np.not_equal(ctx[1:], ctx[:-1], out=change[1:])
        gstart = np.flatnonzero(change)
        gidx = np.cumsum(change) - 1
        totals = np.add.reduceat(cnt, gstart)
        keep_ctx = totals >= (min_count if k > 0 else 1)
        # rank within the context: count descending, then token id ascending
        by = np.lexsort((nxt, -cnt, gidx))
        rank = np.empty(len(by), dtype=np.int64)
        rank[by] = np.arange(len(by)) - gstart[gidx[by]]
        keep = keep_ctx[gidx]
        if k > 0:
            keep &= rank < top_k
        sel = by[keep[by]]  # entries kept, grouped by context, best first
        g_kept = gidx[sel]
        ctx_ids = np.flatnonzero(keep_ctx)
        sizes = np.bincount(g_kept, minlength=len(gstart))[ctx_ids]
        keys_k = ctx[gstart[ctx_ids]]
        contexts = np.empty((len(keys_k), k), dtype=np.int32)
        for j in range(k):
            contexts[:, j] = (keys_k >> (bits * (k - 1 - j))) & low
        levels[k] = Level(
            k=k,
            keys=keys_k,
            contexts=contexts,
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            tokens=nxt[sel],
            counts=cnt[sel].astype(np.float32),
            dropped_contexts=int(len(gstart) - len(ctx_ids)),
            dropped_entries=int(len(uniq) - len(sel)),
        )
    if 0 not in levels:
        raise TrainError("no tokens to count: the n-gram table would be empty")
    return NgramCounts(order=order, vocab_size=vocab_size, bits=bits, levels=levels, tokens_counted=counted)


def count_sequences(
    sequences: Iterable[Iterable[int]],
    order: int,
    vocab_size: int,
    *,
    min_count: int = 2,
    top_k: int = 8,
    predict_from: Optional[Iterable[int]] = None,
) -> NgramCounts:
    """count_ngrams over a list of sequences; predict_from[s] = first position of sequence s whose token is
    counted as a next token (e.g. the prompt length for prompt + continuation records)."""
    seqs = [np.asarray(list(s), dtype=np.int64) for s in sequences]
    seg, total = segment_starts(len(s) for s in seqs)
    flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
    mask = None
    if predict_from is not None:
        mask = np.zeros(total, dtype=bool)
        off = 0
        for s, p in zip(seqs, predict_from):
            mask[off + min(p, len(s)) : off + len(s)] = True
            off += len(s)
    return count_ngrams(flat, seg, order, vocab_size, min_count=min_count, top_k=top_k, mask=mask)


# --------------------------------------------------------------------------- sources


def corpus_tokens(
    manifest, tokenizer_dir: str, split: str, cache_dir: Optional[str] = None, log: Callable[[str], None] = print
):
    """(flat eos-terminated token array of a split, tokenizer): the token cache of ``train lm`` when
    cache_dir is given (shared with the LM runs), else tokenized in memory the same way."""
    from . import corpus as corpus_mod
    from .tokenizer import load_tokenizer
    from .tokens import as_train_errors, load_token_cache, tokenize_split

    with as_train_errors():
        tok = load_tokenizer(tokenizer_dir)
        m = corpus_mod.load_manifest(manifest)
        if cache_dir is not None:
            return load_token_cache(m, str(tokenizer_dir), tok, str(cache_dir), log=log)[split], tok
        return tokenize_split(m, tok, split, tok.eos_token_id), tok


def generation_sequences(path: str | os.PathLike) -> tuple[dict, list[list[int]], list[int]]:
    """(header, prompt + continuation sequences, prompt lengths) from a ``train align`` generations JSONL."""
    from .align import read_generations

    header, records = read_generations(path)
    if not records:
        raise TrainError(f"{path} holds no generations")
    seqs = [r["prompt"] + r["continuation"] for r in records]
    return header, seqs, [len(r["prompt"]) for r in records]


# --------------------------------------------------------------------------- the command


@recipe_options
class NgramOptions:
    """`train ngram`'s options, each its flag."""

    out: str = option("zoo/code/ngram.safetensors", "--out", "Output table (safetensors).")
    tokenizer: str = shared("zoo/code/tokenizer", "Tokenizer directory.")
    manifest: str = shared("zoo/code/manifest.json")
    data: Optional[str] = shared(None, OWN_DATA)  # read as the manifest (the command does)
    from_generations: Optional[str] = option(
        None,
        "--from-generations",
        "Build from a JSONL of target generations (written by `train align`) instead of the corpus; only "
        "continuation tokens are counted as next tokens.",
    )
    eval_generations: Optional[str] = option(
        None,
        "--eval-generations",
        "Also report top-1 accuracy on the continuations of this generations JSONL (e.g. runs/align/"
        "eval_before.jsonl: held-out target outputs).",
    )
    order: int = option(3, "--order", "n: contexts of up to n-1 tokens.")
    min_count: int = option(2, "--min-count", "Drop contexts seen fewer times (the unigram is kept).")
    top_k: int = option(8, "--top-k", "Keep at most this many next tokens per context.")
    cache_dir: Optional[str] = shared(
        None, "Reuse/write `train lm`'s token cache here (e.g. runs/token-cache); default: tokenize in memory."
    )
    # only the first N training tokens (quick checks, speed measurements)
    max_tokens: Optional[int] = shared(None, "Use only the first N training tokens.")
    vocab_size: Optional[int] = option(
        None, "--vocab-size", "Table vocabulary (default: the tokenizer's, or the generations file's)."
    )
    evaluate: bool = option(True, "--eval/--no-eval", "Held-out top-1 accuracy on the val split.")
    command: Optional[str] = None


def build(opts: NgramOptions, log: Callable[[str], None] = print) -> dict:
    """Build, prune, save and evaluate a table. Returns a summary dict."""
    if opts.order < 2:
        raise TrainError(f"--order must be >= 2, got {opts.order}")
    if opts.max_tokens is not None and opts.max_tokens < 1:
        raise TrainError("--max-tokens must be positive")
    t0 = time.perf_counter()
    tok = None
    summary: dict = {"order": opts.order, "min_count": opts.min_count, "top_k": opts.top_k}
    corpus_ok = Path(opts.manifest).exists() and (Path(opts.tokenizer) / "tokenizer.json").is_file()
    if opts.from_generations:
        if not Path(opts.from_generations).is_file():
            raise TrainError(
                f"--from-generations {opts.from_generations} not found (write it with `draftverify train align`)"
            )
        header, seqs, prompt_lens = generation_sequences(opts.from_generations)
        vocab = opts.vocab_size or header.get("vocab_size")
        if vocab is None:
            raise TrainError(f"{opts.from_generations} does not record a vocab_size; pass --vocab-size")
        seg, total = segment_starts(len(s) for s in seqs)
        flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        mask = np.zeros(total, dtype=bool)
        off = 0
        for s, p in zip(seqs, prompt_lens):
            mask[off + p : off + len(s)] = True
            off += len(s)
        if opts.max_tokens is not None:
            flat, seg, mask = flat[: opts.max_tokens], seg[: opts.max_tokens], mask[: opts.max_tokens]
        source = f"target generations {opts.from_generations} ({len(seqs)} records, continuation tokens only)"
        summary["source"] = {
            "generations": str(opts.from_generations),
            "records": len(seqs),
            "target": header.get("target"),
        }
    else:
        if not Path(opts.manifest).exists():
            raise TrainError(f"manifest {opts.manifest} not found (run `draftverify train tokenizer` first)")
        flat, tok = corpus_tokens(opts.manifest, opts.tokenizer, "train", opts.cache_dir, log=log)
        if opts.max_tokens is not None:
            flat = flat[: opts.max_tokens]
        flat = np.asarray(flat, dtype=np.int64)
        seg = eos_segments(flat, tok.eos_token_id)
        mask = None
        vocab = opts.vocab_size or len(tok)
        source = f"corpus train split {opts.manifest} (one sequence per file, eos-terminated)"
        summary["source"] = {"manifest": str(opts.manifest), "tokenizer": str(opts.tokenizer), "split": "train"}
    t_data = time.perf_counter() - t0
    t1 = time.perf_counter()
    counts = count_ngrams(flat, seg, opts.order, int(vocab), min_count=opts.min_count, top_k=opts.top_k, mask=mask)
    t_count = time.perf_counter() - t1
    summary.update(
        {
            "vocab_size": int(vocab),
            "tokens": int(counts.tokens_counted),
            "contexts": counts.n_contexts,
            "entries": counts.n_entries,
            "per_length": {
                k: {
                    "contexts": len(lv.keys),
                    "entries": len(lv.tokens),
                    "pruned_contexts": lv.dropped_contexts,
                    "pruned_entries": lv.dropped_entries,
                }
                for k, lv in counts.levels.items()
            },
            "seconds_data": round(t_data, 3),
            "seconds_count": round(t_count, 3),
        }
    )
    log(f"source: {source}")
    log(
        f"counted {counts.tokens_counted:,} tokens in {t_count:.1f}s (data {t_data:.1f}s): "
        f"{counts.n_contexts:,} contexts, {counts.n_entries:,} (context, next token) entries"
    )
    for k, lv in counts.levels.items():
        log(
            f"  context length {k}: {len(lv.keys):,} contexts ({lv.dropped_contexts:,} pruned below "
            f"min-count {opts.min_count if k else 1}), {len(lv.tokens):,} entries ({lv.dropped_entries:,} pruned)"
        )

    # held-out quality: top-1 next-token accuracy of the greedy drafter's prediction
    if opts.evaluate and corpus_ok:
        val, vtok = corpus_tokens(opts.manifest, opts.tokenizer, "val", opts.cache_dir, log=log)
        val = np.asarray(val, dtype=np.int64)
        if len(val) and int(val.max()) < counts.vocab_size:
            acc, n_val = counts.accuracy(val, eos_segments(val, vtok.eos_token_id))
            summary["val_top1_accuracy"], summary["val_tokens"] = acc, n_val
            log(f"held-out next-token top-1 accuracy on the validation split: {acc:.4f} ({n_val:,} tokens)")
    elif opts.evaluate:
        log(f"no held-out accuracy: manifest {opts.manifest} or tokenizer {opts.tokenizer} not found")
    if opts.eval_generations:
        _, eseqs, eplens = generation_sequences(opts.eval_generations)
        eseg, etotal = segment_starts(len(s) for s in eseqs)
        emask = np.zeros(etotal, dtype=bool)
        off = 0
        for s, p in zip(eseqs, eplens):
            emask[off + p : off + len(s)] = True
            off += len(s)
        acc, n_eval = counts.accuracy(np.concatenate([np.asarray(s, dtype=np.int64) for s in eseqs]), eseg, emask)
        summary["generations_top1_accuracy"], summary["generations_tokens"] = acc, n_eval
        log(f"top-1 accuracy on the target's continuations in {opts.eval_generations}: {acc:.4f} ({n_eval:,} tokens)")

    meta = {
        "source": summary["source"],
        "min_count": opts.min_count,
        "top_k": opts.top_k,
        "tokens": counts.tokens_counted,
        "builder": "draftverify train ngram",
    }
    if "val_top1_accuracy" in summary:
        meta["val_top1_accuracy"] = round(summary["val_top1_accuracy"], 5)
    if opts.command:
        meta["command"] = opts.command
    size = counts.save(opts.out, metadata=meta)
    summary["out"] = str(opts.out)
    summary["bytes"] = size
    summary["seconds_total"] = round(time.perf_counter() - t0, 3)
    log(
        f"wrote {opts.out}: {size / 1e6:.2f} MB ({counts.n_contexts:,} contexts) in {summary['seconds_total']:.1f}s "
        "total"
    )
    return summary
