"""`n` choices through the openai client, on a real server process: the choices of one request run as rows of one
batch (one after another where the method decodes one row at a time), choice i sampled with seed + i, so each equals
the request with that seed asked alone; greedy choices are all the target's own text; a stream tags each chunk with
its choice's index; the usage adds the choices up (the prompt once). best_of = n is every choice, best_of > n the n
likeliest candidates; on both backends."""

from __future__ import annotations

import importlib.util
from collections import defaultdict

import httpx
import openai
import pytest
from serve_fixtures import ServerProcess, make_models

from draftverify.api import load
from draftverify.backends.gguf import converter_available

PROMPT = "def quicksort(xs):\n    "
TOKENS = 12
SEED = 11

BACKENDS = [
    "hf",
    pytest.param(
        "llamacpp",
        marks=pytest.mark.skipif(
            not (importlib.util.find_spec("llama_cpp") and converter_available()),
            reason="the llamacpp extra or llama.cpp's converter is not installed",
        ),
    ),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-choices"))


@pytest.fixture(scope="module", params=BACKENDS)
def server(request, models, tmp_path_factory):
    backend = request.param
    env = {"DRAFTVERIFY_GGUF_CACHE": str(tmp_path_factory.mktemp("gguf"))} if backend == "llamacpp" else {}
    flags = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--method", "model"]
    proc = ServerProcess(
        flags + ["--backend", backend, "--served-model-name", "tiny", "--max-batch", "4", "--threads", "1"], env=env
    )
    proc.backend = backend
    yield proc
    proc.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def complete(client, **fields):
    speculative = fields.pop("speculative", None)
    extra = {} if speculative is None else {"speculative": speculative}
    return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=TOKENS, extra_body=extra, **fields)


def batches(server) -> tuple[float, float]:
    """/metrics' batch sizes: (rows that started or joined a batch, how many times)."""
    found = {}
    for line in httpx.get(server.base + "/metrics").text.splitlines():
        for name in ("draftverify_batch_size_sum", "draftverify_batch_size_count"):
            if line.startswith(name + " "):
                found[name] = float(line.split()[-1])
    return found["draftverify_batch_size_sum"], found["draftverify_batch_size_count"]


# model: rows of one batch; model_tree on llama.cpp decodes one row at a time: its choices run one after another
@pytest.mark.parametrize("method", ["model", "model_tree"])
def test_choice_i_is_the_request_with_seed_plus_i_asked_alone(server, client, method):
    speculative = {"method": method, "gamma": 3}
    rows_before, batches_before = batches(server)
    together = complete(client, n=3, seed=SEED, temperature=1.0, speculative=speculative)
    rows, started = batches(server)
    alone = [complete(client, seed=SEED + i, temperature=1.0, speculative=speculative) for i in range(3)]
    assert [c.index for c in together.choices] == [0, 1, 2]
    assert [c.text for c in together.choices] == [out.choices[0].text for out in alone]
    assert len({c.text for c in together.choices}) > 1  # three samples, not one three times
    assert [c.finish_reason for c in together.choices] == [out.choices[0].finish_reason for out in alone]
    usage, separate = together.usage, [out.usage for out in alone]
    assert usage.prompt_tokens == separate[0].prompt_tokens  # the prompt once
    assert usage.completion_tokens == sum(u.completion_tokens for u in separate)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert rows - rows_before == 3
    one_row = server.backend == "llamacpp" and method == "model_tree"
    assert started - batches_before == (3 if one_row else 1)  # rows of one batch, or one after another


def test_greedy_choices_are_all_the_targets_text(server, client, models, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    target = load(target=models / "target", method="autoregressive", backend=server.backend, threads=1)
    greedy = target.generate(PROMPT, max_new_tokens=TOKENS).text
    out = complete(client, n=3, temperature=0)
    assert [c.text for c in out.choices] == [greedy] * 3
    assert [c.text for c in complete(client, n=2, temperature=0, best_of=2).choices] == [greedy] * 2  # best_of = n


def test_best_of_returns_the_candidates_whose_tokens_the_target_finds_likeliest(client):
    """best_of = 3, n = 2: the candidates are the requests with seeds SEED, SEED + 1, SEED + 2 asked alone, and the
    two returned are those with the highest cumulative log-probability (best first); the usage bills all three."""
    alone = [complete(client, temperature=1.0, seed=SEED + i, logprobs=0) for i in range(3)]
    totals = [sum(a.choices[0].logprobs.token_logprobs) for a in alone]
    order = sorted(range(3), key=lambda i: (-totals[i], i))
    best = complete(client, n=2, best_of=3, temperature=1.0, seed=SEED)
    assert [c.text for c in best.choices] == [alone[i].choices[0].text for i in order[:2]]
    assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None  # not asked for
    assert best.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_a_stream_tags_each_chunk_with_its_choice(client):
    whole = complete(client, n=3, seed=SEED, temperature=1.0)
    chunks = list(
        complete(client, n=3, seed=SEED, temperature=1.0, stream=True, stream_options={"include_usage": True})
    )
    texts: dict[int, str] = defaultdict(str)
    finished = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices  # one choice per chunk, named by its index
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finished[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    assert finished == {i: c.finish_reason for i, c in enumerate(whole.choices)}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_takes_n_too(client):
    messages = [{"role": "user", "content": "write a sort"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=TOKENS, n=2, seed=SEED)
    alone = client.chat.completions.create(model="tiny", messages=messages, max_tokens=TOKENS, seed=SEED + 1)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[1].message.content == alone.choices[0].message.content
    assert out.usage.prompt_tokens == alone.usage.prompt_tokens


@pytest.mark.parametrize("n", [0, 65])  # this server queues 64 rows (the default --max-queue): each choice is one
def test_a_bad_n_is_a_400_naming_it(client, n):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, n=n)
    assert caught.value.body["param"] == "n" and "--max-queue" in caught.value.body["message"]
