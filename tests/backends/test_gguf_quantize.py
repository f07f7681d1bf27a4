"""A k-quant target (q4_k_m, made by llama.cpp's own llama-quantize from the f32 file): every llama.cpp method keeps
that file's own greedy text. Skipped, with the reason, without the built tools, the llamacpp extra or the converter
(CI has all three)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from draftverify.backends.gguf import BUILD_SCRIPT, converter_available, gguf_for, tools_built
from draftverify.errors import DraftVerifyError

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"


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


# the suffix cache's short matches (its hf defaults): llama.cpp's long default ones rarely draft in 48 tokens
SHORT_MATCHES = {"suffix": {"suffix_min_match": 1, "suffix_max_match": 8}}


@pytest.mark.parametrize("method", ["prompt_lookup", "model", "lookup_model", "model_tree", "suffix"])
def test_every_llama_cpp_method_keeps_the_quantized_files_greedy_text(q4, method):
    from draftverify import load

    prompt = "def binary_search(xs, target):\n"
    reference = load(target=q4, method="autoregressive", backend="llamacpp", threads=2)
    want = reference.generate(prompt, max_new_tokens=48).output.new_tokens[0].tolist()
    draft = ZOO / "draft" if method in ("model", "lookup_model", "model_tree") else None
    pipe = load(target=q4, draft=draft, method=method, backend="llamacpp", threads=2, **SHORT_MATCHES.get(method, {}))
    out = pipe.generate(prompt, max_new_tokens=48)
    assert out.output.new_tokens[0].tolist() == want
    assert out.stats.target_calls < len(want)  # it drafted and some drafts were kept


def test_a_missing_quantizer_is_one_line(tmp_path, monkeypatch):
    from draftverify.backends import gguf

    monkeypatch.setenv(gguf.TOOLS_ENV, str(tmp_path))
    with pytest.raises(DraftVerifyError, match="build the tools with scripts/build_llama_cpp_tools.sh"):
        gguf_for(ZOO / "target", "q4_k_m", cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("method", ["prompt_lookup", "model", "lookup_model", "model_tree", "suffix"])
def test_target_gguf_q8_0_converts_the_folder_and_every_method_keeps_its_greedy_text(method, tmp_path, monkeypatch):
    from draftverify import load

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    prompt = "def binary_search(xs, target):\n"
    q8 = gguf_for(ZOO / "target", "q8_0")
    reference = load(target=q8, method="autoregressive", backend="llamacpp", threads=2)
    want = reference.generate(prompt, max_new_tokens=48).output.new_tokens[0].tolist()
    draft = ZOO / "draft" if method in ("model", "lookup_model", "model_tree") else None
    pipe = load(
        target=ZOO / "target",
        target_gguf="q8_0",
        draft=draft,
        method=method,
        backend="llamacpp",
        threads=2,
        **SHORT_MATCHES.get(method, {}),
    )
    assert pipe.target.model.path == q8  # the folder converted at q8_0, the file the reference read
    out = pipe.generate(prompt, max_new_tokens=48)
    assert out.output.new_tokens[0].tolist() == want
    assert out.stats.target_calls < len(want)


def test_target_gguf_is_refused_for_a_gguf_file_and_on_the_hf_backend(tmp_path):
    from draftverify import load

    path = tmp_path / "t.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(DraftVerifyError, match="is a .gguf file already"):
        load(target=path, target_gguf="q8_0", method="autoregressive", backend="llamacpp")
    with pytest.raises(DraftVerifyError, match="on the hf backend the target loads at dtype"):
        load(target=ZOO / "target", target_gguf="q8_0", method="autoregressive")


def _long_prompt_ids():
    from transformers import AutoTokenizer

    from draftverify.bench.prompts import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(ZOO / "target")
    return tokenizer(load_prompts("humaneval", None)[1].text, return_tensors="pt").input_ids  # [1, 127]


def test_without_flash_attention_a_verify_pass_equals_one_token_decoding_bit_for_bit_on_q8_0(tmp_path, monkeypatch):
    """One place where a quantized file parts: with flash attention on, llama.cpp's CPU kernel for several queries
    over a long cache rounds differently from its one-query kernel; off, on this prompt, the logits are identical."""
    import torch

    from draftverify.backends.llamacpp import LlamaCppLM, open_gguf

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    ids = _long_prompt_ids()
    model, _ = open_gguf(ZOO / "target", outtype="q8_0")
    one, wide = (LlamaCppLM(model, threads=2, flash_attn=False) for _ in range(2))
    prompt, tokens = ids[:, :100], ids[:, 100:121]  # [1, 100], [1, 21]
    one.start(prompt)
    wide.start(prompt)
    single = torch.cat([one.forward(tokens[:, i : i + 1]).logits for i in range(tokens.shape[1])], dim=1)
    chunks = []
    for at in range(0, tokens.shape[1], 3):  # verify passes of 7: 3 kept, 4 rejected draft tokens rolled back
        wrong = torch.full((1, 4), 7)
        chunks.append(wide.forward(torch.cat([tokens[:, at : at + 3], wrong], dim=1)).logits[:, :3])
        wide.commit(3)
    assert torch.equal(single, torch.cat(chunks, dim=1))


def test_model_on_q8_0_without_flash_attention_keeps_the_greedy_text_where_it_parted_with_it(tmp_path, monkeypatch):
    from draftverify import load
    from draftverify.types import SamplingParams

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    ids, greedy = _long_prompt_ids(), SamplingParams(temperature=0.0)
    texts = []
    for method, draft in (("autoregressive", None), ("model", ZOO / "draft")):
        pipe = load(
            target=ZOO / "target", draft=draft, method=method, gamma=6, backend="llamacpp", threads=2,
            target_gguf="q8_0", flash_attn=False,
        )  # fmt: skip
        texts.append(pipe.generate_ids(ids, greedy, max_new_tokens=64)[0].new_tokens[0].tolist())
    assert texts[1] == texts[0]
