"""The generation worker: one thread that owns the models and runs the library's decoding loop.

Requests wait in a bounded queue; the worker takes the oldest one together with every waiting request that can
share its batch (same speculative method and gamma, same sampling settings unless the method judges rows apart, up
to max_batch rows) and runs them through that method's Pipeline.generate_batch_ids, i.e. the one decoding loop at
batch size B. Continuous batching: while the batch runs, finished rows leave it and waiting requests with the same
settings join it between steps; requests with other settings wait for a batch of their own. Text goes back to
the asyncio side through loop.call_soon_threadsafe, so the event loop never waits on a model: a streamed request's
at most once per stream interval, a whole request's at its end (Job.emit_text). A cancelled request (client gone)
leaves its batch at the next step; a request cancelled while still queued is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..detokenize import IncrementalDecoder
from ..errors import DraftVerifyError
from ..processing import Processing
from ..types import Logprobs, RowRequest, SamplingParams
from .defaults import MAX_QUEUE
from .logprobs import Scored, ScoredText, prompt_scored
from .metrics import Metrics
from .protocol import ApiError
from .speculation import Speculation

logger = logging.getLogger("draftverify.serve")


class QueueFull(Exception):
    pass


class NotRunning(Exception):
    pass


class StopText:
    """Detokenizes a growing list of token ids into new text, holding back characters that may still turn into
    a stop string (or a multi-byte character), and ends the text before the first stop string. Incremental: each
    push decodes only the tokens since the last emitted boundary (detokenize.IncrementalDecoder).

    The answer ends where decoding one token at a time would end it, however many tokens a push brings (a
    speculative step brings several): at the first token whose text completes a stop string, the tokens after it
    dropped (`ids` keeps the answer's tokens: what its usage counts), the text cut before the earliest stop string
    it holds."""

    def __init__(self, tokenizer, stop: list[str], healing=None):
        self.decoder = IncrementalDecoder(tokenizer, healing)  # healing: the re-emitted removed text is cut
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.sent = 0  # characters already returned
        self.stopped = False

    @property
    def ids(self) -> list[int]:
        return self.decoder.ids

    def push(self, ids: list[int]) -> str:
        """New text to emit after these tokens; sets .stopped when a stop string appeared (text before it only,
        and only the tokens up to the one that completed it kept in .ids)."""
        mark = self.decoder.mark()
        self.decoder.push(ids)
        end = self._stop_at()
        if end is not None and len(ids) > 1:  # which of the tokens completed it: replay them one at a time
            self.decoder.rewind(mark)
            for token in ids:
                self.decoder.push([token])
                end = self._stop_at()
                if end is not None:
                    break
        if end is not None:
            self.stopped = True
            return self._take(self.decoder.text, end)
        if self.decoder.pending:  # the removed text is not all decoded yet: nothing to say
            return ""
        return self._take(self.decoder.text, len(self.decoder.text) - self.hold)

    def _stop_at(self) -> int | None:
        """Where the text ends when it holds a stop string (at the earliest one), else None. Text already returned
        never holds one, so only its last len(s) - 1 characters are searched again."""
        if self.decoder.pending:  # the removed text is not all decoded yet: no answer text to search
            return None
        text = self.decoder.text
        found = [at for s in self.stop if (at := text.find(s, max(0, self.sent - len(s) + 1))) >= 0]
        return min(found) if found else None

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.decoder.finish()
        return self._take(self.decoder.text, len(self.decoder.text))

    def _take(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        piece = text[self.sent : end]
        self.sent = end
        return piece


@dataclass
class Job:
    """One request's generation. Events reach `sink` (an asyncio.Queue) as tuples:
    ("text", str, [Scored]), ("done", finish_reason, usage dict) or ("error", ApiError). A text event carries the
    scored tokens whose text starts in it (serve/logprobs.py) when the request asked for log-probabilities; with
    echo too, the worker hands over the prompt's text first, with the prompt's tokens."""

    ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    sink: asyncio.Queue
    healing: Any = None  # healing.Healing: decode the backed-up prompt, first token constrained (token healing)
    speculation: Speculation | None = None  # the method and gamma it runs; None: the server's
    index: int = 0  # which of its request's n choices (the request's prompt is counted once, with choice 0)
    # least seconds between two hand-overs of a streamed request's text; None: not streamed, handed over at the end
    stream_interval: float | None = 0.0
    logprobs: Logprobs | None = None  # the log-probabilities it reports; prompt: with echo
    echo: str | None = None  # the prompt's text, handed over with its tokens' log-probabilities (echo and logprobs)
    processing: Processing | None = None  # penalties, logit_bias, stop tokens, structured output (compiled); None: none
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # worker-side
    text: StopText | None = None
    stops: set[int] = field(default_factory=set)  # the tokens that end it: EOS unless ignore_eos, its stop_token_ids
    stopped_by_token: bool = False  # it ended at one of them
    stop_token_cut: bool = False  # that token is one of stop_token_ids: counted, but not part of the text
    drafted: int = 0  # draft tokens proposed for this row
    accepted: int = 0  # of which emitted, within the answer
    step_kept: int = 0  # accepted draft tokens among those the last step emitted (they come first)
    target_calls: int = 0  # target forwards this row took part in
    first_text_at: float | None = None
    done: bool = False
    pending: list[str] = field(default_factory=list)  # text not handed over yet
    pending_scored: list[Scored] = field(default_factory=list)  # its scored tokens
    scored: ScoredText | None = None  # the scored tokens waiting for their text (when logprobs were asked)
    handed_at: float | None = None  # when text was last handed over

    def emit_text(self, piece: str, scored: list[Scored] | None = None) -> None:
        """Text for the client (and the scored tokens that start in it). It waits for later text while the last
        hand-over is younger than stream_interval (a whole request's, for the end): every hand-over wakes the event
        loop, whose thread then takes a core from the threads decoding the next step (llama.cpp's), so handing
        over each step's text slows decoding."""
        self.pending.append(piece)
        self.pending_scored.extend(scored or ())
        if self.stream_interval is None:
            return
        now = time.perf_counter()
        if self.handed_at is None or now - self.handed_at >= self.stream_interval:
            self.handed_at = now
            self._hand_over_text()

    def emit(self, event: tuple) -> None:
        """Hands an event ("done", "error") to the request's handler, after the text still pending."""
        self._hand_over_text()
        self._put(event)

    def _hand_over_text(self) -> None:
        if self.pending:
            text, scored = "".join(self.pending), list(self.pending_scored)
            self.pending.clear()
            self.pending_scored.clear()
            self._put(("text", text, scored))

    def _put(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.sink.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def cancel(self) -> None:
        self.cancelled.set()

    @property
    def prompt_ids(self) -> list[int]:
        """The ids the model decodes after: the prompt, backed up over its last token when healed."""
        return self.ids if self.healing is None else self.healing.ids

    @property
    def first_allowed(self):
        return None if self.healing is None else self.healing.allowed

    def batch_key(self, mixed: bool) -> tuple:
        """Requests with equal keys may share a batch: those with the same speculation and, unless the method
        judges each row by its own sampling settings (mixed), the same settings (the seed aside: each row keeps
        its own)."""
        p = self.params
        return (self.speculation,) + (() if mixed else (p.temperature, p.top_k, p.top_p, p.coupled))

    @property
    def generated(self) -> int:
        """The answer's tokens so far (StopText.ids, and a stop token of stop_token_ids that ended it, which is not
        part of the text): what usage and /metrics count."""
        return (0 if self.text is None else len(self.text.ids)) + self.stop_token_cut

    @property
    def usage(self) -> dict[str, int]:
        """OpenAI's usage plus what speculation did for this request (draftverify's extension)."""
        prompt_tokens = len(self.prompt_ids)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": self.generated,
            "total_tokens": prompt_tokens + self.generated,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "target_calls": self.target_calls,
        }


def _without_stop_token(ids: list[int], job: Job) -> list[int]:
    """A step's ids for the text: a stop token of stop_token_ids that ends the answer is not part of its text, as in
    vLLM (EOS is a special token, which the text leaves out anyway)."""
    if job.processing is not None and ids[-1] in job.processing.stop_token_ids:
        return ids[:-1]
    return ids


@dataclass(frozen=True)
class Variant:
    """A method the worker runs: its pipeline, the rows a batch of it may hold, and whether rows with different
    sampling settings may share one (its verifier judges each row by its own)."""

    pipe: Any
    max_batch: int
    mixed: bool


class Engine:
    """pipes: method name -> pipeline, the methods a request may pick besides `pipe`'s own (speculation.py)."""

    def __init__(
        self,
        pipe,
        metrics: Metrics,
        max_queue: int = MAX_QUEUE,
        max_batch: int = 1,
        gamma: int | str | None = None,
        pipes: dict[str, Any] | None = None,
    ):
        if max_queue < 1 or max_batch < 1:
            raise DraftVerifyError(f"max_queue and max_batch must be >= 1, got {max_queue} and {max_batch}")
        self.pipe = pipe
        self.metrics = metrics
        self.max_queue = max_queue
        if max_batch > 1 and not getattr(pipe, "supports_batches", True):
            logger.warning("this method decodes one row at a time: serving requests one by one (max_batch 1)")
            max_batch = 1
        self.max_batch = max_batch
        self.default = Speculation(pipe.method.name, getattr(pipe, "gamma", None) if gamma is None else gamma)
        self.variants = {
            name: self._variant(p, max_batch) for name, p in {**(pipes or {}), pipe.method.name: pipe}.items()
        }
        self.eos = pipe.eos_token_id
        self._eos_set = set([self.eos] if isinstance(self.eos, int) else (self.eos or []))
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.busy_rows = 0

    @staticmethod
    def _variant(pipe, max_batch: int) -> Variant:
        rows = max_batch if getattr(pipe, "supports_batches", True) else 1
        return Variant(pipe, rows, rows > 1 and getattr(pipe, "mixes_sampling", False))

    # ---- asyncio side ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._worker, name="draftverify-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, *jobs: Job) -> None:
        """Queue a request's jobs (its choices: adjacent in the queue, so they share a batch when it has room),
        all or none: QueueFull unless every one has a place."""
        with self._cond:
            if not self.alive:
                raise NotRunning()
            if len(self._waiting) + len(jobs) > self.max_queue:
                raise QueueFull()
            for job in jobs:
                if job.speculation is None:
                    job.speculation = self.default
                self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in waiting:
            job.emit(
                (
                    "error",
                    ApiError(503, "the server is shutting down", type="server_error", headers={"Retry-After": "5"}),
                )
            )
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- worker side -------------------------------------------------------------------------------------
    def _take(self) -> list[Job] | None:
        with self._cond:
            while True:
                while self._waiting and self._waiting[0].cancelled.is_set():
                    self._finish_cancelled(self._waiting.popleft())
                if self._waiting:
                    break
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._waiting.popleft()
            variant = self.variants[first.speculation.method]
            jobs = [first] + self._matching(first.batch_key(variant.mixed), variant.max_batch - 1, variant.mixed)
            self.metrics.queue_depth.set(len(self._waiting))
            return jobs

    def _matching(self, key: tuple, room: int, mixed: bool) -> list[Job]:
        """Up to `room` waiting jobs with this batch key, oldest first, taken off the queue (lock held)."""
        taken: list[Job] = []
        for job in list(self._waiting):
            if len(taken) >= room:
                break
            if job.batch_key(mixed) == key and not job.cancelled.is_set():
                self._waiting.remove(job)
                taken.append(job)
        return taken

    def _admitter(self, jobs: list[Job], variant: Variant):
        """Continuous batching: between steps, waiting jobs with the batch's speculation join it while it has room
        (rows that finished have left): any such job when rows keep their own sampling settings, else those with
        the batch's."""
        key = jobs[0].batch_key(variant.mixed)

        def admit() -> list[RowRequest]:
            active = sum(not job.done for job in jobs)
            room = variant.max_batch - active
            if room <= 0 or not self._waiting:
                return []
            with self._cond:
                if self._stopping:
                    return []
                new = self._matching(key, room, variant.mixed)
                self.metrics.queue_depth.set(len(self._waiting))
            if not new:
                return []
            self._prepare(new)
            self.metrics.joined.inc(len(new))
            jobs.extend(new)
            self.busy_rows = active + len(new)
            self.metrics.running.set(self.busy_rows)
            return [
                RowRequest(
                    job.prompt_ids,
                    job.max_tokens,
                    seed=job.params.seed,
                    first_token_allowed=job.first_allowed,
                    params=job.params,
                    logprobs=job.logprobs,
                    processing=job.processing,
                )
                for job in new
            ]

        return admit

    def _prepare(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        for job in jobs:
            job.text = StopText(self.pipe.tokenizer, job.stop, job.healing)
            if job.logprobs is not None:
                job.scored = ScoredText(self.pipe.tokenizer, base=len(job.echo or ""))
            job.stops = self._eos_set if job.processing is None else job.processing.stops(self._eos_set)
            self.metrics.queue_wait.observe(started - job.arrived)
        self.metrics.batch_size.observe(len(jobs))

    def _worker(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                jobs = self._take()
                if jobs is None:
                    return
                try:
                    self._run(jobs)
                except Exception as err:  # a bug in the bookkeeping: fail these requests, keep serving
                    logger.exception("the generation worker failed")
                    for job in jobs:
                        self._fail(
                            job, ApiError(500, f"internal error: {type(err).__name__}: {err}", type="server_error")
                        )

    def _finish_cancelled(self, job: Job) -> None:
        if not job.done:
            job.done = True
            self.metrics.finished.labels("cancelled").inc()

    def _run(self, jobs: list[Job]) -> None:
        jobs = list(jobs)  # grows as rows join (continuous batching): row b of the loop is jobs[b]
        speculation = jobs[0].speculation
        variant = self.variants[speculation.method]
        self._prepare(jobs)
        self.busy_rows = len(jobs)
        self.metrics.running.set(len(jobs))
        try:
            per_row: dict = {}  # what only some requests ask for, given for every row when one does
            if any(job.healing is not None for job in jobs):
                per_row["first_token_allowed"] = [job.first_allowed for job in jobs]
            if any(job.processing is not None for job in jobs):
                per_row["processing"] = [job.processing for job in jobs]
            # rows that join may ask for logprobs whether or not these do (admit: the loop is ready for them)
            if any(job.logprobs for job in jobs):
                per_row["logprobs"] = [job.logprobs for job in jobs]
            variant.pipe.generate_batch_ids(
                [job.prompt_ids for job in jobs],
                [job.params for job in jobs],
                max_new_tokens=[job.max_tokens for job in jobs],
                seeds=[job.params.seed for job in jobs],
                gamma=speculation.gamma,
                **per_row,
                on_tokens=lambda emitted: self._on_tokens(jobs, emitted),
                admit=self._admitter(jobs, variant) if variant.max_batch > 1 else None,
                on_step=lambda record, rows: self._on_step(jobs, record, rows),
            )
        except DraftVerifyError as err:
            for job in jobs:
                self._fail(job, ApiError(400, str(err)))
        except Exception as err:  # a bug or an out-of-memory: the request fails, the server stays up
            for job in jobs:
                self._fail(job, ApiError(500, f"generation failed: {type(err).__name__}: {err}", type="server_error"))
        else:
            for job in jobs:
                self._complete(job)
        finally:
            self.busy_rows = 0
            self.metrics.running.set(0)

    def _on_step(self, jobs: list[Job], record, rows: list[int]) -> None:
        """A step's statistics (engine/stats.StepRecord; its per-row lists describe `rows`): the work it did, for
        each request's usage and the counters /metrics shows, which add up the same numbers. What a row gained
        is counted by _on_tokens, which knows where its answer ends."""
        metrics = self.metrics
        metrics.target_calls.inc(record.target_calls)
        metrics.drafted_tokens.inc(record.drafted)
        for i, row in enumerate(rows):
            job = jobs[row]
            job.drafted += record.row_drafted[i]
            job.target_calls += record.target_calls
            job.step_kept = record.row_kept[i]
        if record.logprobs is not None:
            self._scored(jobs, record, rows)

    def _scored(self, jobs: list[Job], record, rows: list[int]) -> None:
        """A step's log-probabilities to the requests that asked: an echoed prompt's go out at once with the
        prompt's text (before anything generated); the emitted tokens' wait for their text (_on_tokens)."""
        for i, row in enumerate(rows):
            job = jobs[row]
            if job.scored is None or job.done:
                continue
            prompt = None if record.prompt_logprobs is None else record.prompt_logprobs[i]
            if prompt is not None and job.echo is not None:
                job.emit_text(job.echo, prompt_scored(self.pipe.tokenizer, job.prompt_ids, prompt))
            if record.logprobs[i]:
                job.scored.add(record.logprobs[i])

    def _on_tokens(self, jobs: list[Job], emitted) -> list[int]:
        """emitted [B, k], -1 where a row emitted fewer tokens (or has left). Returns the rows to stop now."""
        stop_rows = []
        kept = []  # per row that gained tokens: the accepted drafts among the answer's new tokens
        for row, tokens in enumerate(emitted.tolist()):
            job = jobs[row]
            if job.done:
                continue
            if job.cancelled.is_set():
                self._finish_cancelled(job)
                stop_rows.append(row)
                continue
            ids = [t for t in tokens if t >= 0]
            if not ids:
                continue
            before = job.generated
            text_ids = _without_stop_token(ids, job)
            piece = job.text.push(text_ids)
            job.stop_token_cut = len(text_ids) < len(ids) and not job.text.stopped
            kept.append(self._count(job, job.generated - before))
            self._hand_over(job, piece, job.scored.release(job.text.sent) if job.scored is not None else [])
            job.stopped_by_token = ids[-1] in job.stops and not job.text.stopped
            ended = job.text.stopped or job.stopped_by_token or job.generated >= job.max_tokens
            if ended:
                self._complete(job)
                stop_rows.append(row)
        for position in range(1, max(kept, default=0) + 1):  # a row that kept k drafts kept positions 1..k
            self.metrics.accepted_at.labels(str(position)).inc(sum(k >= position for k in kept))
        self.busy_rows = sum(not job.done for job in jobs)
        self.metrics.running.set(self.busy_rows)
        return stop_rows

    def _count(self, job: Job, new: int) -> int:
        """A row's step gave its answer `new` tokens (all it emitted, or those up to a stop string): the counters
        and the usage's accepted drafts (they come first among a step's tokens). Returns how many of them count."""
        kept = min(job.step_kept, new)
        job.accepted += kept
        metrics = self.metrics
        metrics.generated_tokens.inc(new)
        metrics.accepted_tokens.inc(kept)
        metrics.tokens_per_call.observe(new)
        return kept

    def _hand_over(self, job: Job, piece: str, scored: list[Scored]) -> None:
        """The answer's new text and the scored tokens that start in it to the client; the first text's arrival is
        the request's time to first token."""
        if piece and job.first_text_at is None:
            job.first_text_at = time.perf_counter()
            self.metrics.ttft.observe(job.first_text_at - job.arrived)
        if piece or scored:
            job.emit_text(piece, scored)

    def _complete(self, job: Job) -> None:
        if job.done:
            return
        if job.cancelled.is_set():
            self._finish_cancelled(job)
            return
        job.done = True
        piece = job.text.finish()
        # a stop string ends the answer: tokens whose text starts past it are not part of it
        scored = job.scored.release(job.text.sent if job.text.stopped else None) if job.scored is not None else []
        self._hand_over(job, piece, scored)
        reason = "stop" if job.text.stopped or job.stopped_by_token else "length"
        self.metrics.finished.labels(reason).inc()
        if job.index == 0:
            self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        job.emit(("done", reason, job.usage))

    def _fail(self, job: Job, error: ApiError) -> None:
        if job.done:
            return
        job.done = True
        self.metrics.finished.labels("error").inc()
        job.emit(("error", error))

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {
                "queued": len(self._waiting),
                "running_rows": self.busy_rows,
                "max_queue": self.max_queue,
                "max_batch": self.max_batch,
            }
