"""Log-probabilities through `draftverify serve`: completions' `logprobs` and `echo`, chat's `logprobs` /
`top_logprobs`, whole and streamed. Under speculation (prompt_lookup, a draft model; greedy and seeded sampling)
they equal the target alone's for the same text (`speculative: {"enabled": false}`) and the target's own
log_softmax over the whole sequence, computed here in one plain forward; bad values are 400s naming the field."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from serve_fixtures import ServerProcess, make_models
from transformers import AutoModelForCausalLM

from draftverify.api import load
from draftverify.types import SamplingParams

PROMPT = [5, 17, 99, 230, 7, 5, 17, 99, 230, 7, 5, 17]  # token ids: the tokens scored are exactly these
NEW = 16
SETTINGS = {"greedy": {"temperature": 0}, "sampling": {"temperature": 0.8, "seed": 5}}
SPECULATION = {"prompt_lookup": {"method": "prompt_lookup", "gamma": 4}, "model": {"method": "model", "gamma": 4}}
ALONE = {"enabled": False}
MESSAGES = [{"role": "user", "content": "Write a sort in Python."}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-logprobs"))


@pytest.fixture(scope="module")
def server(models):
    flags = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--method", "model"]
    proc = ServerProcess(flags + ["--served-model-name", "tiny", "--max-batch", "4", "--threads", "1"])
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def target(models):
    return AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def alone(models):
    """The library's target alone: the answer's token ids for a setting (the server's text is the same)."""
    pipe = load(target=models / "target", method="autoregressive")

    def ids(setting: str) -> list[int]:
        fields = SETTINGS[setting]
        params = SamplingParams(temperature=fields["temperature"], seed=fields.get("seed"))
        output, _ = pipe.generate_batch_ids([PROMPT], params, max_new_tokens=NEW)
        return output.new_tokens[0].tolist()

    return pipe, ids


def post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.base + path, json={"model": "tiny", **body}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def complete(server, **fields) -> dict:
    body = {"prompt": PROMPT, "max_tokens": NEW, "logprobs": 5, "echo": True, **fields}
    return post(server, "/v1/completions", body)["choices"][0]


def streamed(server, path: str, body: dict) -> list[dict]:
    """The choices of every chunk of a streamed answer, in order."""
    chunks = []
    body = {"model": "tiny", **body, "stream": True}
    with httpx.stream("POST", server.base + path, json=body, timeout=300) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.extend(json.loads(line[len("data: ") :])["choices"])
    return chunks


def assert_same(ours: dict, alone: dict, atol: float) -> None:
    """Two completions' logprobs objects: the same tokens, offsets and listed tokens, values within atol."""
    assert ours["tokens"] == alone["tokens"] and ours["text_offset"] == alone["text_offset"]
    for a, b in zip(ours["token_logprobs"], alone["token_logprobs"], strict=True):
        assert (a is None and b is None) or a == pytest.approx(b, abs=atol)
    for a, b in zip(ours["top_logprobs"], alone["top_logprobs"], strict=True):
        assert (a is None and b is None) or (a.keys() == b.keys() and a == pytest.approx(b, abs=atol))


@pytest.mark.parametrize("method", sorted(SPECULATION))
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_completion_logprobs_under_speculation_are_the_target_alone(server, target, alone, method, setting):
    ours = complete(server, speculative=SPECULATION[method], **SETTINGS[setting])
    plain = complete(server, speculative=ALONE, **SETTINGS[setting])
    assert ours["text"] == plain["text"]
    assert_same(ours["logprobs"], plain["logprobs"], atol=1e-5)
    pipe, ids_for = alone
    new = ids_for(setting)
    ids = PROMPT + new
    lp = ours["logprobs"]
    assert lp["tokens"] == [pipe.tokenizer.decode([t]) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing scores the first token
    with torch.no_grad():
        expected = target(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(dim=-1)  # [len - 1, V]
    chosen = expected[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(torch.tensor(lp["token_logprobs"][1:]), chosen, atol=1e-4)
    for j, top in enumerate(lp["top_logprobs"][1:]):
        values, tokens = expected[j].topk(5)
        assert {pipe.tokenizer.decode([t]) for t in tokens.tolist()} <= top.keys()  # top 5, and the chosen one
        assert sorted(top.values(), reverse=True)[:5] == pytest.approx(values.tolist(), abs=1e-4)
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[len(PROMPT)] == len(pipe.tokenizer.decode(PROMPT))


def test_streamed_chunks_carry_the_same_logprobs(server):
    fields = {"prompt": PROMPT, "max_tokens": NEW, "logprobs": 2, "echo": True, "temperature": 0}
    fields["speculative"] = SPECULATION["model"]
    whole = complete(server, **fields)
    chunks = streamed(server, "/v1/completions", fields)
    assert "".join(c["text"] for c in chunks) == whole["text"]
    joined = {key: [] for key in whole["logprobs"]}
    start = 0  # where each chunk's text starts in the answer
    for c in chunks:
        if c["logprobs"] is not None:
            for key, values in c["logprobs"].items():
                joined[key].extend(values)
            assert all(start <= o <= start + len(c["text"]) for o in c["logprobs"]["text_offset"])  # its own text
        start += len(c["text"])
    assert joined == whole["logprobs"]
    # each piece of text comes with its own tokens' logprobs (the echo's first), not all at the end; how many pieces
    # there are depends on how many steps the worker ran before the stream read them
    pieces = [c for c in chunks if c["text"]]
    assert len(pieces) >= 2 and all(c["logprobs"] is not None for c in pieces)


def test_requests_sharing_a_batch_get_their_own_logprobs(server):
    """Requests decoded together (rows of one batch, joining it as others finish) asking for different things: each
    answer as when sent alone."""
    asks = [
        {"prompt": PROMPT, "logprobs": 3, "echo": True},
        {"prompt": PROMPT[:5], "logprobs": 0},
        {"prompt": PROMPT[3:], "max_tokens": 6},
        {"prompt": PROMPT[:2], "logprobs": 1, "echo": True, "max_tokens": 4},
        {"prompt": PROMPT[::-1], "logprobs": 5, "echo": True},
    ]
    bodies = [{"max_tokens": NEW, "temperature": 0, "speculative": SPECULATION["prompt_lookup"], **a} for a in asks]
    alone = [post(server, "/v1/completions", b)["choices"][0] for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = [r["choices"][0] for r in pool.map(lambda b: post(server, "/v1/completions", b), bodies)]
    for ours, its in zip(together, alone):
        assert ours["text"] == its["text"]
        if its["logprobs"] is None:
            assert ours["logprobs"] is None
        else:
            assert_same(ours["logprobs"], its["logprobs"], atol=1e-4)  # rows of a padded batch round otherwise


def test_lm_eval_reads_a_loglikelihood_off_echo(server, target):
    """What lm-evaluation-harness sends for a log-likelihood request (echo, logprobs 1, max_tokens 1, temperature
    0, a seed): the context's and continuation's tokens scored, the continuation's is_greedy from top_logprobs."""
    context, continuation = PROMPT[:8], PROMPT[8:]
    reply = post(
        server,
        "/v1/completions",
        {"prompt": [context + continuation], "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1},
    )
    lp = reply["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(PROMPT) + 1  # the prompt's tokens, then the one generated
    scored = lp["token_logprobs"][len(context) : -1]
    with torch.no_grad():
        expected = target(input_ids=torch.tensor([PROMPT])).logits[0, :-1].log_softmax(dim=-1)
    want = expected[torch.arange(len(context) - 1, len(PROMPT) - 1), torch.tensor(continuation)]
    assert sum(scored) == pytest.approx(float(want.sum()), abs=1e-4)
    greedy = all(t == max(top.values()) for t, top in zip(scored, lp["top_logprobs"][len(context) : -1]))
    assert greedy == bool((expected[len(context) - 1 :].argmax(dim=-1) == torch.tensor(continuation)).all())


def test_a_stop_string_ends_the_logprobs_too(server):
    """Through the openai client: the tokens listed are those whose text the answer returns."""
    whole = complete(server, echo=False, temperature=0, max_tokens=24)
    text = whole["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
    cut = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        logprobs=5,
        stop=[stop],
        extra_body={"speculative": SPECULATION["model"]},
    ).choices[0]
    assert cut.text == text[: text.index(stop)]
    offsets = cut.logprobs.text_offset
    assert offsets and all(o < len(cut.text) for o in offsets)
    assert cut.logprobs.tokens == whole["logprobs"]["tokens"][: len(offsets)]
    assert cut.logprobs.token_logprobs == whole["logprobs"]["token_logprobs"][: len(offsets)]


@pytest.mark.parametrize("method", sorted(SPECULATION))
def test_chat_logprobs_under_speculation_are_the_target_alone(server, method):
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)

    def chat(speculative: dict):
        out = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=NEW,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            extra_body={"speculative": speculative},
        )
        return out.choices[0]

    ours, plain = chat(SPECULATION[method]), chat(ALONE)
    assert ours.message.content == plain.message.content
    content = ours.logprobs.content
    assert len(content) == NEW and "".join(t.token for t in content).startswith(ours.message.content[:1])
    for a, b in zip(content, plain.logprobs.content, strict=True):
        assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert a.bytes == list(a.token.encode("utf-8")) and len(a.top_logprobs) == 3
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        assert a.top_logprobs[0].logprob >= a.logprob - 1e-6
    chunks = streamed(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": NEW, "temperature": 0, "logprobs": True, "top_logprobs": 3},
    )
    tokens = [t["token"] for c in chunks if c["logprobs"] for t in c["logprobs"]["content"]]
    assert tokens == [t.token for t in plain.logprobs.content]


@pytest.mark.parametrize(
    "path, fields, param",
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": 2, "heal": True}, "heal"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(server, path, fields, param):
    reply = httpx.post(server.base + path, json={"model": "tiny", **fields}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_llama_cpp_server_logprobs_under_speculation_are_the_target_alone(models, tmp_path):
    """`serve --backend llamacpp`: the same answers and, within llama.cpp's rounding between decode widths, the
    same log-probabilities under speculation as the target alone; whole and streamed."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")
    from draftverify.backends.gguf import converter_available

    if not converter_available():
        pytest.skip("no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh")
    flags = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--method", "model"]
    proc = ServerProcess(
        flags + ["--backend", "llamacpp", "--served-model-name", "tiny", "--max-batch", "4", "--threads", "1"],
        env={"DRAFTVERIFY_GGUF_CACHE": str(tmp_path / "gguf")},
        startup_s=300,
    )
    try:
        for setting in sorted(SETTINGS):
            plain = complete(proc, speculative=ALONE, **SETTINGS[setting])
            for method in sorted(SPECULATION):
                ours = complete(proc, speculative=SPECULATION[method], **SETTINGS[setting])
                assert ours["text"] == plain["text"]
                assert_same(ours["logprobs"], plain["logprobs"], atol=1e-3)  # llama.cpp rounds per decode width
        fields = {"prompt": PROMPT, "max_tokens": NEW, "logprobs": 2, "echo": True, "temperature": 0}
        chunks = streamed(proc, "/v1/completions", {**fields, "speculative": SPECULATION["prompt_lookup"]})
        tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
        assert tokens == complete(proc, **fields)["logprobs"]["tokens"]
    finally:
        proc.stop()
