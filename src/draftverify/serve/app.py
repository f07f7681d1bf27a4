"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

create_app(pipe, settings) wraps a loaded Pipeline: a Service holds what the endpoints share (the pipeline, the
settings, the Engine whose worker thread generates, the metrics), and the endpoints on `router` reach it through
FastAPI's dependency injection (get_service), so each piece is a plain function or method with explicit inputs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from typing import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..checks import check_prompt_text
from ..errors import DraftVerifyError
from ..processing import PLAIN, Processing, ProcessingError, Structured
from ..types import Logprobs, SamplingParams
from .defaults import MAX_QUEUE, MAX_STREAM_INTERVAL, STREAM_INTERVAL
from .engine import Engine, Job, NotRunning, QueueFull
from .logprobs import Scored, chat_logprobs, completion_logprobs
from .metrics import Metrics
from .protocol import (
    MAX_CHOICES,
    MAX_LOGPROBS,
    MAX_TOP_LOGPROBS,
    SEED_LIMIT,
    TOKEN_ID,
    ApiError,
    ChatCompletion,
    ChatRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    ModelList,
    Unavailable,
)
from .speculation import Methods, Speculation, context_window, runnable_methods

MAX_STOP_STRINGS = 4


class _Role(str):
    """Marker for the first chat chunk (delta with the assistant role)."""


ROLE = _Role("")


class ServerSettings:
    def __init__(
        self,
        model_name: str,
        api_key: str | None = None,
        max_queue: int = MAX_QUEUE,
        max_batch: int = 1,
        max_tokens_limit: int | None = None,
        gamma: int | str | None = None,
        retry_after_s: int = 1,
        heal: bool = False,
        stream_interval: float = STREAM_INTERVAL,
    ):
        if isinstance(stream_interval, bool) or not isinstance(stream_interval, (int, float)):
            raise DraftVerifyError(f"--stream-interval must be a number of seconds, got {stream_interval!r}")
        if not 0 <= stream_interval <= MAX_STREAM_INTERVAL:
            raise DraftVerifyError(
                f"--stream-interval must be in 0..{MAX_STREAM_INTERVAL:g} seconds (0: every step's text at once), "
                f"got {stream_interval:g}"
            )
        self.model_name = model_name
        self.api_key = api_key or None
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.max_tokens_limit = max_tokens_limit
        self.gamma = gamma
        self.retry_after_s = retry_after_s
        self.heal = heal  # token healing of /v1/completions prompts unless a request says otherwise
        self.stream_interval = float(stream_interval)  # least seconds between two chunks of a stream (engine.Job)


