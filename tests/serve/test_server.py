"""`draftverify serve` as a real process on a loopback port, driven by the official openai client (and httpx for
what the client hides: raw error bodies, status codes, disconnects). The texts must equal the library's own."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from serve_fixtures import API_KEY, CONTEXT, ServerProcess, make_models

from draftverify.api import load
from draftverify.errors import DraftVerifyError

PROMPTS = ["def quicksort(xs):\n    ", "import os\n", "class Stack:\n    def push(self, x):", "x = [1, 2, 3]\n"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-models"))


@pytest.fixture(scope="module")
def server(models):
    proc = ServerProcess(
        [
            "--target",
            str(models / "target"),
            "--draft",
            str(models / "draft"),
            "--method",
            "model",
            "--served-model-name",
            "tiny",
            "--max-batch",
            "4",
            "--max-queue",
            "16",
            "--threads",
            "1",
            "--max-tokens-limit",
            "200",
        ],
        env={"DRAFTVERIFY_API_KEY": API_KEY},
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def pipe(models):
    return load(target=models / "target", draft=models / "draft", method="model", gamma=4)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def auth() -> dict:
    return {"Authorization": f"Bearer {API_KEY}"}


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(server.base + "/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 4


def test_completion_equals_the_library_text(client, pipe):
    expected = pipe.generate(PROMPTS[0], max_new_tokens=24)
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=24, temperature=0)
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == ("length" if expected.stats.new_tokens == 24 else "stop")
    assert out.usage.completion_tokens == expected.stats.new_tokens
    assert out.usage.prompt_tokens == pipe.encode(PROMPTS[0]).shape[1]


def test_streamed_completion_equals_the_whole_one(client):
    whole = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=30, temperature=0)
    pieces, reasons = [], []
    for chunk in client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=30, temperature=0, stream=True):
        pieces.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == whole.choices[0].text
    assert len(pieces) > 2 and reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}


def test_echo_and_stop_strings(client):
    whole = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=30, temperature=0).choices[0].text
    echoed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=30, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + whole
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    cut = whole[: whole.index(stop)]
    for stream in (False, True):
        if stream:
            text = "".join(
                c.choices[0].text
                for c in client.completions.create(
                    model="tiny", prompt=PROMPTS[0], max_tokens=30, temperature=0, stop=[stop], stream=True
                )
            )
        else:
            out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=30, temperature=0, stop=stop)
            text = out.choices[0].text
            assert out.choices[0].finish_reason == "stop"
        assert text == cut


def test_chat_completion_uses_the_template(client, pipe):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "sort a list"}]
    rendered = pipe.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = pipe.generate(rendered, max_new_tokens=20).text
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == expected
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_completion_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens and not chunks[-1].choices


def test_seeded_sampling_is_reproducible_and_equals_the_library(client, pipe):
    texts = {
        client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=20, temperature=0.9, seed=11, top_p=0.95)
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1
    assert texts == {pipe.generate(PROMPTS[2], max_new_tokens=20, temperature=0.9, top_p=0.95, seed=11).text}
    other = (
        client.completions.create(
            model="tiny",
            prompt=PROMPTS[2],
            max_tokens=20,
            temperature=0.9,
            seed=12,
            top_p=0.95,
            extra_body={"top_k": 50},
        )
        .choices[0]
        .text
    )
    assert other != texts.pop()


def test_concurrent_requests_share_a_batch_and_keep_their_texts(server, client, pipe):
    """Requests arriving together are decoded as one batch; each text equals its own batch-1 text."""
    expected = [pipe.generate(p, max_new_tokens=40).text for p in PROMPTS]
    seeded = [pipe.generate(p, max_new_tokens=40, temperature=0.8, seed=i).text for i, p in enumerate(PROMPTS)]
    before = _metric(server, "draftverify_batch_size_sum")
    results: dict = {}

    def ask(i: int, sampled: bool) -> None:
        extra = dict(temperature=0.8, seed=i) if sampled else dict(temperature=0)
        results[(i, sampled)] = (
            client.completions.create(model="tiny", prompt=PROMPTS[i], max_tokens=40, **extra).choices[0].text
        )

    threads = [threading.Thread(target=ask, args=(i, s)) for s in (False, True) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[(i, False)] for i in range(len(PROMPTS))] == expected
    assert [results[(i, True)] for i in range(len(PROMPTS))] == seeded
    rows = _metric(server, "draftverify_batch_size_sum") - before
    batches = _metric(server, "draftverify_batch_size_count")
    assert rows == 2 * len(PROMPTS) and batches >= 1


def _metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(server.base + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return 0.0


def test_api_key_is_required(server):
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="x", max_tokens=2)
    r = httpx.post(server.base + "/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.base + "/v1/models").status_code == 401
    assert httpx.get(server.base + "/health").status_code == 200  # probes need no key
    assert httpx.get(server.base + "/metrics").status_code == 200


BAD_REQUESTS = [
    (b'{"model": "tiny", "prompt": ', 400, "not valid JSON", None),
    (b"[1, 2]", 400, "must be a JSON object", None),
    ({"model": "tiny", "prompt": "x", "logprobz": 3}, 400, "unknown field", "logprobz"),
    ({"prompt": "x"}, 400, "missing required field: model", "model"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens must be an integer >= 1", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": -5}, 400, "max_tokens must be an integer >= 1", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 10**9}, 400, "above this server's limit", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "many"}, 400, "invalid value for max_tokens", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "n": 0}, 400, "n must be in 1..", "n"),
    ({"model": "tiny", "prompt": "x", "n": 129}, 400, "n must be in 1..", "n"),
    ({"model": "tiny", "prompt": "x", "n": 2, "best_of": 3, "stream": True}, 400, "cannot be streamed", "best_of"),
    ({"model": "tiny", "prompt": "x", "best_of": 200}, 400, "best_of must be in 1..", "best_of"),
    ({"model": "tiny", "prompt": "x", "n": 3, "best_of": 2}, 400, "must be >= n", "best_of"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature must be between 0 and 2", "temperature"),
    ({"model": "tiny", "prompt": "x", "temperature": 7}, 400, "temperature must be between 0 and 2", "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p must be in", "top_p"),
    ({"model": "tiny", "prompt": "x", "presence_penalty": 3}, 400, "presence_penalty: must be in", "presence_penalty"),
    ({"model": "tiny", "prompt": "x", "logprobs": 6}, 400, "logprobs must be an integer in 0..5", "logprobs"),
    ({"model": "tiny", "prompt": ""}, 400, "prompt is empty", "prompt"),
    ({"model": "tiny", "prompt": "   "}, 400, "only whitespace", "prompt"),
    ({"model": "tiny", "prompt": ["\n\t"]}, 400, "only whitespace", "prompt"),
    ({"model": "tiny", "prompt": ["a", "b"]}, 400, "one prompt per request", "prompt"),
    ({"model": "tiny", "prompt": [1, 2, 10**7]}, 400, "prompt token ids must be in", "prompt"),
    ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop strings", "stop"),
    ({"model": "tiny", "prompt": "x", "heal": "yes"}, 400, "invalid value for heal", "heal"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "does not exist", "model"),
]


@pytest.mark.parametrize("body, status, message, param", BAD_REQUESTS)
def test_bad_requests_get_openai_style_errors(server, body, status, message, param):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.base + "/v1/completions", headers={**auth(), "Content-Type": "application/json"}, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["type"] and (param is None or error["param"] == param)


def test_prompt_over_the_context_is_a_400(server, client):
    long_prompt = "def f(x):\n    return x\n" * CONTEXT
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=4)
    assert caught.value.code == "context_length_exceeded"
    medium = "def f(x):\n    return x\n" * 12  # well under the context, but not with 190 tokens more
    with pytest.raises(openai.BadRequestError, match="lower max_tokens") as caught:
        client.completions.create(model="tiny", prompt=medium, max_tokens=190)
    assert caught.value.code == "context_length_exceeded"


def test_chat_errors(server):
    url = server.base + "/v1/chat/completions"
    r = httpx.post(url, headers=auth(), json={"model": "tiny", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(
        url,
        headers=auth(),
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    )
    assert r.status_code == 400 and "unknown field(s): tools" in r.json()["error"]["message"]
    r = httpx.post(url, headers=auth(), json={"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["param"]


def test_a_client_leaving_mid_stream_frees_its_row(server, client):
    cancelled = _metric(server, "draftverify_finished_requests_total", '{reason="cancelled"}')
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, headers=auth(), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                json.loads(line[6:])
                break  # one chunk read; closing the response drops the connection
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(server.base + "/health").json()
        if (
            health["running_rows"] == 0
            and _metric(server, "draftverify_finished_requests_total", '{reason="cancelled"}') > cancelled
        ):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the abandoned request kept generating")
    generated = _metric(server, "draftverify_generated_tokens_total")
    time.sleep(0.5)
    assert _metric(server, "draftverify_generated_tokens_total") == generated  # nothing runs for it any more
    out = client.completions.create(model="tiny", prompt="x", max_tokens=3, temperature=0)  # the server goes on
    assert out.usage.completion_tokens >= 1


def test_metrics_count_requests_and_tokens(server, client):
    client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=5, temperature=0)
    text = httpx.get(server.base + "/metrics").text
    for name in (
        "draftverify_requests_total",
        "draftverify_generated_tokens_total",
        "draftverify_target_calls_total",
        "draftverify_time_to_first_token_seconds_bucket",
        "draftverify_queue_depth",
        "draftverify_accepted_tokens_total",
        "draftverify_batch_size_bucket",
    ):
        assert name in text
    assert _metric(server, "draftverify_requests_total", '{endpoint="/v1/completions",status="200"}') >= 1
    assert _metric(server, "draftverify_requests_total", '{endpoint="/v1/completions",status="400"}') >= 1


def _bench_serve(args: list[str]) -> int:
    """`draftverify bench serve ARGS` in-process; its exit code."""
    from typer.testing import CliRunner

    from draftverify.cli import app

    return CliRunner().invoke(app, ["bench", "serve", *args]).exit_code


def test_the_load_test_reports_on_a_bounded_run(server, tmp_path, capsys):
    from draftverify.bench import load_test

    out = tmp_path / "load.json"
    code = _bench_serve(
        [
            "--url",
            server.base,
            "--api-key",
            API_KEY,
            "--clients",
            "3",
            "--requests",
            "9",
            "--duration",
            "60",
            "--max-tokens",
            "4",
            "--warmup",
            "1",
            "--pid",
            str(server.proc.pid),
            "--rss-every",
            "4",
            "--rss-warm",
            "4",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0 and report["requests"] == 9 and report["ok"] == 9 and report["errors"] == {}
    assert report["tokens"] > 0 and report["latency_p50_s"] <= report["latency_p99_s"]
    assert report["rss_before_mib"] > 0 and report["rss_after_mib"] > 0
    # RSS at 0 completed requests, every 4, and at the end; growth after warm-up from the sample at 4
    assert [x["requests"] for x in report["rss_samples"]] == [0, 4, 8, 9]
    assert report["rss_warm_sample"] == report["rss_samples"][1]
    assert report["rss_growth_after_warmup_mib"] == round(
        report["rss_samples"][-1]["rss_mib"] - report["rss_samples"][1]["rss_mib"], 1
    )
    assert API_KEY not in report["command"] and "--rss-every 4" in report["command"]
    text = out.with_suffix(".md").read_text()
    assert "## Summary" in text and "## Resident memory" in text and "| 9 | 9 | none |" in text
    assert text.count("\n| ") == 2 + len(report["rss_samples"]) + 1  # both tables' header and rows
    with pytest.raises(DraftVerifyError, match="only targets loopback"):
        load_test.check_loopback("http://10.0.0.1:8000")
    load_test.check_loopback("http://127.0.0.1:1")
    load_test.check_loopback("http://[::1]:1")


def test_the_mixed_load_test_batches_greedy_and_seeded_requests_and_each_equals_its_single_request(server, tmp_path):
    """Greedy and seeded sampling requests alternate under load, so the server's batches mix settings; every
    answer must equal the same request sent alone first (the command exits 1 otherwise)."""
    out = tmp_path / "mixed.json"
    code = _bench_serve(
        [
            "--url",
            server.base,
            "--api-key",
            API_KEY,
            "--clients",
            "4",
            "--requests",
            "16",
            "--duration",
            "120",
            "--max-tokens",
            "6",
            "--warmup",
            "0",
            "--mixed",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    greedy, sampled = report["greedy_equal_single"].split("/"), report["sampled_equal_single"].split("/")
    assert code == 0 and report["ok"] == 16 and report["mixed"]
    assert greedy[0] == greedy[1] == "8" and sampled[0] == sampled[1] == "8"
    assert "seeded sampling equal to single request" in out.with_suffix(".md").read_text()


def test_the_load_test_measures_rss_growth_after_warm_up():
    """Growth after warm-up: from the first sample at or after the warm-up count to the last one."""
    from draftverify.bench import load_test

    samples = [{"requests": n, "rss_mib": m} for n, m in [(0, 600.0), (100, 640.0), (200, 650.0), (300, 651.5)]]
    assert load_test.rss_growth(samples, 150) == {
        "rss_growth_mib": 51.5,
        "rss_warm_sample": samples[2],
        "rss_growth_after_warmup_mib": 1.5,
    }
    assert load_test.rss_growth(samples, 400)["rss_growth_after_warmup_mib"] is None  # ended before warm-up
    assert load_test.sparkline([1.0, 2.0, 3.0]) == "▁▅█" and load_test.sparkline([5.0, 5.0]) == "▁▁"


# ---------------------------------------------------------------- token healing: `serve --heal`, per-request "heal"

HEAL_PROMPTS = ['def add(a, b):\n    """Add two numbers."""\n', "import os\n", "class Stack:\n", "x = 1\n"]


@pytest.fixture(scope="module")
def healing_server(models):
    proc = ServerProcess(
        [
            "--target",
            str(models / "target"),
            "--draft",
            str(models / "draft"),
            "--method",
            "model",
            "--served-model-name",
            "tiny",
            "--max-batch",
            "4",
            "--threads",
            "1",
            "--heal",
        ],
        env={"DRAFTVERIFY_API_KEY": API_KEY},
    )
    yield proc
    proc.stop()


@pytest.fixture
def healing_client(healing_server):
    return openai.OpenAI(base_url=healing_server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_serve_heal_is_the_librarys_healed_text_and_a_request_may_turn_it_off(healing_client, client, pipe):
    prompt = HEAL_PROMPTS[0]
    healed = pipe.generate(prompt, max_new_tokens=20, heal=True)
    plain = pipe.generate(prompt, max_new_tokens=20, heal=False)
    assert healed.text != plain.text  # the constraint changed the text (else this test shows nothing)
    out = healing_client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0)
    assert out.choices[0].text == healed.text
    assert out.usage.prompt_tokens == healed.stats.prompt_tokens == pipe.encode(prompt).shape[1] - 1
    assert out.usage.completion_tokens == healed.stats.new_tokens
    off = healing_client.completions.create(
        model="tiny", prompt=prompt, max_tokens=20, temperature=0, extra_body={"heal": False}
    )
    assert off.choices[0].text == plain.text
    # the server without --heal heals only when a request asks
    assert (
        client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0).choices[0].text
        == plain.text
    )
    assert (
        client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0, extra_body={"heal": True})
        .choices[0]
        .text
        == healed.text
    )


def test_healed_streams_echo_and_stop_strings_are_relative_to_the_prompt_as_sent(healing_client, pipe):
    prompt = HEAL_PROMPTS[0]
    whole = pipe.generate(prompt, max_new_tokens=30, heal=True).text
    streamed = "".join(
        c.choices[0].text
        for c in healing_client.completions.create(
            model="tiny", prompt=prompt, max_tokens=30, temperature=0, stream=True
        )
    )
    assert streamed == whole
    echoed = healing_client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + whole
    # a stop string made of the removed "\n" and the completion's start would stop at once if the removed text
    # counted; it may only match inside the completion
    stop = "\n" + whole[:2]
    expected = whole[: whole.find(stop)] if stop in whole else whole
    for stream in (False, True):
        if stream:
            text = "".join(
                c.choices[0].text
                for c in healing_client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=[stop], stream=True
                )
            )
        else:
            text = (
                healing_client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=[stop]
                )
                .choices[0]
                .text
            )
        assert text == expected and text


def test_healed_and_plain_requests_batch_together_with_their_own_texts(healing_client, pipe):
    expected = {
        (i, heal): pipe.generate(p, max_new_tokens=24, heal=heal).text
        for i, p in enumerate(HEAL_PROMPTS)
        for heal in (True, False)
    }
    results: dict = {}

    def ask(i: int, heal: bool) -> None:
        results[(i, heal)] = (
            healing_client.completions.create(
                model="tiny", prompt=HEAL_PROMPTS[i], max_tokens=24, temperature=0, extra_body={"heal": heal}
            )
            .choices[0]
            .text
        )

    threads = [threading.Thread(target=ask, args=(i, h)) for i in range(len(HEAL_PROMPTS)) for h in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == expected
