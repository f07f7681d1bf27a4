"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

create_app(pipe, ...) wraps a loaded Pipeline; the generation itself runs in the Engine's worker thread.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from ..checks import check_prompt_text
from ..errors import DraftVerifyError
from ..types import SamplingParams
from .engine import Engine, Job, NotRunning, QueueFull
from .metrics import Metrics
from .protocol import ApiError, ChatRequest, CompletionRequest

MAX_STOP_STRINGS = 4


class ServerSettings:
    def __init__(self, model_name: str, api_key: str | None = None, max_queue: int = 64, max_batch: int = 1,
                 max_tokens_limit: int | None = None, gamma: int | str | None = None,
                 retry_after_s: int = 1):
        self.model_name = model_name
        self.api_key = api_key or None
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.max_tokens_limit = max_tokens_limit
        self.gamma = gamma
        self.retry_after_s = retry_after_s


def context_window(pipe) -> int | None:
    """Decoder positions a request may use: the target's limit, and the draft model's when there is one."""
    limits = [pipe.target.max_positions]
    drafter = pipe.drafter
    for lm in (getattr(drafter, "lm", None), getattr(getattr(drafter, "model", None), "lm", None)):
        if lm is not None:
            limits.append(lm.max_positions)
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def _validation_message(err: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    errors = err.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON: " + str(first.get("ctx", {}).get("error", first.get("msg"))), None
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        unknown = sorted({".".join(str(x) for x in e.get("loc", ()) if x != "body") for e in errors
                          if e.get("type") == "extra_forbidden"})
        return f"unknown field(s): {', '.join(unknown)} (draftverify does not support them)", unknown[0]
    if first.get("type") == "missing":
        return f"missing required field: {param}", param
    return f"invalid value for {param}: {first.get('msg')}", param


def create_app(pipe, settings: ServerSettings) -> FastAPI:
    metrics = Metrics()
    engine = Engine(pipe, metrics, max_queue=settings.max_queue, max_batch=settings.max_batch, gamma=settings.gamma)
    window = context_window(pipe)
    tokenizer = pipe.tokenizer
    has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    app = FastAPI(title="draftverify", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.settings = settings

    def error_response(err: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(err, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        message, param = _validation_message(err)
        return error_response(ApiError(400, message, param=param), request.url.path)

    @app.exception_handler(404)
    async def _not_found(request: Request, err):
        return error_response(ApiError(404, f"no route {request.method} {request.url.path}", code="not_found"),
                              request.url.path)

    @app.exception_handler(405)
    async def _bad_method(request: Request, err):
        return error_response(ApiError(405, f"method {request.method} is not allowed on {request.url.path}"),
                              request.url.path)

    def check_key(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), settings.api_key.encode()):
            raise ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def parse(request: Request, model_cls):
        try:
            raw = await request.body()
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ApiError(400, f"the request body is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            return model_cls.model_validate(data)
        except ValidationError as err:
            message, param = _validation_message(err)
            raise ApiError(400, message, param=param) from None

    def check_common(body, max_tokens: int | None, prompt_tokens: int) -> tuple[SamplingParams, int, list[str]]:
        if body.model != settings.model_name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {settings.model_name!r}",
                           param="model", code="model_not_found")
        if body.n not in (None, 1):
            raise ApiError(400, f"n={body.n} is not supported: one choice per request (send n requests)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(body, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported (only 0): it would change the target's distribution, "
                                    "which draft-then-verify reproduces exactly", param=name)
        if body.logit_bias:
            raise ApiError(400, "logit_bias is not supported", param="logit_bias")
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
            raise ApiError(400, f"this model's context is {window} tokens and the prompt has {prompt_tokens}: "
                                "no room for any completion; shorten the prompt", param="prompt",
                           code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = room if room is not None else 256
            if settings.max_tokens_limit is not None:
                max_tokens = min(max_tokens, settings.max_tokens_limit)
        if isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {max_tokens}", param="max_tokens")
        if settings.max_tokens_limit is not None and max_tokens > settings.max_tokens_limit:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's limit of "
                                f"{settings.max_tokens_limit}", param="max_tokens")
        if room is not None and max_tokens > room:
            raise ApiError(400, f"this model's context is {window} tokens; the prompt has {prompt_tokens} and "
                                f"max_tokens asks for {max_tokens} more ({prompt_tokens + max_tokens} in all): lower "
                                "max_tokens or shorten the prompt", param="max_tokens", code="context_length_exceeded")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", param="stop")
        try:
            params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=body.seed)
        except DraftVerifyError as err:
            raise ApiError(400, str(err)) from None
        return params, max_tokens, stop

    def encode_text(text: str) -> list[int]:
        ids = tokenizer(text).input_ids
        if not ids:
            raise ApiError(400, "the prompt tokenizes to no tokens: give some text", param="prompt")
        return ids

    def completion_prompt(body: CompletionRequest) -> tuple[list[int], str]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, f"one prompt per request, got {len(prompt)} (send one request per prompt)",
                               param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            try:
                check_prompt_text(prompt)  # the CLI's and the API's rules: not empty, not only whitespace
            except DraftVerifyError as err:
                raise ApiError(400, str(err), param="prompt") from None
            return encode_text(prompt), prompt
        ids = list(prompt)
        if not ids:
            raise ApiError(400, "the prompt is empty: give at least one token", param="prompt")
        vocab = pipe.target.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        return ids, tokenizer.decode(ids)

    def submit(ids: list[int], params: SamplingParams, max_tokens: int, stop: list[str]) -> Job:
        job = Job(ids=ids, params=params, max_tokens=max_tokens, stop=stop, loop=asyncio.get_running_loop(),
                  sink=asyncio.Queue())
        try:
            engine.submit(job)
        except QueueFull:
            metrics.rejected.labels("queue_full").inc()
            raise ApiError(429, f"the server is busy ({settings.max_queue} requests waiting); retry later",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(settings.retry_after_s)}) from None
        except NotRunning:
            metrics.rejected.labels("not_running").inc()
            raise ApiError(503, "the generation worker is not running (starting or shutting down)",
                           type="server_error", headers={"Retry-After": str(5 * settings.retry_after_s)}) from None
        return job

    async def watch_disconnect(request: Request, job: Job) -> None:
        while not job.done:
            if await request.is_disconnected():
                job.cancel()
                return
            await asyncio.sleep(0.05)

    async def collect(request: Request, job: Job) -> tuple[str, str, dict]:
        watcher = asyncio.ensure_future(watch_disconnect(request, job))
        pieces: list[str] = []
        try:
            while True:
                event = await job.sink.get()
                if event[0] == "text":
                    pieces.append(event[1])
                elif event[0] == "done":
                    return "".join(pieces), event[1], event[2]
                else:
                    raise event[1]
        finally:
            watcher.cancel()
            job.cancel()  # no-op once done; frees the row if this handler was cancelled

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def stream_events(job: Job, chunk, first: list[dict], endpoint: str, started: float,
                            include_usage: bool) -> AsyncIterator[str]:
        status = "200"
        try:
            for piece in first:
                yield sse(chunk(piece, None))
            while True:
                event = await job.sink.get()
                if event[0] == "text":
                    yield sse(chunk(event[1], None))
                elif event[0] == "done":
                    yield sse(chunk(None, event[1]))
                    if include_usage:
                        final = chunk(None, None)
                        final["choices"] = []
                        final["usage"] = event[2]
                        yield sse(final)
                    break
                else:
                    status = str(event[1].status)
                    yield sse(event[1].body())
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # the client went away (or we finished): its row leaves the batch at the next step
            metrics.requests.labels(endpoint, status).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok", "model": settings.model_name, "pid": os.getpid(), **engine.snapshot()}

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        metrics.requests.labels("/v1/models", "200").inc()
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "draftverify", "max_model_len": window}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        endpoint = "/v1/completions"
        started = time.perf_counter()
        check_key(request)
        body: CompletionRequest = await parse(request, CompletionRequest)
        if body.best_of not in (None, 1):
            raise ApiError(400, f"best_of={body.best_of} is not supported (only 1)", param="best_of")
        if body.logprobs is not None:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        if body.suffix:
            raise ApiError(400, "suffix (insertion) is not supported", param="suffix")
        ids, prompt_text = completion_prompt(body)
        params, max_tokens, stop = check_common(body, 16 if body.max_tokens is None else body.max_tokens, len(ids))
        job = submit(ids, params, max_tokens, stop)
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        echo = prompt_text if body.echo else ""

        def chunk(text, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": settings.model_name,
                    "choices": [{"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}]}

        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            first = [echo] if echo else []
            return StreamingResponse(stream_events(job, chunk, first, endpoint, started, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, reason, usage = await collect(request, job)
        out = chunk(echo + text, reason)
        out["usage"] = usage
        metrics.requests.labels(endpoint, "200").inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return out

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        endpoint = "/v1/chat/completions"
        started = time.perf_counter()
        check_key(request)
        body: ChatRequest = await parse(request, ChatRequest)
        if not has_chat_template:
            raise ApiError(400, f"the model {settings.model_name!r} has no chat template (its tokenizer defines "
                                "none), so it cannot take chat messages; use /v1/completions with a plain prompt",
                           param="messages", code="no_chat_template")
        if body.logprobs or body.top_logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        if body.response_format not in (None, {"type": "text"}):
            raise ApiError(400, "response_format other than {'type': 'text'} is not supported",
                           param="response_format")
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
        messages = []
        for m in body.messages:
            content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
            messages.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # the template's own checks (e.g. roles must alternate)
            raise ApiError(400, f"the chat template rejected these messages: {err}", param="messages") from None
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise ApiError(400, "the messages render to no tokens", param="messages")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params, max_tokens, stop = check_common(body, max_tokens, len(ids))
        job = submit(ids, params, max_tokens, stop)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)

            def chunk(piece, finish):
                delta = {} if piece is None else ({"role": "assistant", "content": ""} if piece is ROLE
                                                  else {"content": piece})
                return {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": settings.model_name,
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

            return StreamingResponse(stream_events(job, chunk, [ROLE], endpoint, started, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, reason, usage = await collect(request, job)
        metrics.requests.labels(endpoint, "200").inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return {"id": cid, "object": "chat.completion", "created": created, "model": settings.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": reason}],
                "usage": usage}

    return app


class _Role(str):
    """Marker for the first chat chunk (delta with the assistant role)."""


ROLE = _Role("")

