"""GGUF conversion for the llama.cpp rows: which tokenizers map to llama.cpp's GPT-2 pre-tokenizer, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_fixtures import TOKENIZER

from draftverify import DraftVerifyError
from draftverify.backends import gguf as gguf_module
from draftverify.backends.gguf import (
    LLAMA_CPP_ENV,
    check_convertible,
    convert,
    converter_available,
    is_gpt2_pre_tokenizer,
    llama_cpp_dir,
)

ZOO_TARGET = Path(__file__).resolve().parents[2] / "zoo" / "code" / "target"


def test_the_zoo_tokenizer_is_gpt2_byte_level_and_others_are_not():
    assert is_gpt2_pre_tokenizer(json.loads((TOKENIZER / "tokenizer.json").read_text()))
    assert check_convertible(ZOO_TARGET) == "LlamaForCausalLM"
    assert not is_gpt2_pre_tokenizer({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}})
    assert not is_gpt2_pre_tokenizer({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}})
    assert not is_gpt2_pre_tokenizer({"pre_tokenizer": None})


def test_an_unmapped_tokenizer_or_missing_files_are_named(tmp_path):
    with pytest.raises(DraftVerifyError, match="needs config.json and tokenizer.json"):
        check_convertible(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": {"type": "Metaspace"}}))
    with pytest.raises(DraftVerifyError, match="only GPT-2's byte-level pre-tokenizer"):
        convert(tmp_path, tmp_path / "x.gguf", tmp_path)


def test_the_llama_cpp_source_tree_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(LLAMA_CPP_ENV, raising=False)
    monkeypatch.setattr(gguf_module, "CHECKOUT_CONVERTER", tmp_path / "absent")  # not the fetch script's folder
    with pytest.raises(DraftVerifyError, match=f"set \\${LLAMA_CPP_ENV}"):
        llama_cpp_dir()
    monkeypatch.setenv(LLAMA_CPP_ENV, str(tmp_path))
    with pytest.raises(DraftVerifyError, match="has no convert_hf_to_gguf.py"):
        llama_cpp_dir()
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    (tmp_path / "gguf-py").mkdir()
    assert llama_cpp_dir() == tmp_path


@pytest.mark.skipif(not converter_available(), reason=f"${LLAMA_CPP_ENV} (llama.cpp source tree) not set")
def test_llama_cpps_converter_writes_a_gguf_with_the_gpt2_pre_tokenizer(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(llama_cpp_dir() / "gguf-py"))  # llama.cpp's reader, beside its converter
    import gguf

    out = convert(ZOO_TARGET, tmp_path / "target.gguf", llama_cpp_dir())
    reader = gguf.GGUFReader(out)
    field = reader.fields["tokenizer.ggml.pre"]
    assert bytes(field.parts[field.data[0]]).decode() == "gpt-2"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 8192
