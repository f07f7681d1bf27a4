"""The library scripts/build_llama_cpp_lib.sh builds (llama.cpp's kernels, compiled with the static build's direct
calls) writes, for plain decoding and for methods that verify chains and draft with a model, the tokens
llama-cpp-python's own library writes, on the zoo's f32 and q8_0 files. Skipped, with the reason, without the
built library, the llamacpp extra or the converter (CI has all three)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from draftverify.backends.gguf import converter_available
from llamacpp_libraries import NO_LIB, built_lib, run_on_library

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"
PROMPTS = ("def binary_search(xs, target):\n", "import os\n\n\ndef read_lines(path):\n")

pytestmark = [
    pytest.mark.skipif(not importlib.util.find_spec("llama_cpp") or not converter_available(), reason="no llamacpp"),
    pytest.mark.skipif(not built_lib(), reason=NO_LIB),
]

CHILD = r"""
import json, sys
from pathlib import Path
from draftverify import load

zoo, prompts = Path(sys.argv[1]), sys.argv[2:]
result = {}
for kind in ("f32", "q8_0"):
    for method in ("autoregressive", "suffix", "model"):
        draft = zoo / "draft" if method == "model" else None
        pipe = load(target=zoo / "target", target_gguf=kind, draft=draft, method=method, backend="llamacpp",
                    threads=2, suffix_min_match=1, suffix_max_match=8)
        for i, prompt in enumerate(prompts):
            out = pipe.generate(prompt, max_new_tokens=48)
            result[f"{kind} {method} {i}"] = [out.output.new_tokens[0].tolist(), out.stats.target_calls]
print(json.dumps(result))
"""


def test_the_built_library_writes_the_shipped_librarys_tokens(tmp_path):
    args = (str(ZOO), *PROMPTS)
    shipped = run_on_library(None, CHILD, tmp_path, *args)
    built = run_on_library(built_lib(), CHILD, tmp_path, *args)
    assert len(shipped) == 12
    assert {case: tokens for case, (tokens, _) in built.items()} == {c: t for c, (t, _) in shipped.items()}
    # the chains were verified several tokens a pass (the kernels a verify pass takes ran on both)
    assert all(calls < 48 for case, (_, calls) in shipped.items() if "autoregressive" not in case)
