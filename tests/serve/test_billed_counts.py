"""Counts a client can bill by: `usage.completion_tokens`, `total_tokens`, the streamed usage chunk and /metrics'
generated tokens count the answer's tokens up to and including the one that ended it (the token that completed a
stop string, the EOS, a stop token, the max_tokens-th), the same whatever the speculation drafted past it. Every
method the code zoo serves x every way an answer ends x streamed or not x both backends, against what decoding one
token at a time gives: the target's own greedy tokens (the library, the target alone), read one token at a time.

The issue's case first: with a stop string completed in the middle of a step, the drafted tokens past it were
counted (5 tokens with speculation off, 7 with prompt_lookup gamma 8, 9 with model gamma 8)."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve_fixtures import ServerProcess

from draftverify.api import load
from draftverify.backends.gguf import converter_available

REPEAT = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"  # the zoo's target goes on: y = 2\nx = 2\ny = 2\n...
ENDS_WITH_EOS = "if __name__ == '__main__':\n    unittest.main("  # ... verbosity=2)\n, then its EOS
TOKENS = 24
GAMMA = 8  # a long draft: a step may run well past the end

# (name, prompt, max_tokens, stop strings): every way an answer ends but a stop token (stop_token_ids, below)
ENDINGS = [
    ("stop string", REPEAT, TOKENS, ["y = 2\nx"]),  # the case: the text is empty, 5 tokens were generated
    ("stop string after text", REPEAT, TOKENS, ["x = 2"]),  # the text is "y = 2\n"
    # the second is completed first (as the text grows one token at a time): the text ends before it, "y = 2\n"
    ("the first stop string completed", REPEAT, TOKENS, ["y = 2\nx = 2\ny", "x ="]),
    ("EOS", ENDS_WITH_EOS, TOKENS, None),
    ("max_tokens", REPEAT, 7, None),
]


def llamacpp_ready() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and converter_available()


BACKENDS = [
    "hf",
    pytest.param(
        "llamacpp",
        marks=pytest.mark.skipif(
            not llamacpp_ready(), reason="the llamacpp extra or llama.cpp's converter is not installed"
        ),
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def served(request, tmp_path_factory):
    """(backend, the zoo served on it, its target alone in this process): GGUF files converted once, read by both."""
    backend = request.param
    env = {"DRAFTVERIFY_GGUF_CACHE": str(tmp_path_factory.mktemp("gguf"))} if backend == "llamacpp" else {}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        target = load(zoo="code", method="autoregressive", backend=backend, threads=1)
        server = ServerProcess(
            ["--zoo", "code", "--backend", backend, "--gamma", str(GAMMA), "--max-batch", "16", "--threads", "1"],
            env=env,
        )
    yield backend, server, target
    server.stop()


def one_token_at_a_time(pipe, ids: list[int], max_tokens: int, stop: list[str], stop_ids: set[int]) -> tuple[str, int]:
    """The answer and its token count as decoding one token at a time ends it: the target's greedy tokens `ids`,
    read until the first that completes a stop string (the text ends before it), is the EOS or a stop token (their
    text not shown), or is the max_tokens-th."""
    eos = pipe.eos_token_id
    ends = ({eos} if isinstance(eos, int) else set(eos or [])) | stop_ids
    decode = pipe.tokenizer.decode
    ids = ids[:max_tokens]
    for count in range(1, len(ids) + 1):
        text = decode(ids[:count], skip_special_tokens=True)
        starts = [text.find(s) for s in stop if s in text]
        if starts:
            return text[: min(starts)], count
        if ids[count - 1] in ends:
            return decode(ids[: count - 1], skip_special_tokens=True), count
    return decode(ids, skip_special_tokens=True), len(ids)


def answer(client, method: str | None, prompt: str, max_tokens: int, extra: dict, streamed: bool) -> tuple[str, dict]:
    """The text and usage of one greedy request with this method (None: speculation off) at gamma GAMMA."""
    speculative = {"enabled": False} if method is None else {"method": method, "gamma": GAMMA}
    kwargs = dict(
        model="code",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"heal": False, "speculative": speculative, **extra},
    )
    if not streamed:
        out = client.completions.create(**kwargs)
        return out.choices[0].text, out.usage.model_dump()
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    return "".join(c.choices[0].text for c in chunks[:-1]), chunks[-1].usage.model_dump()


def generated(server) -> float:
    for line in httpx.get(server.base + "/metrics").text.splitlines():
        if line.startswith("draftverify_generated_tokens_total "):
            return float(line.split()[-1])
    raise AssertionError("no draftverify_generated_tokens_total in /metrics")


def stop_token_ids_served(server) -> bool:
    """Whether this server takes stop_token_ids (another field of the same issue, added beside this one)."""
    schema = httpx.get(server.base + "/openapi.json").json()["components"]["schemas"]["CompletionRequest"]
    return "stop_token_ids" in schema["properties"]


def test_every_method_counts_the_tokens_up_to_the_end_of_the_answer(served):
    backend, server, target = served
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = {  # the target's own greedy tokens (the target alone)
        prompt: target.generate(prompt, max_new_tokens=TOKENS, heal=False).output.new_tokens[0].tolist()
        for prompt in (REPEAT, ENDS_WITH_EOS)
    }
    endings = [(name, prompt, limit, stop, {"stop": stop}, set()) for name, prompt, limit, stop in ENDINGS]
    if stop_token_ids_served(server):
        ids = greedy[REPEAT]
        token = next(t for i, t in enumerate(ids) if i >= 4 and t not in ids[:i])  # one in the middle of a step
        endings.append(("stop token", REPEAT, TOKENS, None, {"stop_token_ids": [token]}, {token}))
    expected = {
        name: one_token_at_a_time(target, greedy[prompt], limit, stop or [], stop_ids)
        for name, prompt, limit, stop, _, stop_ids in endings
    }
    assert expected["stop string"] == ("", 5)  # the case, as the issue measured it without speculation
    assert expected["stop string after text"] == ("y = 2\n", 7)
    assert expected["the first stop string completed"] == ("y = 2\n", 6)
    assert expected["max_tokens"][1] == 7 and expected["EOS"][1] < TOKENS
    methods = [None] + client.models.list().data[0].model_extra["speculative_methods"]
    assert len(methods) > (10 if backend == "llamacpp" else 18), methods  # every registered method the zoo serves
    before = generated(server)
    wrong = {}
    total = 0
    requests = [(ending, streamed) for ending in endings for streamed in (False, True)]
    for method in methods:
        # a method's requests arrive together: rows of one batch (one after another where it decodes one row)
        with ThreadPoolExecutor(len(requests)) as pool:
            outs = list(pool.map(lambda r: answer(client, method, r[0][1], r[0][2], r[0][4], streamed=r[1]), requests))
        for ((name, *_), streamed), (text, usage) in zip(requests, outs):
            count = usage["completion_tokens"]
            total += count
            if (text, count) != expected[name] or usage["total_tokens"] != usage["prompt_tokens"] + count:
                key = (method, name, "streamed" if streamed else "whole")
                wrong[key] = (text, count, usage["total_tokens"] - usage["prompt_tokens"])
    assert not wrong, f"{backend}: (method, ending) -> (text, completion_tokens, total - prompt); expected {expected}"
    assert generated(server) - before == total  # /metrics counts the same tokens
