"""Convert a Hugging Face model folder to GGUF with llama.cpp's own converter, for the llama.cpp peer rows.

llama.cpp's `convert_hf_to_gguf.py` (shipped with gguf-py in llama.cpp's source tree, e.g. vendor/llama.cpp of
the llama-cpp-python sdist) recognises a BPE pre-tokenizer by hashing how it splits a test string, and refuses
tokenizers it has not seen, such as the zoo's. The zoo's pre-tokenizer is GPT-2's byte-level regex (checked here
from tokenizer.json), which llama.cpp implements as "gpt-2". Rather than fork the converter, this module uses
its extension point: it registers, for the model's architecture, a subclass of the converter's own model class
whose `get_vocab_base_pre` answers "gpt-2" (and that reads the vocabulary through the converter's GPT-2 BPE
path), then runs the converter's unchanged `main()`. It runs in a child
process (`python -m draftverify.bench.gguf`), so the converter's sys.path, logging and class registry never
touch the benchmark's process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import DraftVerifyError

CONVERTER = "convert_hf_to_gguf.py"
LLAMA_CPP_ENV = "DRAFTVERIFY_LLAMA_CPP"  # a llama.cpp source tree holding convert_hf_to_gguf.py and gguf-py/
GPT2_PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's pre-tokenizer regex


def llama_cpp_dir() -> Path:
    """The llama.cpp source tree from $DRAFTVERIFY_LLAMA_CPP; a clear error when unset or incomplete."""
    value = os.environ.get(LLAMA_CPP_ENV)
    if not value:
        raise DraftVerifyError(f"set ${LLAMA_CPP_ENV} to a llama.cpp source tree with {CONVERTER} and gguf-py/ "
                               "(scripts/fetch_llama_cpp_converter.sh unpacks the one llama-cpp-python was built from)")
    folder = Path(value)
    for needed in (CONVERTER, "gguf-py"):
        if not (folder / needed).exists():
            raise DraftVerifyError(f"${LLAMA_CPP_ENV}={folder} has no {needed}; point it at llama.cpp's source tree")
    return folder


def is_gpt2_pre_tokenizer(tokenizer_json: dict) -> bool:
    """GPT-2's pre-tokenization: one byte-level step with GPT-2's regex and no prefix space."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    return (pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
            and pre.get("add_prefix_space", False) is False)


def check_convertible(model_dir: Path) -> str:
    """The model's architecture name, after checking its tokenizer is one this module can map."""
    config_path, tokenizer_path = model_dir / "config.json", model_dir / "tokenizer.json"
    if not config_path.is_file() or not tokenizer_path.is_file():
        raise DraftVerifyError(f"{model_dir} needs config.json and tokenizer.json for the GGUF conversion")
    architectures = json.loads(config_path.read_text()).get("architectures") or []
    if not architectures:
        raise DraftVerifyError(f"{config_path} names no architecture")
    if not is_gpt2_pre_tokenizer(json.loads(tokenizer_path.read_text())):
        raise DraftVerifyError(f"{tokenizer_path}: only GPT-2's byte-level pre-tokenizer is mapped for llama.cpp")
    return architectures[0]


def convert(model_dir: str | Path, out: str | Path, llama_cpp: Path, outtype: str = "f32") -> Path:
    """model_dir -> GGUF file `out` (f32 by default: the same weights and arithmetic width as our float32 rows)."""
    model_dir, out = Path(model_dir), Path(out)
    check_convertible(model_dir)
    command = [sys.executable, "-m", "draftverify.bench.gguf", str(llama_cpp), str(model_dir), str(out), outtype]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise DraftVerifyError(f"llama.cpp's converter failed on {model_dir}:\n{done.stderr[-2000:]}")
    return out


def _run_converter(llama_cpp: Path, model_dir: Path, out: Path, outtype: str) -> None:
    """In the child process: register the GPT-2 pre-tokenizer answer for the architecture, run the converter."""
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter; puts its gguf-py on sys.path)
    from conversion import ModelBase, get_model_class  # noqa: E402  (the converter's model class registry)

    architecture = check_convertible(model_dir)
    base = get_model_class(architecture)

    class GPT2PreTokenizerModel(base):  # type: ignore[misc, valid-type]
        """The converter's class for this architecture, told what the tokenizer hash cannot tell it."""

        model_arch = base.model_arch  # the converter asks every subclass to name its GGUF architecture

        def set_vocab(self) -> None:
            # a byte-level BPE with merges (tokenizer.json): the converter's GPT-2 path, without first trying
            # SentencePiece (which needs the sentencepiece package only to find no tokenizer.model)
            self._set_vocab_gpt2()

        def get_vocab_base_pre(self, tokenizer) -> str:
            return GPT2_PRE_TOKENIZER

    ModelBase.register(architecture)(GPT2PreTokenizerModel)
    sys.argv = [CONVERTER, str(model_dir), "--outfile", str(out), "--outtype", outtype]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    _run_converter(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
