"""`serve` offers every method with its declared flags: a tree method (one row at a time) with its own option,
served one request at a time, its texts the library's own."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_fixtures import ServerProcess, make_models

from draftverify.api import load

PROMPTS = ["def quicksort(xs):\n    ", "import os\n"]
PATHS = "[[0], [1], [0, 0]]"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-methods"))


@pytest.fixture(scope="module")
def tree_server(models):
    proc = ServerProcess(["--target", str(models / "target"), "--draft", str(models / "draft"), "--method",
                          "model_tree", "--tree-paths", PATHS, "--served-model-name", "tree", "--max-batch", "4",
                          "--threads", "1"])
    yield proc
    proc.stop()


def test_a_tree_method_serves_one_request_at_a_time_with_the_librarys_texts(tree_server, models):
    assert httpx.get(tree_server.base + "/health").json()["max_batch"] == 1
    pipe = load(target=models / "target", draft=models / "draft", method="model_tree",
                tree_paths=[(0,), (1,), (0, 0)])
    expected = [pipe.generate(p, max_new_tokens=12).text for p in PROMPTS]

    def complete(prompt: str) -> str:
        body = {"model": "tree", "prompt": prompt, "max_tokens": 12, "temperature": 0}
        return httpx.post(tree_server.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    with ThreadPoolExecutor(2) as pool:  # both at once: queued, then run one after the other
        assert list(pool.map(complete, PROMPTS)) == expected
    output = tree_server.stop()
    assert "note: model_tree decodes one row at a time: requests are served one at a time" in output
