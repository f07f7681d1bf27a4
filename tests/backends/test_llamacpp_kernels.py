"""The llama.cpp library's kernels and exactness: reading whether llamafile's kernels are built in, and, with a
library built without them (scripts/build_llama_cpp_invariant_lib.sh, as CI does) and flash attention off, a chain's
verify passes scoring every token bit for bit as one-token decoding does on the q8_0 file, where llama-cpp-python's
own build parts, and a batch's rows (each on its own KV stream) keeping their batch-1 greedy texts. The library is
chosen when llama_cpp is imported, so those checks run in a child process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from draftverify.backends.gguf import converter_available
from draftverify.backends.llamacpp_kernels import (
    TILED_MM_ENV,
    chains_exact,
    covered_file_type,
    describe,
    exact_kernels_setup,
    exactness_note,
    float_type_by_width,
    has_llamafile,
    is_quantized,
    kernels_exact,
    library_missing,
    peer_environment,
)
from llamacpp_libraries import NO_INVARIANT_LIB, ROOT, invariant_lib, run_on_invariant_lib

SYSTEM_INFO = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | {}OPENMP = 1 | REPACK = 1 | "


def test_the_llamafile_kernels_are_read_from_the_system_info():
    assert has_llamafile(SYSTEM_INFO.format("LLAMAFILE = 1 | "))
    assert not has_llamafile(SYSTEM_INFO.format(""))


def test_only_a_library_without_llamafile_with_flash_attention_off_makes_chains_exact():
    assert kernels_exact(llamafile=False, flash_attn=False)
    assert not any(kernels_exact(llamafile, flash) for llamafile, flash in ((True, False), (False, True), (True, True)))
    assert not chains_exact(False, False, None)  # a quantized file of unknown type (no general.file_type): not claimed
    assert "bit for bit" in describe(False, False) and "q4_k_m" in describe(False, False)
    assert all(chains_exact(False, False, file_type) for file_type in ("0", "1", "32", "7"))  # float and q8_0 files
    assert not chains_exact(True, False, "7") and not chains_exact(False, False, "3")  # q4_1: not measured
    # what the exact kernels cover, whatever this process's switches: the note on the default kernels reads it
    assert all(covered_file_type(t) for t in ("0", "2", "7", "15", "17", "18"))
    assert not any(covered_file_type(t) for t in ("3", None))
    assert "build_llama_cpp_invariant_lib.sh" in describe(True, False)


def test_a_q4_k_m_files_chains_are_exact_only_with_the_tiled_k_quant_product_off(monkeypatch):
    from draftverify.backends import llamacpp_kernels

    monkeypatch.setenv(TILED_MM_ENV, "1")  # recorded, so the switch exact_kernels_setup sets is undone afterwards
    monkeypatch.delenv(TILED_MM_ENV)
    monkeypatch.setattr(llamacpp_kernels, "_tiled_off_by_us", False)
    assert not chains_exact(False, False, "15")  # q4_k_m (LLAMA_FTYPE 15): the tiled product takes 8+ rows
    assert exact_kernels_setup(llamafile=True) is False and TILED_MM_ENV not in os.environ  # default kernels: as is
    assert exact_kernels_setup(llamafile=False) is True and os.environ[TILED_MM_ENV] == "0"  # weights unrepacked
    assert chains_exact(False, False, "15") and not chains_exact(False, True, "15")
    assert TILED_MM_ENV not in peer_environment()  # llama.cpp's own server runs its default kernels
    monkeypatch.setenv(TILED_MM_ENV, "1")  # a user who turns it on keeps it on, and loses the promise
    assert exact_kernels_setup(llamafile=False) is True and os.environ[TILED_MM_ENV] == "1"
    assert not chains_exact(False, False, "15")


def test_quantized_file_types_are_read_from_the_gguf_metadata():
    assert not any(is_quantized(t) for t in ("0", "1", "32"))  # F32, F16, BF16
    assert all(is_quantized(t) for t in ("7", "15", "2", None, "", "x"))  # Q8_0, Q4_K_M, Q4_0; unknown or unreadable


def test_a_file_without_a_file_type_is_a_float_only_by_its_weights_width():
    params = 50_000_000
    assert float_type_by_width(4 * params, params) == "0"  # F32
    assert float_type_by_width(2 * params + 4 * 10_000, params) == "1"  # F16 weights, F32 norms
    assert float_type_by_width(int(1.0625 * params), params) is None  # Q8_0: 34 bytes a block of 32
    assert float_type_by_width(int(0.6 * params), params) is None  # Q4_K_M


def test_the_exactness_note_speaks_only_where_a_text_may_part():
    assert exactness_note(False, False) is None  # a float file
    note = exactness_note(True, False)
    assert "--no-flash-attn" in note and "build_llama_cpp_invariant_lib.sh" in note
    assert exactness_note(True, True) is None  # exact kernels: chains, and trees through settling
    other = exactness_note(True, False, exact_type=False)  # a type no kernels are known to make exact
    assert "not one whose verify passes are known" in other and "q4_k_m" in other and "--no-flash-attn" in other


def test_a_library_folder_without_llama_cpp_says_what_to_point_it_at(monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/nowhere")
    message = library_missing(FileNotFoundError("not found"))
    assert "$LLAMA_CPP_LIB_PATH=/nowhere holds no llama.cpp library" in message
    assert "build_llama_cpp_invariant_lib.sh" in message and "unset it" in message
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "")
    assert "$LLAMA_CPP_LIB_PATH= holds no llama.cpp library" in library_missing(FileNotFoundError("not found"))
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")
    assert "reinstall it" in library_missing(FileNotFoundError("not found"))


@pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="the llamacpp extra is not installed")
def test_generate_on_an_empty_library_folder_is_a_one_line_usage_error(tmp_path):
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path)}
    args = ["generate", "--zoo", "code", "--backend", "llamacpp", "--prompt", "x", "--max-new-tokens", "2"]
    child = subprocess.run(
        [sys.executable, "-m", "draftverify.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 2, child.stderr[-2000:]
    assert f"$LLAMA_CPP_LIB_PATH={tmp_path} holds no llama.cpp library" in child.stderr
    assert "Traceback" not in child.stderr


# HumanEval/6 on the zoo's q8_0 target: with llama-cpp-python's own build and flash attention off, every drafting
# row of the committed no-flash-attention bench parts from the greedy text at its 13th new token; with the library
# without llamafile, model_tree[g=4] parted at its 18th while trees were decoded in the drafter's node order and
# kept branches were not re-scored (backends/llamacpp_settle.py)
CHILD = r"""
import json, sys
import torch
import llama_cpp.llama_cpp as lib
from transformers import AutoTokenizer
from draftverify import load
from draftverify.backends.llamacpp import LlamaCppLM, open_gguf
from draftverify.backends.llamacpp_kernels import library
from draftverify.bench.prompts import load_prompts
from draftverify.types import SamplingParams