def _validation_message(err: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """A body FastAPI (or a model) refused, as one line and the field at fault (dotted)."""
    errors = err.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON: " + str(first.get("ctx", {}).get("error", first.get("msg"))), None
    loc = _field(first)
    if not loc:  # the body itself: absent, or not an object
        return f"the request body must be a JSON object ({first.get('msg')})", None
    # a union's members fail one error each (prompt.str, prompt.list[int]): the field is what their paths share
    if first.get("type") not in ("extra_forbidden", "missing"):
        for other in errors[1:]:
            if _field(other)[:1] == loc[:1] and other.get("type") not in ("extra_forbidden", "missing"):
                loc = _shared(loc, _field(other))
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        unknown = sorted(
            {
                ".".join(str(x) for x in e.get("loc", ()) if x != "body")
                for e in errors
                if e.get("type") == "extra_forbidden"
            }
        )
        return f"unknown field(s): {', '.join(unknown)} (draftverify does not support them)", unknown[0]
    if first.get("type") == "missing":
        return f"missing required field: {param}", param
    return f"invalid value for {param}: {first.get('msg')}", param


def _field(error: dict) -> list[str]:
    return [str(x) for x in error.get("loc", ()) if x != "body"]


def _shared(a: list[str], b: list[str]) -> list[str]:
    """The longest common prefix of two field paths."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


async def watch_disconnect(request: Request, jobs: list[Job]) -> None:
    """Cancels the jobs (a request's choices) when their client leaves. The body is read, so the ASGI server's next
    message is the disconnect: waiting for it wakes the event loop once, where polling woke it every few
    milliseconds."""
    while not all(job.done for job in jobs):
        if (await request.receive())["type"] == "http.disconnect":
            for job in jobs:
                job.cancel()  # no-op once done
            return


async def events(jobs: list[Job]) -> AsyncGenerator[tuple[int, tuple], None]:
    """The events of a request's choices as they come, each with its choice's index, until every choice is done
    (or one failed: the error is the last event)."""
    reading = {asyncio.ensure_future(job.sink.get()): i for i, job in enumerate(jobs)}
    try:
        while reading:
            done, _ = await asyncio.wait(reading, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=reading.__getitem__):
                i = reading.pop(future)
                event = future.result()
                yield i, event
                if event[0] == "error":
                    return
                if event[0] == "text":
                    reading[asyncio.ensure_future(jobs[i].sink.get())] = i
    finally:
        for future in reading:
            future.cancel()


def summed_usage(usages: list[dict]) -> dict:
    """A request's usage from its choices': the prompt once, every other count added up over the choices."""
    total = {key: sum(u[key] for u in usages) for key in usages[0]}
    total["prompt_tokens"] = usages[0]["prompt_tokens"]
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return total


async def collect(request: Request, jobs: list[Job]) -> tuple[list[tuple[str, str, list[Scored]]], dict]:
    """A whole (non-streamed) generation: each choice's text, finish reason and scored tokens (serve/logprobs.py),
    and the request's usage; a client that leaves cancels it."""
    watcher = asyncio.ensure_future(watch_disconnect(request, jobs))
    pieces: list[list[str]] = [[] for _ in jobs]
    scored: list[list[Scored]] = [[] for _ in jobs]
    ends: list[tuple[str, dict]] = [("", {})] * len(jobs)
    try:
        async with aclosing(events(jobs)) as stream:
            async for i, event in stream:
                if event[0] == "text":
                    pieces[i].append(event[1])
                    scored[i].extend(event[2])
                elif event[0] == "done":
                    ends[i] = event[1], event[2]
                else:
                    raise event[1]
        answers = [("".join(p), reason, s) for p, (reason, _), s in zip(pieces, ends, scored)]
        return answers, summed_usage([u for _, u in ends])
    finally:
        watcher.cancel()
        for job in jobs:
            job.cancel()  # no-op once done; frees the rows if this handler was cancelled


def _structured(body) -> tuple[Structured | None, str | None]:
    """The constraint on the text a request asks for (response_format json_object / json_schema, or vLLM's
    structured_outputs) and the field that asks for it, or (None, None)."""
    form, wanted = body.response_format, body.structured_outputs
    asks_json = form is not None and form.type != "text"
    if asks_json and wanted is not None:
        raise ApiError(400, "give response_format or structured_outputs, not both", param="structured_outputs")
    if asks_json and form.type == "json_schema":
        where, fields = "response_format.json_schema.schema", {"json_schema": form.json_schema.schema_}
    elif asks_json:
        where, fields = "response_format", {"json_object": True}
    elif wanted is not None:
        offered = {
            "json": wanted.json_,
            "regex": wanted.regex,
            "choice": wanted.choice,
            "grammar": wanted.grammar,
            "json_object": wanted.json_object,
        }
        kinds = [name for name, value in offered.items() if value is not None]
        if len(kinds) != 1:
            raise ApiError(
                400, "structured_outputs: give exactly one of " + ", ".join(offered), param="structured_outputs"
            )
        name = kinds[0]
        where = f"structured_outputs.{name}"
        fields = {"json_schema" if name == "json" else name: offered[name]}
        fields["any_whitespace"] = not wanted.disable_any_whitespace
    else:
        return None, None
    try:
        return Structured(**fields), where
    except ProcessingError as err:
        raise ApiError(400, f"{where}: {err.reason}", param=where, code="invalid_grammar") from None


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class Service:
    """What every endpoint shares, built once per app: the pipeline, the settings, the engine and the metrics."""

    def __init__(self, pipe, settings: ServerSettings):
        self.pipe = pipe
        self.settings = settings
        self.metrics = Metrics()
        pipes = runnable_methods(pipe)
        self.engine = Engine(
            pipe,
            self.metrics,
            max_queue=settings.max_queue,
            max_batch=settings.max_batch,
            gamma=settings.gamma,
            pipes=pipes,
        )
        self.methods = Methods(pipes, self.engine.default.method, self.engine.default.gamma)
        self.window = context_window(pipe)
        self.tokenizer = pipe.tokenizer
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))

    def record(self, endpoint: str, status: str, started: float) -> None:
        self.metrics.requests.labels(endpoint, status).inc()
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    def error_response(self, err: ApiError, endpoint: str) -> JSONResponse:
        self.metrics.requests.labels(endpoint, str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    def check_key(self, request: Request) -> None:
        api_key = self.settings.api_key
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), api_key.encode()):
            raise ApiError(
                401,
                "invalid or missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_common(
        self, body, max_tokens: int | None, prompt_tokens: int, default_tokens: int | None = None
    ) -> tuple[SamplingParams, int, list[str]]:
        """The checks both generation endpoints make: the model, the sampling fields, the context window. Without
        max_tokens a request gets default_tokens (None: as many as the context holds), within the room and limit."""
        settings, window = self.settings, self.window
        if body.model != settings.model_name:
            raise ApiError(
                404,
                f"the model {body.model!r} does not exist; this server serves {settings.model_name!r}",
                param="model",
                code="model_not_found",
            )
        temperature = 1.0 if body.temperature is None else body.temperature
        if not 0.0 <= temperature <= 2.0:
            raise ApiError(400, f"temperature must be between 0 and 2, got {temperature}", param="temperature")
        top_p = 1.0 if body.top_p is None else body.top_p
        if not 0.0 < top_p <= 1.0:
            raise ApiError(400, f"top_p must be in (0, 1], got {top_p}", param="top_p")
        top_k = 0 if body.top_k is None or body.top_k == -1 else body.top_k
        if top_k < 0:
            raise ApiError(400, f"top_k must be >= 0 (0 or -1 = off), got {top_k}", param="top_k")
        room = None if window is None else window - prompt_tokens
        if room is not None and room < 1:
            raise ApiError(
                400,
                f"this model's context is {window} tokens and the prompt has {prompt_tokens}: "
                "no room for any completion; shorten the prompt",
                param="prompt",
                code="context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = min(x for x in (default_tokens, room, 256 if room is None else None) if x is not None)
            if settings.max_tokens_limit is not None:
                max_tokens = min(max_tokens, settings.max_tokens_limit)
        if isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {max_tokens}", param="max_tokens")
        if settings.max_tokens_limit is not None and max_tokens > settings.max_tokens_limit:
            raise ApiError(
                400,
                f"max_tokens {max_tokens} is above this server's limit of {settings.max_tokens_limit}",
                param="max_tokens",
            )
        if room is not None and max_tokens > room:
            raise ApiError(
                400,
                f"this model's context is {window} tokens; the prompt has {prompt_tokens} and "
                f"max_tokens asks for {max_tokens} more ({prompt_tokens + max_tokens} in all): lower "
                "max_tokens or shorten the prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", param="stop")
        if body.seed is not None and abs(body.seed) > SEED_LIMIT:
            raise ApiError(400, f"seed must be in -{SEED_LIMIT}..{SEED_LIMIT}, got {body.seed}", param="seed")
        try:
            params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=body.seed)
        except DraftVerifyError as err:
            raise ApiError(400, str(err)) from None
        return params, max_tokens, stop

    def healing_for(self, body: CompletionRequest, ids: list[int]):
        """Token healing of this prompt (the request's "heal", else the server's default), or None. The text
        streamed back is relative to the prompt as sent; usage counts the tokens the model saw and made."""
        pipe = self.pipe
        if body.heal and pipe.target.is_encoder_decoder:
            raise ApiError(
                400, "heal: token healing continues a prompt; this model translates its source", param="heal"
            )
        heal = self.settings.heal if body.heal is None else body.heal
        return pipe.heal_ids(ids) if heal and not pipe.target.is_encoder_decoder else None

    async def processing_for(self, body) -> Processing | None:
        """The request's logits processing (penalties, logit_bias, min_tokens, ignore_eos, stop_token_ids) and
        structured output (response_format, structured_outputs), checked against this model, its grammar compiled
        off the event loop; None when it asks for none. A bad value is a 400 naming the field; a constraint the
        grammar engine refuses has code invalid_grammar (which no schema can tell in advance)."""
        vocab = self.pipe.target.vocab_size
        fields = {
            name: getattr(body, name)
            for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos")
            if getattr(body, name) is not None
        }
        if body.logit_bias:
            fields["logit_bias"] = {}
            for key, value in body.logit_bias.items():
                if not re.fullmatch(TOKEN_ID, key) or int(key) >= vocab:
                    raise ApiError(
                        400, f"logit_bias: {key!r} is not a token id of this model (0..{vocab - 1})", param="logit_bias"
                    )
                fields["logit_bias"][int(key)] = value
        if body.stop_token_ids:
            fields["stop_token_ids"] = body.stop_token_ids
        structured, where = _structured(body)
        try:
            processing = Processing(**fields, structured=structured)
            processing.check_vocabulary(vocab)
        except ProcessingError as err:  # the fields' own limits (the schema states them too)
            raise ApiError(400, str(err), param=err.field) from None
        if processing == PLAIN:
            return None
        if structured is None:
            return processing
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.pipe.compile_processing, processing)
        except ProcessingError as err:
            raise ApiError(400, f"{where}: {err.reason}", param=where, code="invalid_grammar") from None
        except DraftVerifyError as err:  # no xgrammar, or a tokenizer it cannot read
            raise ApiError(400, str(err), param=where) from None

    def encode_text(self, text: str) -> list[int]:
        ids = self.tokenizer(text).input_ids
        if not ids:
            raise ApiError(400, "the prompt tokenizes to no tokens: give some text", param="prompt")
        return ids

    def completion_prompt(self, body: CompletionRequest) -> tuple[list[int], str]:
        """The prompt's token ids and its text (for echo), from a string or token ids."""
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(
                    400, f"one prompt per request, got {len(prompt)} (send one request per prompt)", param="prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            try:
                check_prompt_text(prompt)  # the CLI's and the API's rules: not empty, not only whitespace
            except DraftVerifyError as err:
                raise ApiError(400, str(err), param="prompt") from None
            return self.encode_text(prompt), prompt
        ids = list(prompt)
        if not ids:
            raise ApiError(400, "the prompt is empty: give at least one token", param="prompt")
        vocab = self.pipe.target.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        return ids, self.tokenizer.decode(ids)

    def chat_prompt(self, body: ChatRequest) -> list[int]:
        """The messages rendered by the tokenizer's chat template, as token ids."""
        if not self.has_chat_template:
            raise ApiError(
                400,
                f"the model {self.settings.model_name!r} has no chat template (its tokenizer defines "
                "none), so it cannot take chat messages; use /v1/completions with a plain prompt",
                param="messages",
                code="no_chat_template",
            )
        if {"max_tokens", "max_completion_tokens"} <= body.model_fields_set:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
        messages = []
        for m in body.messages:
            content = m.content
            if not (isinstance(content, str) or content is None):
                content = "".join(p.text for p in content)
            messages.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # the template's own checks (e.g. roles must alternate)
            raise ApiError(400, f"the chat template rejected these messages: {err}", param="messages") from None
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise ApiError(400, "the messages render to no tokens", param="messages")
        return ids

    def completion_logprobs(self, body: CompletionRequest) -> Logprobs | None:
        """What /v1/completions' logprobs (and echo) ask for, checked: 0..MAX_LOGPROBS most likely tokens; the
        prompt's too with echo (a decoder-only target's)."""
        if body.logprobs is None:
            return None
        if isinstance(body.logprobs, bool) or not 0 <= body.logprobs <= MAX_LOGPROBS:
            raise ApiError(
                400, f"logprobs must be an integer in 0..{MAX_LOGPROBS}, got {body.logprobs!r}", param="logprobs"
            )
        if body.echo and self.pipe.target.is_encoder_decoder:
            raise ApiError(
                400,
                "echo with logprobs scores the prompt, which this model translates as its source: drop echo",
                param="echo",
            )
        if body.heal:
            raise ApiError(
                400,
                "heal re-tokenizes the prompt's end, so the answer's tokens would not be the text's: drop heal or "
                "logprobs",
                param="heal",
            )
        return Logprobs(top=body.logprobs, prompt=bool(body.echo))

    @staticmethod
    def chat_logprobs(body: ChatRequest) -> Logprobs | None:
        """What chat's logprobs / top_logprobs ask for, checked (top_logprobs needs logprobs, as OpenAI's)."""
        top = body.top_logprobs
        if top is not None and (isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise ApiError(
                400, f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {top!r}", param="top_logprobs"
            )
        if not body.logprobs:
            if top:
                raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return Logprobs(top=top or 0)

    def submit(
        self,
        ids: list[int],
        choices: list[SamplingParams],
        max_tokens: int,
        stop: list[str],
        speculation: Speculation,
        healing=None,
        streamed: bool = False,
        logprobs: Logprobs | None = None,
        echo: str | None = None,
        processing: Processing | None = None,
    ) -> list[Job]:
        """Queue a generation per choice for the worker (rows of one batch where it has room), or refuse them now:
        429 when the queue has no room for all, 503 when not running. logprobs: what the request reports; echo:
        the prompt's text, which the worker hands over with its log-probabilities (logprobs.prompt); processing:
        its penalties, logit bias, stop tokens and structured output."""
        settings = self.settings
        jobs = [
            Job(
                ids=ids,
                params=params,
                max_tokens=max_tokens,
                stop=stop,
                loop=asyncio.get_running_loop(),
                sink=asyncio.Queue(),
                healing=healing,
                speculation=speculation,
                index=index,
                stream_interval=settings.stream_interval if streamed else None,
                logprobs=logprobs,
                echo=echo if logprobs is not None and logprobs.prompt else None,
                processing=processing,
            )
            for index, params in enumerate(choices)
        ]
        try:
            self.engine.submit(*jobs)
        except QueueFull:
            self.metrics.rejected.labels("queue_full").inc()
            raise ApiError(
                429,
                f"the server is busy ({settings.max_queue} requests waiting); retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(settings.retry_after_s)},
            ) from None
        except NotRunning:
            self.metrics.rejected.labels("not_running").inc()
            raise ApiError(
                503,
                "the generation worker is not running (starting or shutting down)",
                type="server_error",
                headers={"Retry-After": str(5 * settings.retry_after_s)},
            ) from None
        return jobs

    async def stream_events(
        self, jobs: list[Job], chunk, first: list[str], endpoint: str, started: float, include_usage: bool
    ) -> AsyncIterator[str]:
        """The SSE body of a streamed generation, each chunk with its choice's index (chunk(piece, finish, index));
        the request is counted when the stream ends, however it ends."""
        status = "200"
        usages: list[dict] = []
        try:
            for index in range(len(jobs)):
                for piece in first:
                    yield sse(chunk(piece, None, index))
            async with aclosing(events(jobs)) as stream:
                async for index, event in stream:
                    if event[0] == "text":
                        yield sse(chunk(event[1], None, index, event[2]))
                    elif event[0] == "done":
                        yield sse(chunk(None, event[1], index))
                        usages.append(event[2])
                    else:
                        status = str(event[1].status)
                        yield sse(event[1].body())
            if include_usage and status == "200":
                final = chunk(None, None, 0)
                final["choices"] = []
                final["usage"] = summed_usage(usages)
                yield sse(final)
            yield "data: [DONE]\n\n"
        finally:
            for job in jobs:
                job.cancel()  # the client went away (or we finished): its rows leave the batch at the next step
            self.record(endpoint, status, started)

    def choices(self, body, params: SamplingParams, count: int | None = None) -> list[SamplingParams]:
        """The sampling settings of each of the request's n choices (or `count` candidates, best_of): choice i
        samples with seed + i (a seed given), so it is what a request with that seed gets alone; each waits in the
        queue as a row of its own."""
        n = 1 if body.n is None else body.n
        limit = min(MAX_CHOICES, self.settings.max_queue)
        for field, value in (("n", n), ("best_of", count)):
            if value is not None and not 1 <= value <= limit:
                raise ApiError(
                    400,
                    f"{field} must be in 1..{limit} (each choice is a row waiting in the queue, which holds "
                    f"{self.settings.max_queue}: --max-queue), got {value}",
                    param=field,
                )
        count = n if count is None else count
        return [params if params.seed is None else replace(params, seed=params.seed + i) for i in range(count)]


def check_best_of(body: CompletionRequest) -> int:
    """best_of: how many candidates the n choices are the best of (by cumulative log-probability; OpenAI's rule),
    checked: at least n, and not streamed when more than n (the best are known only when every candidate is done)."""
    n = 1 if body.n is None else body.n
    if body.best_of is None or body.best_of == n:
        return n
    if body.best_of < n:
        raise ApiError(
            400, f"best_of ({body.best_of}) must be >= n ({n}): the n choices are picked from it", param="best_of"
        )
    if body.stream:
        raise ApiError(
            400,
            f"best_of={body.best_of} > n={n} cannot be streamed: the best candidates are known only when all are "
            "done; drop stream or send best_of = n",
            param="best_of",
        )
    return body.best_of


def best_answers(answers: list[tuple[str, str, list[Scored]]], n: int) -> list[tuple[str, str, list[Scored]]]:
    """The n candidates with the highest cumulative log-probability of their tokens (best first; the earlier
    candidate where two tie). An echoed prompt's tokens add the same to every candidate."""

    def total(answer: tuple[str, str, list[Scored]]) -> float:
        return sum(s.entry.logprob for s in answer[2] if s.entry is not None)

    ranked = sorted(range(len(answers)), key=lambda i: (-total(answers[i]), i))
    return [answers[i] for i in ranked[:n]]


async def get_service(request: Request) -> Service:
    """The app's Service (async: a plain def dependency would run in the thread pool on every request)."""
    return request.app.state.service


async def authorized(request: Request, service: Service = Depends(get_service)) -> Service:
    """The Service, once the request's API key checks out (a dependency: it runs before the body is validated, so
    a client without the key hears 401 whatever it sent)."""
    service.check_key(request)
    return service


def _errors(*statuses: int) -> dict:
    return {status: {"model": ErrorResponse, "description": ERROR_WHEN[status]} for status in statuses}


ERROR_WHEN = {
    400: "A field the server cannot take (param names it): a bad value, an unknown field, a body that is not a "
    "JSON object, or a prompt and max_tokens over the context window (code context_length_exceeded)",
    401: "The server has an API key and the request did not send it (Authorization: Bearer KEY)",
    404: "The model is not the one this server serves (code model_not_found)",
    429: "The queue is full (code queue_full); retry after Retry-After seconds",
    500: "The generation failed (a bug or out of memory); the server goes on",
    503: "The generation worker is not running (starting or shutting down); retry after Retry-After seconds",
}
TEXT = {"type": "string"}
GENERATION_ERRORS = _errors(400, 401, 404, 429, 500, 503)
SSE_EVENT = {  # OpenAPI before 3.2: the schema of a text/event-stream is that of each event
    "type": "object",
    "properties": {"data": {"type": "string", "description": "A chunk of the answer as JSON, or [DONE] at the end"}},
    "required": ["data"],
}
STREAMED = {"text/event-stream": {"schema": SSE_EVENT}}

router = APIRouter()


def generation_route(path: str, response_model: type):
    """The route of a generation endpoint: POST at path, answered with response_model or, for a request that
    streams, with server-sent events, and documented with the errors every generation may end in."""
    return router.post(path, response_model=response_model, responses={200: {"content": STREAMED}, **GENERATION_ERRORS})


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Unavailable, "description": "The generation worker is not running"}},
)
async def health(service: Service = Depends(get_service)):
    if not service.engine.alive:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return {"status": "ok", "model": service.settings.model_name, "pid": os.getpid(), **service.engine.snapshot()}


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": TEXT}}}},
)
async def metrics_endpoint(service: Service = Depends(get_service)):
    return Response(service.metrics.render(), media_type=service.metrics.content_type)


