"""On a CUDA GPU (skipped elsewhere): methods run there, every piece they build on the GPU, and their greedy text is
the target's own: the CPU's at float32, and the GPU target's plain greedy decoding at bfloat16 / float16 (auto)."""

from __future__ import annotations

import pytest
import torch

import draftverify

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = "def fibonacci(n):\n"
METHODS = ["ngram", "model", "bpd", "bita", "specdec"]


def _greedy(method: str, device: str, dtype: str) -> str:
    pipe = draftverify.load(zoo="code", method=method, device=device, dtype=dtype)
    return pipe.generate(PROMPT, max_new_tokens=32).text


@pytest.mark.parametrize("method", METHODS)
def test_float32_on_the_gpu_writes_the_cpus_text(method):
    assert _greedy(method, "cuda", "float32") == _greedy(method, "cpu", "float32")


@pytest.mark.parametrize("method", METHODS)
def test_auto_dtype_on_the_gpu_keeps_the_targets_greedy_text(method):
    pipe = draftverify.load(zoo="code", method=method, device="cuda")
    model = pipe.target.model
    assert next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    ids = pipe.encode(PROMPT).to("cuda")
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
    assert pipe.generate(PROMPT, max_new_tokens=32).text == pipe.decode_new(plain[0, ids.shape[1] :].tolist())
    for model in pipe.drafter.models():
        inner = getattr(model, "model", None)
        if isinstance(inner, torch.nn.Module):
            assert {p.device.type for p in inner.parameters()} == {"cuda"}
