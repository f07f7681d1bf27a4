"""The server's queue and worker with a stub pipeline (no model): 429 when the queue is full, 503 when the worker
is not running, requests cancelled while queued never run, a tokenizer without a chat template is a clear 400,
and StopText's streaming detokenization."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import torch
from serve_fixtures import TOKENIZER, InProcessServer
from transformers import AutoTokenizer

from draftverify.errors import DraftVerifyError
from draftverify.serve.app import ServerSettings, create_app
from draftverify.serve.engine import StopText
from draftverify.types import GenerationStats


class StubPipe:
    """Emits token `7` per step, one step per `release()` (or at once when free-running)."""

    def __init__(self, tokenizer, mixes_sampling: bool = False):
        self.tokenizer = tokenizer
        self.mixes_sampling = mixes_sampling  # the method judges each row by its own sampling settings
        self.method = SimpleNamespace(name="model")
        self.gamma = 4
        self.params: list = []  # the settings of every row each batch held
        self.target = SimpleNamespace(max_positions=64, vocab_size=len(tokenizer))
        self.drafter = SimpleNamespace(models=lambda: [])  # calls no draft model
        self.eos_token_id = tokenizer.eos_token_id
        self.gate = threading.Semaphore(0)
        self.free = False
        self.batches: list[list[list[int]]] = []
        self.gammas: list = []  # each batch's draft length

    def release(self, steps: int = 1000) -> None:
        for _ in range(steps):
            self.gate.release()

    def generate_batch_ids(
        self, rows, params, max_new_tokens, seeds=None, gamma=None, on_tokens=None, admit=None, on_step=None
    ):
        rows = list(rows)
        self.batches.append(rows)
        self.gammas.append(gamma)
        row_params = list(params) if isinstance(params, list) else [params] * len(rows)
        self.params.append(row_params)
        limits = list(max_new_tokens) if isinstance(max_new_tokens, list) else [max_new_tokens] * len(rows)
        active = set(range(len(rows)))
        done = [0] * len(rows)
        while active:
            if not self.free:
                self.gate.acquire(timeout=30)
            emitted = torch.full((len(rows), 1), -1)
            for b in active:
                emitted[b, 0] = 7
                done[b] += 1
            stop = on_tokens(emitted) or []
            active -= set(stop) | {b for b in active if done[b] >= limits[b]}
            if active and admit is not None:  # continuous batching: rows join between steps
                for request in admit():
                    row_params.append(request.params)
                    active.add(len(rows))
                    rows.append(request.prompt_ids)
                    limits.append(request.max_new_tokens)
                    done.append(0)
        return SimpleNamespace(stats=GenerationStats(target_calls=1)), "greedy"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER)


@pytest.fixture
def stub_server(tokenizer):
    pipe = StubPipe(tokenizer)
    app = create_app(pipe, ServerSettings(model_name="stub", max_queue=1, max_batch=1))
    server = InProcessServer(app)
    server.pipe = pipe
    server.app = app
    yield server
    pipe.free = True
    pipe.release()
    server.stop()


def _post(base: str, results: list, **extra) -> None:
    body = {"model": "stub", "prompt": "hello", "max_tokens": 3, "temperature": 0, **extra}
    results.append(httpx.post(base + "/v1/completions", json=body, timeout=30))


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_full_queue_answers_429_with_retry_after(stub_server):
    engine = stub_server.app.state.engine
    results: list = []
    first = threading.Thread(target=_post, args=(stub_server.base, results))
    first.start()
    assert _wait(lambda: engine.busy_rows == 1)  # running, held at its first step
    second = threading.Thread(target=_post, args=(stub_server.base, results))
    second.start()
    assert _wait(lambda: engine.snapshot()["queued"] == 1)
    r = httpx.post(stub_server.base + "/v1/completions", json={"model": "stub", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "queue_full"
    stub_server.pipe.free = True
    stub_server.pipe.release()
    first.join(30)
    second.join(30)
    assert [x.status_code for x in results] == [200, 200]
    assert all(x.json()["usage"]["completion_tokens"] == 3 for x in results)


def test_a_request_cancelled_while_queued_never_runs(stub_server):
    engine = stub_server.app.state.engine
    results: list = []
    first = threading.Thread(target=_post, args=(stub_server.base, results))
    first.start()
    assert _wait(lambda: engine.busy_rows == 1)
    body = {"model": "stub", "prompt": "queued and abandoned", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", stub_server.base + "/v1/completions", json=body, timeout=30):
        assert _wait(lambda: engine.snapshot()["queued"] == 1)
    time.sleep(0.2)  # the server notices the closed stream
    stub_server.pipe.free = True
    stub_server.pipe.release()
    first.join(30)
    assert _wait(lambda: engine.snapshot()["queued"] == 0 and engine.busy_rows == 0)
    assert len(stub_server.pipe.batches) == 1  # only the first request ever ran


def test_a_stopped_worker_answers_503(stub_server):
    stub_server.pipe.free = True
    stub_server.app.state.engine.stop()
    r = httpx.post(stub_server.base + "/v1/completions", json={"model": "stub", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and "retry-after" in r.headers
    assert httpx.get(stub_server.base + "/health").status_code == 503


def test_chat_without_a_template_is_a_clear_400(stub_server):
    r = httpx.post(
        stub_server.base + "/v1/chat/completions",
        json={"model": "stub", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "no_chat_template" and "use /v1/completions" in error["message"]


def test_unknown_routes_and_methods_are_openai_style(stub_server):
    r = httpx.get(stub_server.base + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(stub_server.base + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_requests_with_the_same_settings_share_a_batch(tokenizer):
    pipe = StubPipe(tokenizer)
    app = create_app(pipe, ServerSettings(model_name="stub", max_queue=8, max_batch=3))
    server = InProcessServer(app)
    try:
        results: list = []
        first = threading.Thread(target=_post, args=(server.base, results))
        first.start()
        assert _wait(lambda: app.state.engine.busy_rows == 1)
        others = [
            threading.Thread(target=_post, args=(server.base, results), kwargs=extra)
            for extra in ({}, {}, {"temperature": 0.5}, {})
        ]
        for t in others:
            t.start()
        assert _wait(lambda: app.state.engine.snapshot()["queued"] == 4)
        pipe.free = True
        pipe.release()
        for t in [first, *others]:
            t.join(30)
        # the greedy rows join the running batch as rows leave it (at most 3 at once); the sampled one runs apart
        assert sorted(len(b) for b in pipe.batches) == [1, 4]
        assert all(r.status_code == 200 for r in results)
        assert all(r.json()["usage"]["completion_tokens"] == 3 for r in results)
    finally:
        pipe.free = True
        pipe.release()
        server.stop()


def test_requests_with_different_settings_share_a_batch_when_rows_keep_their_own(tokenizer):
    """A method whose verifier judges rows apart (the lossless methods' exact rule): a sampled request joins the
    greedy ones' batch and keeps its own settings."""
    pipe = StubPipe(tokenizer, mixes_sampling=True)
    app = create_app(pipe, ServerSettings(model_name="stub", max_queue=8, max_batch=4))
    server = InProcessServer(app)
    try:
        results: list = []
        first = threading.Thread(target=_post, args=(server.base, results))
        first.start()
        assert _wait(lambda: app.state.engine.busy_rows == 1)
        others = [
            threading.Thread(target=_post, args=(server.base, results), kwargs=extra)
            for extra in ({}, {"temperature": 0.5, "seed": 3}, {})
        ]
        for t in others:
            t.start()
        assert _wait(lambda: app.state.engine.snapshot()["queued"] == 3)
        pipe.free = True
        pipe.release()
        for t in [first, *others]:
            t.join(30)
        assert [len(b) for b in pipe.batches] == [4]  # one batch: the sampled request joined the greedy ones
        temperatures = sorted(p.temperature for p in pipe.params[0])
        assert temperatures == [0.0, 0.0, 0.0, 0.5]
        assert [p.seed for p in pipe.params[0] if p.temperature == 0.5] == [3]
        assert all(r.status_code == 200 for r in results)
    finally:
        pipe.free = True
        pipe.release()
        server.stop()


def _stream_texts(base: str, max_tokens: int) -> list[str]:
    """The text of each chunk of a streamed completion."""
    body = {"model": "stub", "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return [json.loads(line[6:])["choices"][0]["text"] for line in lines]


@pytest.mark.parametrize("interval, chunks", [(0.0, 5), (10.0, 2)])
def test_a_stream_hands_over_text_at_most_once_per_interval(tokenizer, interval, chunks):
    """--stream-interval: 0 sends every step's text at once; a long interval sends the first step's text at once and
    the rest when the request ends. Either way the chunks add up to the whole text, and a whole (non-streamed)
    request gets it in one piece."""
    pipe = StubPipe(tokenizer)
    pipe.free = True  # five steps in a row, well within the long interval
    app = create_app(pipe, ServerSettings(model_name="stub", stream_interval=interval))
    server = InProcessServer(app)
    try:
        pieces = [text for text in _stream_texts(server.base, max_tokens=5) if text]
        assert len(pieces) == chunks
        whole = httpx.post(server.base + "/v1/completions", json={"model": "stub", "prompt": "hello", "max_tokens": 5})
        assert "".join(pieces) == whole.json()["choices"][0]["text"] == tokenizer.decode([7] * 5)
    finally:
        pipe.free = True
        pipe.release()
        server.stop()


def test_a_whole_request_whose_client_leaves_is_cancelled(stub_server):
    """A non-streamed request: the server waits for the client's disconnect (no polling) and frees the row."""
    engine = stub_server.app.state.engine
    body = {"model": "stub", "prompt": "abandoned", "max_tokens": 50}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stub_server.base + "/v1/completions", json=body, timeout=0.5)  # held at its first step
    time.sleep(0.2)  # the server notices the closed connection
    stub_server.pipe.release(3)
    assert _wait(lambda: engine.busy_rows == 0)
    metrics = httpx.get(stub_server.base + "/metrics").text
    assert 'draftverify_finished_requests_total{reason="cancelled"} 1.0' in metrics


@pytest.mark.parametrize("interval", [-0.1, 11.0, float("nan"), True, "0.1"])
def test_a_bad_stream_interval_is_refused_naming_the_flag(interval):
    with pytest.raises(DraftVerifyError, match="--stream-interval must be"):
        ServerSettings(model_name="m", stream_interval=interval)


def test_stop_text_holds_back_possible_stop_strings_and_partial_characters(tokenizer):
    ids = tokenizer("hello world, héllo again").input_ids
    whole = tokenizer.decode(ids)
    streamer = StopText(tokenizer, [])
    assert "".join(streamer.push([t]) for t in ids) + streamer.finish() == whole
    streamer = StopText(tokenizer, ["o ag"])
    pieces = [streamer.push([t]) for t in ids]
    assert streamer.stopped and "".join(pieces) + streamer.finish() == whole[: whole.index("o ag")]
    streamer = StopText(tokenizer, ["zzz"])
    out = [streamer.push([t]) for t in ids]
    assert all("\ufffd" not in piece for piece in out)
    assert "".join(out) + streamer.finish() == whole and not streamer.stopped


def test_stop_text_streams_exactly_the_whole_decode(tokenizer):
    """Incremental decoding (only the tokens since the last boundary) gives the whole text's decode, even for random
    token ids that split multi-byte characters."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(5):
        ids = torch.randint(0, len(tokenizer), (300,), generator=gen).tolist()
        streamer = StopText(tokenizer, [])
        pieces = []
        for start in range(0, len(ids), 3):
            pieces.append(streamer.push(ids[start : start + 3]))
        assert "".join(pieces) + streamer.finish() == tokenizer.decode(ids, skip_special_tokens=True)


def _answer(tokenizer, ids: list[int], stops: list[str], chunk: int, healing=None) -> tuple[str, list[int]]:
    streamer = StopText(tokenizer, stops, healing)
    pieces = []
    for start in range(0, len(ids), chunk):
        pieces.append(streamer.push(ids[start : start + chunk]))
        if streamer.stopped:
            break
    return "".join(pieces) + streamer.finish(), streamer.ids


@pytest.mark.parametrize(
    "stops",
    [["y = 2\nx"], ["x = 2"], ["y = 2\nx = 2\ny", "x ="], ["2\nx = 2\n", "= 2\ny"], ["\u00e9"], ["zzz"]],
)
def test_stop_text_ends_where_one_token_at_a_time_ends_whatever_a_push_brings(tokenizer, stops):
    """A speculative step pushes several tokens: the answer still ends at the token that completed the first stop
    string completed, its text and its tokens (what usage counts) those of one token at a time, the tokens drafted
    past it dropped. With several stop strings, the one completed first ends it (not the one that starts first)."""
    ids = tokenizer("y = 2\nx = 2\ny = 2\nx = 2\nh\u00e9llo y = 2\n").input_ids
    alone = _answer(tokenizer, ids, stops, 1)
    for chunk in (2, 3, 5, 8, len(ids)):
        assert _answer(tokenizer, ids, stops, chunk) == alone, chunk
    text, kept = alone
    if stops == ["zzz"]:
        assert kept == ids
    else:  # the last kept token completed a stop string: without it, no stop string shows
        assert not any(s in tokenizer.decode(kept[:-1]) for s in stops) and any(
            s in tokenizer.decode(kept) for s in stops
        )
    if stops == ["y = 2\nx = 2\ny", "x ="]:
        assert text == "y = 2\n"  # "x =" completed first, though the other starts earlier


def test_stop_text_of_a_healed_prompt_starts_after_the_original_prompt(tokenizer):
    """Token healing: the first token re-emits the removed text ("\\n"), which is neither sent again nor searched
    for stop strings; everything after it streams as usual."""
    from draftverify.healing import TokenTable

    prompt = 'def f(x):\n    """Return x."""\n'
    healing = TokenTable(tokenizer).heal(tokenizer(prompt).input_ids)
    assert healing is not None and healing.removed == "\n"
    new = tokenizer(prompt + "    return x\n\ndef g():\n    pass\n").input_ids[len(healing.ids) :]
    assert tokenizer.decode(new).startswith("\n    return")  # the first new token is "\n" + indentation
    completion = "    return x\n\ndef g():\n    pass\n"
    for stops, expected in (([], completion), (["\ndef "], "    return x\n"), (["\n    "], "    return x\n\ndef g():")):
        streamer = StopText(tokenizer, stops, healing)
        pieces = [streamer.push([t]) for t in new]
        assert "".join(pieces) + streamer.finish() == expected, stops
        assert _answer(tokenizer, new, stops, 4, healing) == _answer(tokenizer, new, stops, 1, healing)  # by steps
    # the "\n    " stop string would match at once if the removed "\n" counted; it matches only inside g


def test_requests_with_another_draft_length_wait_for_a_batch_of_their_own(tokenizer):
    """speculative.gamma (and method) is part of what a batch shares: a waiting request with the running batch's
    setting joins it, the others run together afterwards with theirs."""
    pipe = StubPipe(tokenizer, mixes_sampling=True)
    app = create_app(pipe, ServerSettings(model_name="stub", max_queue=8, max_batch=4))
    server = InProcessServer(app)
    try:
        results: list = []
        first = threading.Thread(target=_post, args=(server.base, results))
        first.start()
        assert _wait(lambda: app.state.engine.busy_rows == 1)
        others = [
            threading.Thread(target=_post, args=(server.base, results), kwargs=extra)
            for extra in ({"speculative": {"gamma": 2}}, {}, {"speculative": {"gamma": 2}})
        ]
        for t in others:
            t.start()
        assert _wait(lambda: app.state.engine.snapshot()["queued"] == 3)
        pipe.free = True
        pipe.release()
        for t in [first, *others]:
            t.join(30)
        assert [len(b) for b in pipe.batches] == [2, 2] and pipe.gammas == [4, 2]  # the server's gamma, then 2
        assert all(r.status_code == 200 for r in results)
    finally:
        pipe.free = True
        pipe.release()
        server.stop()
