"""`serve` offers every method with its declared flags: a tree method with its own option (batched), and BiLD
with the shared thresholds (one row at a time: served one request at a time, and said so); the texts are the
library's own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_fixtures import ServerProcess, make_models

from draftverify.api import load

PROMPTS = ["def quicksort(xs):\n    ", "import os\n"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-methods"))


def serve_and_compare(models, flags: list[str], options: dict) -> tuple[int, str]:
    """Start a server with these method flags, send both prompts at once; their texts must equal load(**options)'s.
    Returns the server's max_batch and its output."""
    proc = ServerProcess(
        [
            "--target",
            str(models / "target"),
            "--draft",
            str(models / "draft"),
            *flags,
            "--served-model-name",
            "m",
            "--max-batch",
            "4",
            "--threads",
            "1",
        ]
    )
    try:
        max_batch = httpx.get(proc.base + "/health").json()["max_batch"]
        pipe = load(target=models / "target", draft=models / "draft", **options)
        expected = [pipe.generate(p, max_new_tokens=12).text for p in PROMPTS]

        def complete(prompt: str) -> str:
            body = {"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0}
            return httpx.post(proc.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

        with ThreadPoolExecutor(2) as pool:  # both at once: one batch, or queued and run one after the other
            assert list(pool.map(complete, PROMPTS)) == expected
    finally:
        output = proc.stop()
    return max_batch, output


def test_a_tree_method_takes_its_declared_option_and_batches(models):
    max_batch, output = serve_and_compare(
        models,
        ["--method", "model_tree", "--tree-paths", "[[0], [1], [0, 0]]"],
        dict(method="model_tree", tree_paths=[(0,), (1,), (0, 0)]),
    )
    assert max_batch == 4 and "one row at a time" not in output


def test_bild_takes_the_shared_thresholds_and_serves_one_request_at_a_time(models):
    max_batch, output = serve_and_compare(
        models,
        ["--method", "bild", "--alpha-fb", "0.3", "--alpha-rb", "1.5"],
        dict(method="bild", alpha_fb=0.3, alpha_rb=1.5),
    )
    assert max_batch == 1
    assert "note: bild decodes one row at a time: requests are served one at a time (--max-batch 1)" in output