@router.get("/v1/models", response_model=ModelList, responses=_errors(401))
async def models(service: Service = Depends(authorized)):
    service.metrics.requests.labels("/v1/models", "200").inc()
    return {
        "object": "list",
        "data": [
            {
                "id": service.settings.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "draftverify",
                "max_model_len": service.window,
                "speculative_methods": service.methods.names,
            }
        ],
    }


@generation_route("/v1/completions", Completion)
async def completions(body: CompletionRequest, request: Request, service: Service = Depends(authorized)):
    endpoint = "/v1/completions"
    started = time.perf_counter()
    if body.suffix:
        raise ApiError(400, "suffix (insertion) is not supported", param="suffix")
    logprobs = service.completion_logprobs(body)
    ids, prompt_text = service.completion_prompt(body)
    params, max_tokens, stop = service.check_common(body, body.max_tokens, len(ids), default_tokens=16)  # OpenAI's
    speculation = service.methods.resolve(body.speculative)
    n, candidates = 1 if body.n is None else body.n, check_best_of(body)
    # candidates are ranked by their tokens' log-probabilities, which the worker then reports for every one
    scored = logprobs if logprobs is not None or candidates == n else Logprobs()
    healing = None if scored is not None else service.healing_for(body, ids)
    processing = await service.processing_for(body)
    jobs = service.submit(
        ids,
        service.choices(body, params, candidates),
        max_tokens,
        stop,
        speculation,
        healing=healing,
        streamed=bool(body.stream),
        logprobs=scored,
        echo=prompt_text,
        processing=processing,
    )
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = service.settings.model_name
    echo = prompt_text if body.echo and jobs[0].echo is None else ""  # else the worker hands it over, scored

    def choice(text, finish, index=0, scored=None):
        written = None if logprobs is None or scored is None else completion_logprobs(scored, service.tokenizer)
        return {"text": text or "", "index": index, "logprobs": written, "finish_reason": finish}

    def chunk(text, finish, index=0, scored=None):
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice(text, finish, index, scored)],
        }

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        first = [echo] if echo else []
        return event_stream(service.stream_events(jobs, chunk, first, endpoint, started, include_usage))
    answers, usage = await collect(request, jobs)  # the usage counts every candidate's tokens, as OpenAI bills them
    if candidates > n:
        answers = best_answers(answers, n)
    out = chunk(None, None)
    out["choices"] = [choice(echo + text, reason, i, tokens) for i, (text, reason, tokens) in enumerate(answers)]
    out["usage"] = usage
    service.record(endpoint, "200", started)
    return out