zoo = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(zoo + "/target")
ids = tokenizer(load_prompts("humaneval", None)[6].text, return_tensors="pt").input_ids  # [1, P]
greedy = SamplingParams(temperature=0.0)
other = tokenizer(load_prompts("humaneval", None)[0].text).input_ids
texts, steps = {}, []
drafts = zoo + "/draft"
for method, draft, gamma in (("autoregressive", None, 1), ("model_tree", drafts, 4), ("model", drafts, 6)):
    pipe = load(target=zoo + "/target", draft=draft, method=method, gamma=gamma, backend="llamacpp", threads=2,
                target_gguf="q8_0", flash_attn=False)
    out = pipe.generate_ids(ids, greedy, max_new_tokens=32, on_step=lambda record, rows: steps.append(record))[0]
    texts[method] = out.new_tokens[0].tolist()
    if method == "autoregressive":
        other_text = pipe.generate_ids(torch.tensor([other]), greedy, max_new_tokens=32)[0].new_tokens[0].tolist()
rows = pipe.generate_batch_ids([ids[0].tolist(), other], greedy, max_new_tokens=32)[0].rows  # rows on KV streams
model, _ = open_gguf(zoo + "/target", outtype="q8_0")
one, wide = (LlamaCppLM(model, threads=2, flash_attn=False) for _ in range(2))
tokens = torch.tensor([texts["autoregressive"][:30]])  # [1, 30]: 10 passes of 3 kept
one.start(ids)
wide.start(ids)
# forward's logits are a view of llama.cpp's buffer, valid until the next forward: each is cloned to be kept
single = torch.cat([one.forward(tokens[:, i : i + 1]).logits.clone() for i in range(tokens.shape[1])], 1)  # [1, 30, V]
chunks = []
for at in range(0, tokens.shape[1], 3):  # verify passes of 7: 3 kept, 4 rejected draft tokens rolled back
    wrong = torch.full((1, 4), 7)
    chunks.append(wide.forward(torch.cat([tokens[:, at : at + 3], wrong], dim=1)).logits[:, :3].clone())
    wide.commit(3)
print(json.dumps({
    "llamafile": library(lib)["llamafile"],
    "texts_equal": texts["model"] == texts["autoregressive"],
    "tree_text_equal": texts["model_tree"] == texts["autoregressive"],
    "tree_steps_rescored": any(r.target_calls == 2 for r in steps),  # a verdict was settled (chains never re-score)
    "rows_equal": rows == [texts["autoregressive"], other_text],
    "logits_equal": torch.equal(single, torch.cat(chunks, dim=1)),
}))
"""


@pytest.mark.skipif(
    not (importlib.util.find_spec("llama_cpp") and converter_available() and invariant_lib()),
    reason=f"{NO_INVARIANT_LIB}, or the llamacpp extra / converter is absent",
)
def test_without_llamafile_and_flash_attention_chains_and_rows_score_as_one_token_decoding_on_q8_0(tmp_path):
    result = run_on_invariant_lib(CHILD, tmp_path, str(ROOT / "zoo" / "code"))
    assert result == {
        "llamafile": False,
        "texts_equal": True,
        "tree_text_equal": True,
        "tree_steps_rescored": True,
        "rows_equal": True,
        "logits_equal": True,
    }
