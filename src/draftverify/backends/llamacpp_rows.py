"""LlamaCppLM's rows: several sequences on one llama.cpp context (batches, continuous batching, ragged acceptance).

Row b lives in its own sequence id with its own positions (0, 1, ... its length), so a row needs no padding: a
forward puts every row's real new tokens into ONE `llama_decode` (chunks of BATCH only when they do not fit), a
padded slot is simply left out of the batch and its logits come back as zeros. Rolling a row back is
`llama_memory_seq_rm(seq, kept_end, -1)`; a row that leaves has its sequence's cells removed and its id is free for
a row that joins. Each row's prompt is deferred as one row's is (all but its last token) and decoded with the
first forward that follows, every row's together. Rows run on KV streams (kv_unified off, as llama-server's
--parallel slots): sequence s in stream s, each stream n_ctx / n_seq_max cells, so a row's queries attend to its own
cells only (on one unified cache every query attends over every row's cells, masked, which costs as much as the
matmuls at 8 rows of a few hundred positions). A batch still mixes every row's tokens (llama.cpp splits it into
micro-batches of consecutive sequence ids with equal token counts: entries go in sequence order). The context is
made again (`_make_room` / `_grow`, the held sequences copied across with llama_state_seq_get_data / set_data, the
state's stream count rewritten) when rows start on a one-row context, when more rows join than it has streams
(twice the streams) and when a row outgrows its stream (twice the cells); one row stays on the streams (sequence 0
in stream 0) until it scores a token tree or outgrows stream 0, then goes back to one unified cache. A
sliding-window or recurrent model (whose state has several caches' parts) or a given n_ctx keeps its rows on the
unified cache, which grows when their positions together outgrow it. Rows score chains only: a token tree is one
row's (mixed into LlamaCppLM; one-row mode is `seqs` None).
"""

from __future__ import annotations

import ctypes
from time import perf_counter

import torch

from ..errors import DraftVerifyError
from ..types import TargetOutput
from .base import host_ints, kept_positions, one_row
from .llamacpp_ubatches import filled_counts, micro_batches

BATCH = 512  # tokens per llama_decode (more are decoded in chunks)
ROW_ROOM = 256  # cells a row's stream holds beyond its positions when rows mode starts (the drafts' tails)