@generation_route("/v1/chat/completions", ChatCompletion)
async def chat(body: ChatRequest, request: Request, service: Service = Depends(authorized)):
    endpoint = "/v1/chat/completions"
    started = time.perf_counter()
    ids = service.chat_prompt(body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params, max_tokens, stop = service.check_common(body, max_tokens, len(ids))
    logprobs = service.chat_logprobs(body)
    processing = await service.processing_for(body)
    jobs = service.submit(
        ids,
        service.choices(body, params),
        max_tokens,
        stop,
        service.methods.resolve(body.speculative),
        streamed=bool(body.stream),
        logprobs=logprobs,
        processing=processing,
    )
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = service.settings.model_name

    def written(scored):
        return None if logprobs is None or scored is None else chat_logprobs(scored, service.tokenizer)

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(piece, finish, index=0, scored=None):
            delta = (
                {} if piece is None else ({"role": "assistant", "content": ""} if piece is ROLE else {"content": piece})
            )
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": written(scored), "finish_reason": finish}],
            }

        return event_stream(service.stream_events(jobs, chunk, [ROLE], endpoint, started, include_usage))
    answers, usage = await collect(request, jobs)
    service.record(endpoint, "200", started)
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": written(scored),
                "finish_reason": reason,
            }
            for i, (text, reason, scored) in enumerate(answers)
        ],
        "usage": usage,
    }


