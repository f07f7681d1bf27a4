"""The suffix method's cache is the server's: one per process, fed by every finished request and read by every
later one, whichever batch it runs in; the answers stay the target's own."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_fixtures import InProcessServer, make_models

from draftverify.api import load
from draftverify.serve.app import ServerSettings, create_app

PROMPTS = ["def quicksort(xs):\n    ", "import os\n"]
NEW = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-suffix"))


def counter(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics").text
    return float(re.search(rf"^{name}_total (\S+)$", text, re.M).group(1))


def test_a_repeated_request_is_drafted_from_the_earlier_answer(models):
    pipe = load(target=models / "target", method="suffix", gamma=6)
    expected = [
        load(target=models / "target", method="autoregressive").generate(p, max_new_tokens=NEW).text for p in PROMPTS
    ]
    server = InProcessServer(create_app(pipe, ServerSettings(model_name="m", max_batch=4)))

    def complete(prompt: str) -> str:
        body = {"model": "m", "prompt": prompt, "max_tokens": NEW, "temperature": 0}
        return httpx.post(server.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    try:
        calls = []
        for _ in range(2):  # the same request twice, one after the other
            before = counter(server.base, "draftverify_target_calls")
            assert complete(PROMPTS[0]) == expected[0]
            calls.append(counter(server.base, "draftverify_target_calls") - before)
        assert calls[1] < calls[0]
        # both prompts at once (one batch): each row reads the shared cache, its text still the target's own
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(complete, PROMPTS)) == expected
        assert counter(server.base, "draftverify_accepted_tokens") > 0
    finally:
        server.stop()
    # every request's prompt and answer went into the one drafter's cache
    assert len(pipe.drafter.index.sequences) == 4