class LlamaCppRows:
    """The protocol's row calls for LlamaCppLM, in one-row mode (sequence 0, the class's own bookkeeping) and in
    rows mode (start() with several rows or a padding mask, or a row joining)."""

    # rows mode: row b's sequence id, the positions it holds (tail included), the ones settled, its prompt tokens
    # not decoded yet (the last ones of its settled positions), its prefilled logits [V] (None: none yet) and the
    # logits of its prompt's positions when kept (prompt_logits: a list of parts [k, V] until taken; None: not kept)
    seqs: list[int] | None = None
    held: list[int]
    settled: list[int]
    row_deferred: list[list[int]]
    row_prefilled: list[torch.Tensor | None]
    row_prompt_logits: list[list[torch.Tensor] | None]
    prompt_parts: list[torch.Tensor] | None  # one-row mode's (LlamaCppLM)

    # ---- entering rows mode -----------------------------------------------------------------------------------
    def _start_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, prompt_logits: bool = False
    ) -> torch.Tensor:
        """Reset to the left-padded rows input_ids [B, L] (attention_mask [B, L] False at the padding); every
        row's prompt but its last token is deferred to the next forward (which keeps the logits of every prompt
        position with prompt_logits)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if attention_mask.shape != input_ids.shape or not bool(attention_mask[:, -1].all()):
            raise DraftVerifyError(
                "a batch's attention mask must match input_ids [B, L] and pad on the left "
                "(every row's last column is a real token)"
            )
        self.seqs, self.held, self.settled, self.row_deferred, self.row_prefilled = [], [], [], [], []
        self.row_prompt_logits = []
        self._add_rows(input_ids, attention_mask, prompt_logits)
        return input_ids

    def _add_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_logits: bool = False) -> None:
        for ids, real in zip(input_ids.tolist(), attention_mask.bool().tolist()):
            prompt = [t for t, r in zip(ids, real) if r]
            self.seqs.append(self._free_sequence())
            self.row_deferred.append(prompt[:-1])
            self.held.append(len(prompt) - 1)
            self.settled.append(len(prompt) - 1)
            self.row_prefilled.append(None)
            self.row_prompt_logits.append([] if prompt_logits else None)
        self._sync_lengths()
        self._make_room()  # a stream for every row (the context made again when they outnumber its streams)

    def _free_sequence(self) -> int:
        for s in range(self.max_sequences):
            if s not in self.seqs:
                return s
        raise DraftVerifyError(
            f"the llamacpp backend holds at most {self.max_sequences} rows (sequences) on one context; "
            "lower the batch size (--batch-size / --max-batch)"
        )

    def _to_rows(self) -> None:
        """One-row mode -> rows mode (rows are about to join): the row keeps sequence 0 and its deferred prompt."""
        self._check_settled()
        self.seqs, self.held, self.settled = [0], [self.committed], [self.committed]
        self.row_deferred, self.row_prefilled = [self.deferred], [None]
        self.row_prompt_logits, self.prompt_parts = [self.prompt_parts], None
        if self._prefilled is not None:
            self.row_prefilled[0] = self._prefilled.logits[0, 0]
        self.deferred = []

    def _check_settled(self) -> None:
        if self.length > self.committed:
            raise DraftVerifyError("rows leave and join between steps only (the tail is not committed)")

    def _sync_lengths(self) -> None:
        """length / committed of rows mode: the longest row's (what a one-row caller would read)."""
        self.committed = max(self.settled, default=0)

    # ---- the row calls ----------------------------------------------------------------------------------------
    @property
    def row_length(self) -> torch.Tensor:
        """Positions each row holds [B] (its next position id)."""
        if self.seqs is None:
            return torch.tensor([self.length], device=self.device)
        return torch.tensor(self.held, device=self.device)

    def commit_rows(self, counts: torch.Tensor | list[int]) -> None:
        if self.seqs is None:
            self.commit(counts[0] if type(counts) is list and len(counts) == 1 else one_row(counts, "counts"))
            return
        self.truncate_rows([settled + count for settled, count in zip(self.settled, host_ints(counts))])

    def truncate_rows(self, upto: torch.Tensor | list[int]) -> None:
        if self.seqs is None:
            self.commit(one_row(upto, "upto") - self.committed)
            return
        upto = host_ints(upto)
        if len(upto) != len(self.seqs):
            raise DraftVerifyError(f"{len(upto)} row lengths for a batch of {len(self.seqs)} rows")
        for b, keep in enumerate(upto):
            if not self.settled[b] <= keep <= self.held[b]:
                raise DraftVerifyError(
                    f"row {b} cannot keep {keep} positions: it committed {self.settled[b]} and holds {self.held[b]}"
                )
            if keep < self.held[b]:
                self.lib.llama_memory_seq_rm(self.memory, self.seqs[b], keep, -1)
            self.held[b] = self.settled[b] = keep
        self._sync_lengths()

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        keep = torch.as_tensor(keep_rows).tolist()
        if self.seqs is None:
            if not all(keep):
                raise DraftVerifyError("the llamacpp backend's only row cannot leave; start() the next request instead")
            return
        if len(keep) != len(self.seqs):
            raise DraftVerifyError(f"keep_rows has {len(keep)} entries for a batch of {len(self.seqs)} rows")
        self._check_settled()
        for b in reversed(range(len(keep))):
            if not keep[b]:
                self.lib.llama_memory_seq_rm(self.memory, self.seqs[b], -1, -1)  # its id is free for a joining row
                for rows in (
                    self.seqs,
                    self.held,
                    self.settled,
                    self.row_deferred,
                    self.row_prefilled,
                    self.row_prompt_logits,
                ):
                    del rows[b]
        self._compact()
        self._sync_lengths()

    def _compact(self) -> None:
        """On streams, the rows' sequence ids made 0..B-1 again: the row with the highest id moves into the lowest
        free one until no id is skipped, because llama.cpp splits a batch into micro-batches of consecutive sequence
        ids (llamacpp_ubatches.py) and a gap costs one more each decode. The move is llama_state_seq_get_data /
        set_data (a sequence's state restores into the stream of the id it is set to), which is done when it
        returns; llama_memory_seq_cp across streams would only be queued until the next decode."""
        if not self.row_slots:
            return
        while self.seqs and max(self.seqs) >= len(self.seqs):
            gap = min(set(range(len(self.seqs))) - set(self.seqs))
            b = self.seqs.index(max(self.seqs))
            size = self.lib.llama_state_seq_get_size(self.ctx, self.seqs[b])
            data = (ctypes.c_uint8 * size)()
            written = self.lib.llama_state_seq_get_data(self.ctx, data, size, self.seqs[b])
            if written and self.lib.llama_state_seq_set_data(self.ctx, data, written, gap) == 0:
                raise DraftVerifyError(f"llama.cpp could not move sequence {self.seqs[b]} to {gap}")
            self.lib.llama_memory_seq_rm(self.memory, self.seqs[b], -1, -1)
            self.seqs[b] = gap

    def join_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, prompt_logits: bool = False
    ) -> None:
        """Between steps: new left-padded rows [b, L] join at the end of the batch, each in a free sequence id; their
        prompts are decoded with the next forward (keeping every prompt position's logits with prompt_logits)."""
        if self.seqs is None:
            self._to_rows()
        self._check_settled()
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        self._add_rows(input_ids, attention_mask, prompt_logits)

    def _take_rows_prompt_logits(self) -> list[torch.Tensor | None]:
        """take_prompt_logits in rows mode: each row's kept prompt logits [P, V] (None: not kept), once."""
        self._flush_rows()
        taken = [
            None if parts is None else torch.cat(parts) if parts else torch.empty(0, self.vocab_size)
            for parts in self.row_prompt_logits
        ]
        self.row_prompt_logits = [None] * len(self.row_prompt_logits)
        return taken

    def _keep_prompt_outputs(self, owners: list[tuple[int, bool]], logits: torch.Tensor) -> None:
        """The deferred prompts' output logits [len(owners), V] (a view): each row's last position's become its
        `prefilled`, and every position's are kept for a row that asked (row_prompt_logits); cloned, to outlive
        the decode's view."""
        kept: dict[int, list[int]] = {}
        for k, (b, last) in enumerate(owners):
            if last:
                self.row_prefilled[b] = logits[k].clone()
            if self.row_prompt_logits[b] is not None:
                kept.setdefault(b, []).append(k)
        for b, outputs in kept.items():
            self.row_prompt_logits[b].append(logits[outputs[0] : outputs[-1] + 1].clone())  # a row's are in order

    # ---- decoding ---------------------------------------------------------------------------------------------
    def _forward_rows(
        self, tokens: list[list[int]], new_valid: list[list[bool]] | None, logits_to_keep: int = 0
    ) -> TargetOutput:
        """tokens [B][n] after each row's tail, new_valid [B][n] False at padding; logits [B, n, V] (zeros at
        padding), or of the last min(logits_to_keep, n) columns alone when > 0 (the others are no output rows of
        the decode). The rows' deferred prompts go first, in the same decode. On streams a row padded on its right
        may decode some of its padding columns as filler (llamacpp_ubatches.py), removed right after."""
        batch, n = len(tokens), len(tokens[0]) if tokens else 0
        keep = kept_positions(logits_to_keep, n)
        first = n - keep  # the first column with logits
        if batch != len(self.seqs):
            raise DraftVerifyError(f"{batch} rows of tokens for a batch of {len(self.seqs)} rows")
        valid = [[True] * n] * batch if new_valid is None else new_valid
        fill = self._fill_counts(valid, n)
        prompt_lengths = [len(prompt) for prompt in self.row_deferred]
        entries, owners = self._deferred_entries()  # (token, position, sequence, output), (row, last) per output
        prompt_outputs = len(owners)
        slots = [b for b, _ in owners]
        scored_entries = []  # the entry of each scored (real) column, in slots' order
        out_slots = []  # the place of each output column's logits in [B * keep]
        real_ends = list(self.held)
        for b, (ids, real) in enumerate(zip(tokens, valid)):
            for k, (token, is_real) in enumerate(zip(ids, real)):
                if is_real:
                    scored_entries.append(len(entries))
                    entries.append((token, self.held[b], self.seqs[b], k >= first))
                    slots.append(b * n + k)
                    if k >= first:
                        out_slots.append(b * keep + k - first)
                    self.held[b] += 1
            real_ends[b] = self.held[b]
            for token in ids[sum(real) : sum(real) + fill[b]]:  # filler: no output, removed after the decode,
                filler = token if 0 <= token < self.vocab_size else 0  # so any valid token id will do
                entries.append((filler, self.held[b], self.seqs[b], False))
                self.held[b] += 1
        logits = self._decode_entries(entries)  # [outputs, V]
        for b in range(batch):
            if self.held[b] > real_ends[b]:
                self.lib.llama_memory_seq_rm(self.memory, self.seqs[b], real_ends[b], -1)
                self.held[b] = real_ends[b]
        self._keep_prompt_outputs(owners, logits[:prompt_outputs])
        if self.layer_inputs:  # the eagle3 wrapper's: per row, its scored columns' and its prompt's
            features = self.entry_layer_inputs  # [entries, layers * H]
            scored = features.new_zeros(batch * n, features.shape[1])  # zeros at padding
            scored[slots[prompt_outputs:]] = features[scored_entries]
            ends = torch.tensor(prompt_lengths).cumsum(0).tolist()
            prompts = [features[end - length : end] for end, length in zip(ends, prompt_lengths)]
            self.row_layer_inputs = (scored.view(batch, n, -1), prompts)
        if prompt_outputs == 0 and len(out_slots) == batch * keep:  # no prompt, no padding: every output, in order
            out = logits
        else:
            out = torch.zeros(batch * keep, self.vocab_size)
            out[out_slots] = logits[prompt_outputs:]
        self._sync_lengths()
        return TargetOutput(logits=out.view(batch, keep, -1))  # [B, keep, V]

    def _fill_counts(self, valid: list[list[bool]], n: int) -> list[int]:
        """Filler columns each row decodes after its real ones [B]: on streams, a row whose real columns are a
        prefix may go on into its padding when that makes the batch split into fewer micro-batches for less than
        their cost (filled_counts, at this context's fitted micro-batch cost); else none."""
        if not self.row_slots:
            return [0] * len(valid)
        real = [sum(row) for row in valid]
        right = [all(row[:r]) for row, r in zip(valid, real)]  # padding only after the real columns
        counts = [0] * (max(self.seqs) + 1)
        room = [0] * len(counts)
        for b, s in enumerate(self.seqs):
            counts[s] = len(self.row_deferred[b]) + real[b]
            room[s] = counts[s] + (n - real[b] if right[b] and real[b] else 0)
        filled = filled_counts(counts, room, self.ubatch_cost.ubatch_tokens)
        return [filled[s] - counts[s] for s in self.seqs]

    def _deferred_entries(self) -> tuple[list[tuple[int, int, int, bool]], list[tuple[int, bool]]]:
        """Every row's deferred prompt as decode entries (output at its last token, or at each of its tokens for a
        row that keeps its prompt's logits), taken off the rows; and each output's row and whether it is the
        row's last."""
        entries, owners = [], []
        for b, prompt in enumerate(self.row_deferred):
            start = self.settled[b] - len(prompt)
            every = self.row_prompt_logits[b] is not None
            for i, t in enumerate(prompt):
                last = i == len(prompt) - 1
                entries.append((t, start + i, self.seqs[b], every or last))
                if every or last:
                    owners.append((b, last))
            self.row_deferred[b] = []
        return entries, owners

    def _flush_rows(self) -> None:
        """Decode every row's deferred prompt now (chunks of BATCH)."""
        entries, owners = self._deferred_entries()
        if entries:
            self._keep_prompt_outputs(owners, self._decode_entries(entries))

    def _rows_prefilled(self) -> TargetOutput | None:
        """Each row's logits at its last prefilled position [B, 1, V] (zeros for a one-token prompt)."""
        self._flush_rows()
        if all(p is None for p in self.row_prefilled):
            return None
        zeros = torch.zeros(self.vocab_size)
        return TargetOutput(logits=torch.stack([zeros if p is None else p for p in self.row_prefilled])[:, None])

    def _decode_entries(self, entries: list[tuple[int, int, int, bool]]) -> torch.Tensor:
        """Decode (token, position, sequence, output) entries in order, in chunks of BATCH; the logits of the
        output entries [outputs, V] (a view of llama.cpp's buffer when one decode in order gave them: valid until
        the next decode, LlamaCppLM._logits)."""
        self._make_room()
        mark = len(self._layer_rows)  # the layer inputs this call's decodes keep (eagle3's wrapper reads them)
        # by sequence id (each row's own entries in their order): on streams llama.cpp splits a batch into
        # micro-batches of consecutive sequence ids, so this is one micro-batch where rows take equal counts
        order = sorted(range(len(entries)), key=lambda i: entries[i][2])
        ordered = [entries[i] for i in order]
        parts = []
        for begin in range(0, len(ordered), BATCH):
            chunk = ordered[begin : begin + BATCH]
            tokens, positions, seqs, outputs = zip(*chunk)
            self._fill(list(tokens), list(positions), [[s] for s in seqs], list(outputs))
            started = perf_counter()
            self._decode(len(chunk))
            if self.row_slots:  # the micro-batch cost this context's filler decisions read
                per_seq = [0] * (max(seqs) + 1)
                for s in seqs:
                    per_seq[s] += 1
                self.ubatch_cost.observe(micro_batches(per_seq), len(chunk), perf_counter() - started)
            view = self._logits(sum(outputs))  # the next chunk's decode writes the buffer again
            parts.append(view if begin + BATCH >= len(ordered) else view.clone())
        logits = parts[0] if len(parts) == 1 else torch.cat(parts) if parts else torch.empty(0, self.vocab_size)
        if self.layer_inputs and len(self._layer_rows) > mark:  # back in the entries' order [entries, layers * H]
            decoded = torch.cat(self._layer_rows[mark:])
            del self._layer_rows[mark:]
            self.entry_layer_inputs = torch.empty_like(decoded)
            self.entry_layer_inputs[order] = decoded
        if order == list(range(len(order))):  # already in sequence order
            return logits
        rank = {i: r for r, i in enumerate(i for i in order if entries[i][3])}  # output row of each entry
        return logits[[rank[i] for i, entry in enumerate(entries) if entry[3]]]

    # ---- the context's size -----------------------------------------------------------------------------------
    def _make_room(self) -> None:
        """Make the context again, larger, when the rows will hold more than it has: on streams (self.streams) a
        stream per row slot, sequence s in stream s, each row's positions in its own stream's cells (twice the
        slots or the cells, or what is needed); on one unified cache (a sliding-window or recurrent model, a given
        n_ctx) every row's positions in its cells (twice its cells, or what is needed)."""
        if self.streams:
            slots = max(self.seqs, default=0) + 1  # sequence s is stream s
            held = max(self.held, default=0)
            cells = max(held, self.fit_cells)  # check_fits: what one request may hold
            if self.row_slots is None:  # entering rows mode: the one row's cells are copied to its stream
                self._grow(max(held + ROW_ROOM, self.fit_cells), slots)
            elif slots > self.row_slots or cells > self.n_ctx_seq:
                self._grow(
                    max(cells, 2 * self.n_ctx_seq) if cells > self.n_ctx_seq else self.n_ctx_seq,
                    max(slots, min(2 * self.row_slots, self.max_sequences))
                    if slots > self.row_slots
                    else self.row_slots,
                )
            return
        cells = sum(self.held)
        wider = max(self.seqs, default=0) >= self.sequences  # a row takes a sequence of the context's own
        if cells <= self.n_ctx and not wider:
            return
        if cells > self.n_ctx and self.fixed_ctx:
            raise DraftVerifyError(
                f"the {self.role}'s llama.cpp context holds {self.n_ctx} cells (n_ctx); its rows need {cells}: give "
                "a larger n_ctx or fewer rows"
            )
        if wider:
            self.sequences = self.max_sequences
        self._grow(max(2 * self.n_ctx, cells) if cells > self.n_ctx else self.n_ctx)

    def _grow(self, cells: int, slots: int | None = None) -> None:
        """A context of `cells` cells per sequence on `slots` streams (None: one unified cache of `cells`) in place
        of this one, every held sequence's cells copied across (llama_state_seq_get_data / set_data, the state's
        stream count rewritten when the two contexts' differ)."""
        live = self.seqs if self.seqs is not None else [0]
        streams = self.row_slots or 1
        saved = []
        for s in live:
            size = self.lib.llama_state_seq_get_size(self.ctx, s)
            data = (ctypes.c_uint8 * size)()
            written = self.lib.llama_state_seq_get_data(self.ctx, data, size, s)
            if not self.streams:  # one unified cache to another (any memory's state): copied as it is
                if written:
                    saved.append((s, bytes(data[:written])))
                continue
            body = stream_body(bytes(data[:written]), s, streams)
            if body is not None:
                saved.append((s, body))
        self._make_context(cells, slots)
        for s, body in saved:
            state = with_streams(body, self.row_slots or 1) if self.streams else body
            data = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if self.lib.llama_state_seq_set_data(self.ctx, data, len(state), s) == 0:
                raise DraftVerifyError(f"llama.cpp could not copy sequence {s} into a context of {self.n_ctx} cells")