async def _api_error(request: Request, err: ApiError):
    return request.app.state.service.error_response(err, request.url.path)


async def _invalid(request: Request, err: RequestValidationError):
    message, param = _validation_message(err)
    return request.app.state.service.error_response(ApiError(400, message, param=param), request.url.path)


async def _http_error(request: Request, err: StarletteHTTPException):
    """Starlette's own errors (no route, a method the route does not take, a body it cannot read) in the OpenAI
    shape; a 405 keeps the route's Allow header, as HTTP asks."""
    status, path = err.status_code, request.url.path
    if status == 404:
        error = ApiError(404, f"no route {request.method} {path}", code="not_found")
    elif status == 405:
        error = ApiError(405, f"method {request.method} is not allowed on {path}", headers=dict(err.headers or {}))
    else:
        error = ApiError(status, str(err.detail), headers=dict(err.headers or {}))
    return request.app.state.service.error_response(error, path)


def _integers(schema, **limits) -> None:
    """Set limits on every integer schema inside `schema` (a prompt's token ids, however nested)."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            schema.update(limits)
        for value in schema.values():
            _integers(value, **limits)
    elif isinstance(schema, list):
        for value in schema:
            _integers(value, **limits)


def below(n: int) -> str:
    """A regular expression of the decimal integers 0 .. n-1 as JSON writes them (no leading zeros): the token ids
    logit_bias may name, as the keys of an object."""
    top = str(n - 1)
    parts = ["[0-9]"] if len(top) > 1 else []
    parts += [f"[1-9][0-9]{{{k - 1}}}" for k in range(2, len(top))]
    for i, digit in enumerate(top):  # as long as top: its first i digits, then a smaller digit, then any
        low = 1 if i == 0 and len(top) > 1 else 0
        if int(digit) > low:
            rest = len(top) - i - 1
            smaller = str(low) if low == int(digit) - 1 else f"[{low}-{int(digit) - 1}]"
            parts.append(top[:i] + smaller + (f"[0-9]{{{rest}}}" if rest else ""))
    parts.append(top)
    return "^(" + "|".join(parts) + ")$"


def server_openapi(app: FastAPI) -> dict:
    """This server's OpenAPI document: the request and response models, with what this server takes filled in
    (its model name, its methods and draft lengths, token ids below its vocabulary, max_tokens within its limit and
    context); no 422 anywhere, as a body the models refuse is answered 400 (ERROR_WHEN)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from .. import __version__

    service: Service = app.state.service
    doc = get_openapi(title=app.title, version=__version__, description=app.description, routes=app.routes)
    for path in doc["paths"].values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    schemas = doc["components"]["schemas"]
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    ceilings = [x for x in (service.settings.max_tokens_limit, service.window and service.window - 1) if x]
    token_fields = {"CompletionRequest": ("max_tokens",), "ChatRequest": ("max_tokens", "max_completion_tokens")}
    for name, fields in token_fields.items():
        properties = schemas[name]["properties"]
        properties["model"]["enum"] = [service.settings.model_name]
        for field in fields:
            if ceilings:
                properties[field]["maximum"] = min(ceilings)
    vocab = service.pipe.target.vocab_size
    _integers(schemas["CompletionRequest"]["properties"]["prompt"], maximum=vocab - 1)
    # n: each choice waits in the queue as a row; logit_bias and stop_token_ids name this model's token ids
    for name in token_fields:
        properties = schemas[name]["properties"]
        properties["n"]["maximum"] = min(MAX_CHOICES, service.settings.max_queue)
        properties["logit_bias"]["propertyNames"] = {"pattern": below(vocab)}
        _integers(properties["stop_token_ids"], maximum=vocab - 1)
    speculative = schemas["Speculative"]["properties"]
    speculative["method"]["enum"] = [*service.methods.names, None]
    speculative["gamma"]["maximum"] = service.methods.longest_gamma
    app.openapi_schema = doc
    return doc


@asynccontextmanager
async def _lifespan(app: FastAPI):
    """The worker runs while the app serves; stopping it joins a thread, so it runs off the event loop."""
    engine = app.state.service.engine
    engine.start()
    try:
        yield
    finally:
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)


def create_app(pipe, settings: ServerSettings) -> FastAPI:
    """One app per pipeline, with its own Service (worker, queue, metrics registry): apps never share state."""
    service = Service(pipe, settings)
    app = FastAPI(
        title="draftverify",
        description="OpenAI-compatible speculative decoding server (draftverify serve)",
        lifespan=_lifespan,
    )
    app.state.service = service
    app.state.engine = service.engine  # the worker, for whoever holds the app (tests stop it, watch its queue)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(router)
    app.openapi = lambda: server_openapi(app)
    return app
