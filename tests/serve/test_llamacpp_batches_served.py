"""`serve --backend llamacpp --max-batch 8`: concurrent requests decoded as rows of one llama.cpp context (a batch
started together or joined between steps), each answer equal to the same request sent alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from serve_fixtures import ServerProcess, make_models  # noqa: E402

from draftverify.api import load  # noqa: E402
from draftverify.backends.gguf import converter_available  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

PROMPTS = [
    "def quicksort(xs):\n    ",
    "import os\n",
    "class Stack:\n    def __init__(self):\n        ",
    "x = 1\n",
    "for i in range(10):\n    print(",
    "# add two numbers\ndef add(a, b):\n",
    "while True:\n",
    "def fib(n):\n    if n < 2:\n        return n\n    ",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-llamacpp"))


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("method", ["model", "prompt_lookup"])
def test_concurrent_requests_share_a_llama_cpp_batch_and_keep_their_texts(models, method, monkeypatch):
    cache = models / "gguf"
    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(cache))  # converted once here, read by the server
    draft = models / "draft" if method == "model" else None
    pipe = load(target=models / "target", draft=draft, method=method, backend="llamacpp", threads=1, gamma=3)
    assert pipe.supports_batches
    expected = [pipe.generate(p, max_new_tokens=24).text for p in PROMPTS]
    flags = ["--target", str(models / "target"), "--method", method, "--backend", "llamacpp", "--gamma", "3"]
    flags += ["--draft", str(draft)] if draft else []
    server = ServerProcess(
        flags + ["--served-model-name", "m", "--max-batch", "8", "--threads", "1"],
        env={"DRAFTVERIFY_GGUF_CACHE": str(cache)},
    )
    try:
        assert httpx.get(server.base + "/health").json()["max_batch"] == 8

        def complete(prompt: str) -> str:
            body = {"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0}
            reply = httpx.post(server.base + "/v1/completions", json=body, timeout=300)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["text"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert list(pool.map(complete, PROMPTS)) == expected
        rows = _metric(server.base, "draftverify_batch_size_sum")
        batches = _metric(server.base, "draftverify_batch_size_count")  # a batch's start, or rows joining together
        assert rows == len(PROMPTS) and batches < len(PROMPTS), (rows, batches)
    finally:
        server.stop()
