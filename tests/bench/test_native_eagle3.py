"""Our EAGLE-3 head, exported, runs in llama.cpp's own `--spec-type draft-eagle3` (llama-server built from the
vendored source) and in our loop on the llama.cpp backend: both give llama.cpp's plain greedy text. Skipped, with
the reason, without the built tools, the llamacpp extra or the converter (CI has all three)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench import llamacpp_native
from draftverify.bench.config import BenchConfig
from draftverify.bench.llamacpp_native import BUILD_SCRIPT
from draftverify.bench.native_spec import parse_spec
from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head
from draftverify.errors import DraftVerifyError

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"
PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n"]
NEW = 24


def test_draft_eagle3_rows_parse_and_refuse_a_draft_model_beside_the_head():
    spec = parse_spec("llamacpp_native[draft-eagle3,n_max=6,p_min=0.2]")
    assert spec.eagle3 and spec.needs_draft and spec.name == "llamacpp_native[draft-eagle3,n_max=6,p_min=0.2]"
    server = spec.server_args(Path("h.gguf"), 2)
    assert server[:2] == ["--spec-type", "draft-eagle3"] and "--spec-draft-model" in server
    for bad in ("llamacpp_native[draft-eagle3,draft-simple]", "llamacpp_native[draft-eagle3,draft=aligned]"):
        with pytest.raises(DraftVerifyError, match="drafts with the EAGLE-3 head"):
            parse_spec(bad)


@pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason=f"llama.cpp's tools are not built ({BUILD_SCRIPT}) or the llamacpp extra / converter is absent",
)
def test_llama_cpp_runs_our_exported_head_and_keeps_its_plain_greedy_text(tmp_path, monkeypatch):
    from draftverify import load

    if not os.environ.get("DRAFTVERIFY_GGUF_CACHE"):
        monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path / "gguf"))
    model = AutoModelForCausalLM.from_pretrained(ZOO / "target")
    torch.manual_seed(0)
    Eagle3Head(Eagle3Config.for_target(model.config, model.get_output_embeddings())).save(tmp_path / "head")
    config = BenchConfig(
        zoo="code",
        quick=True,
        threads=2,
        runners=("llamacpp_native[plain]", "llamacpp_native[draft-eagle3,n_max=4]"),
        options={"eagle3_path": tmp_path / "head"},
    ).resolved()
    models = SimpleNamespace(paths={"target": str(ZOO / "target")}, context_limit=None)
    runners, notes = llamacpp_native.native_runners(config, models)
    tokenizer = AutoTokenizer.from_pretrained(ZOO / "target")
    pipe = load(target=ZOO / "target", method="eagle3", backend="llamacpp", eagle3_path=tmp_path / "head", gamma=4)
    try:
        assert [r.name for r in runners] == ["llamacpp_native[plain]", "llamacpp_native[draft-eagle3,n_max=4]"], notes
        assert "EAGLE-3 head's GGUF" in notes[-1]
        for text in PROMPTS:
            ids = tokenizer(text, return_tensors="pt").input_ids  # [1, L]
            plain, native = (runner.run(ids, 0.0, 0, NEW) for runner in runners)
            assert native.new_ids == plain.new_ids and len(plain.new_ids) == NEW
            assert native.stats["native_timings"].get("draft_n", 0) > 0  # the head did draft
            ours = pipe.generate(text, max_new_tokens=NEW)
            assert ours.output.new_tokens[0].tolist() == plain.new_ids
    finally:
        for runner in runners:
            runner.close()