# A sequence's state (llama_state_seq_get_data of a plain KV cache) is a magic number and the sequence id (HEAD
# bytes), its cache's stream count (uint32), then for each stream its cell count (uint32) and, when not 0, its cells'
# positions and K / V rows. Sequence s lives in stream s of a context on streams, in stream 0 of a unified one: its
# part moves between the two by rewriting the stream count and the empty streams around it. (A sliding-window or
# recurrent model's state has several caches' parts; such a model is kept on one unified cache, whose state is
# copied as it is.)
HEAD = 8


def stream_body(state: bytes, seq: int, streams: int) -> bytes | None:
    """Sequence `seq`'s state without its stream count and empty streams: the head, then its own stream's cell
    count and cells; None when it holds no cells."""
    count = state[HEAD : HEAD + 4]
    if int.from_bytes(count, "little") != streams:
        raise DraftVerifyError(f"llama.cpp's state of sequence {seq} is not a {streams}-stream KV cache's")
    before, after = HEAD + 4 + 4 * seq * (streams > 1), len(state) - 4 * (streams - 1 - seq) * (streams > 1)
    if any(state[HEAD + 4 : before]) or any(state[after:]):
        raise DraftVerifyError(f"llama.cpp's state of sequence {seq} holds cells outside its stream")
    if not int.from_bytes(state[before : before + 4], "little"):
        return None
    return state[:HEAD] + state[before:after]


def with_streams(body: bytes, streams: int) -> bytes:
    """A stream_body for a context of `streams` streams (set_data reads it into the sequence's own)."""
    return body[:HEAD] + streams.to_bytes(4, "little") + body[HEAD:] + bytes(4 * (streams - 1))
