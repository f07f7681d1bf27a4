"""Quantized targets: a k-quant file (q4_k_m, made by llama.cpp's own llama-quantize from the f32 file) and q8_0
(--target-gguf, the folder converted). On the library built without llamafile, flash attention off, every
llama.cpp method keeps that file's own greedy text; on llama-cpp-python's own build every method runs and drafts
(a near tie may part there, as docs/backends.md says, so no text is asserted). Skipped, with the reason, without
the built tools, the llamacpp extra or the converter (CI has all three, and the invariant library)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from draftverify.backends.gguf import BUILD_SCRIPT, converter_available, gguf_for, tools_built
from draftverify.errors import DraftVerifyError
from llamacpp_libraries import NO_INVARIANT_LIB, invariant_lib, run_on_invariant_lib

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"
METHODS = ("prompt_lookup", "model", "lookup_model", "model_tree", "suffix")
DRAFTED = ("model", "lookup_model", "model_tree")  # the methods that read the zoo's draft model
# the suffix cache's short matches (its hf defaults): llama.cpp's long default ones rarely draft in 48 tokens
SHORT_MATCHES = {"suffix": {"suffix_min_match": 1, "suffix_max_match": 8}}
PROMPT = "def binary_search(xs, target):\n"


pytestmark = pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason=f"llama.cpp's tools are not built ({BUILD_SCRIPT}) or the llamacpp extra / converter is absent",
)


@pytest.fixture(scope="module")
def q4(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("gguf")
    path = gguf_for(ZOO / "target", "q4_k_m", cache_dir=cache)
    assert path.name.endswith("-q4_k_m.gguf") and gguf_for(ZOO / "target", "q4_k_m", cache_dir=cache) == path
    # smaller than the f32 file it was made from (cached beside it)
    assert path.stat().st_size < 0.3 * gguf_for(ZOO / "target", "f32", cache_dir=cache).stat().st_size
    return path


@pytest.mark.parametrize("method", METHODS)
def test_every_llama_cpp_method_runs_and_drafts_on_a_k_quant_file(q4, method):
    from draftverify import load

    draft = ZOO / "draft" if method in DRAFTED else None
    pipe = load(target=q4, draft=draft, method=method, backend="llamacpp", threads=2, **SHORT_MATCHES.get(method, {}))
    out = pipe.generate(PROMPT, max_new_tokens=48)
    assert out.stats.new_tokens == 48
    assert out.stats.target_calls < 48  # it drafted and some drafts were kept


CHILD = r"""
import json, sys
from pathlib import Path
import torch
from draftverify import load
from draftverify.backends.gguf import gguf_for
from draftverify.backends.llamacpp import GGUFModel, LlamaCppLM

zoo, prompt, methods, drafted = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
short = json.loads(sys.argv[5])
result = {}
for kind in ("q4_k_m", "q8_0", "q4_0", "q5_k_m", "q6_k"):
    path = gguf_for(zoo / "target", kind)
    reference = load(target=path, method="autoregressive", backend="llamacpp", threads=2, flash_attn=False)
    want = reference.generate(prompt, max_new_tokens=48).output.new_tokens[0].tolist()
    # verify passes of 12 (4 kept, 8 rejected: wide enough for the tiled K-quant product and the repacked weights'
    # several-row kernel) give the logits one-token decoding gives, bit for bit
    one, wide = (LlamaCppLM(GGUFModel.shared(path), threads=2, flash_attn=False) for _ in range(2))
    ids = reference.tokenizer(prompt, return_tensors="pt").input_ids
    tokens = torch.tensor([want[:24]])
    one.start(ids)
    wide.start(ids)
    single = torch.cat([one.forward(tokens[:, i : i + 1]).logits.clone() for i in range(24)], 1)
    chunks = []
    for at in range(0, 24, 4):
        chunks.append(wide.forward(torch.cat([tokens[:, at : at + 4], torch.full((1, 8), 7)], 1)).logits[:, :4].clone())
        wide.commit(4)
    result[f"{kind} logits"] = {
        "one-token logits": torch.equal(single, torch.cat(chunks, 1)),
        "claimed exact": one.chains_exact,  # llamacpp_kernels.EXACT_FILE_TYPES / TILED_FILE_TYPES name the type
    }
    if kind not in ("q4_k_m", "q8_0"):
        continue  # the other types: their logits only (every method's text on the two the docs' runs use)
    # q4_k_m: the file; q8_0: the folder, which --target-gguf converts to the file the reference read
    target = {"target": path} if kind == "q4_k_m" else {"target": zoo / "target", "target_gguf": kind}
    for method in methods:
        pipe = load(**target, draft=zoo / "draft" if method in drafted else None, method=method, backend="llamacpp",
                    threads=2, flash_attn=False, **short.get(method, {}))
        out = pipe.generate(prompt, max_new_tokens=48)
        result[f"{kind} {method}"] = {
            "reads the file": Path(pipe.target.model.path) == path,
            "greedy text": out.output.new_tokens[0].tolist() == want,
            "drafted": out.stats.target_calls < len(want),
        }
print(json.dumps(result))
"""


@pytest.mark.skipif(not invariant_lib(), reason=NO_INVARIANT_LIB)
def test_on_the_invariant_library_every_method_keeps_each_quantized_files_greedy_text(tmp_path):
    import json

    args = (str(ZOO), PROMPT, ",".join(METHODS), ",".join(DRAFTED), json.dumps(SHORT_MATCHES))
    result = run_on_invariant_lib(CHILD, tmp_path, *args)
    assert len(result) == 2 * len(METHODS) + 5
    failed = {case: checks for case, checks in result.items() if not all(checks.values())}
    assert not failed


def test_a_missing_quantizer_is_one_line(tmp_path, monkeypatch):
    from draftverify.backends import gguf

    monkeypatch.setenv(gguf.TOOLS_ENV, str(tmp_path))
    with pytest.raises(DraftVerifyError, match="build the tools with scripts/build_llama_cpp_tools.sh"):
        gguf_for(ZOO / "target", "q4_k_m", cache_dir=tmp_path / "cache")


def test_target_gguf_is_refused_for_a_gguf_file_and_on_the_hf_backend(tmp_path):
    from draftverify import load

    path = tmp_path / "t.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(DraftVerifyError, match="is a .gguf file already"):
        load(target=path, target_gguf="q8_0", method="autoregressive", backend="llamacpp")
    with pytest.raises(DraftVerifyError, match="on the hf backend the target loads at dtype"):
        load(target=ZOO / "target", target_gguf="q8_0", method="autoregressive")


def test_the_default_build_of_llama_server_is_found_beside_the_static_tools(tmp_path, monkeypatch):
    from draftverify.backends import gguf

    static, shared = tmp_path / "bin", tmp_path / "shared" / "bin"
    static.mkdir()
    (static / gguf.SERVER).write_text("")
    monkeypatch.setenv(gguf.TOOLS_ENV, str(static))
    assert gguf.default_build_dir() is None  # the static tools alone (a build from before the default build)
    shared.mkdir(parents=True)
    (shared / gguf.SERVER).write_text("")
    assert gguf.default_build_dir() == shared
    monkeypatch.setenv(gguf.TOOLS_ENV, str(tmp_path / "nowhere"))
    assert gguf.default_build_dir() is None  # no tools: no default build either
