"""Convert a Hugging Face model folder to GGUF with llama.cpp's own converter: for the llama.cpp backend
(`gguf_for`: converted once, cached on disk) and the bench's llama.cpp peer rows (`convert`).

llama.cpp's `convert_hf_to_gguf.py` (shipped with gguf-py in llama.cpp's source tree, e.g. vendor/llama.cpp of
the llama-cpp-python sdist) recognises a BPE pre-tokenizer by hashing how it splits a test string, and refuses
tokenizers it has not seen, such as the zoo's. The zoo's pre-tokenizer is GPT-2's byte-level regex (checked here
from tokenizer.json), which llama.cpp implements as "gpt-2". Rather than fork the converter, this module uses
its extension point: it registers, for the model's architecture, a subclass of the converter's own model class
whose `get_vocab_base_pre` answers "gpt-2" (and that reads the vocabulary through the converter's GPT-2 BPE
path), then runs the converter's unchanged `main()`. It runs in a child
process (`python -m draftverify.backends.gguf`), so the converter's sys.path, logging and class registry never
touch the benchmark's process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DraftVerifyError

if TYPE_CHECKING:
    import torch

CONVERTER = "convert_hf_to_gguf.py"
LLAMA_CPP_ENV = "DRAFTVERIFY_LLAMA_CPP"  # a llama.cpp source tree holding convert_hf_to_gguf.py and gguf-py/
GGUF_CACHE_ENV = "DRAFTVERIFY_GGUF_CACHE"  # where converted models are kept (default ~/.cache/draftverify/gguf)
# a source checkout's own converter, .cache/llama.cpp (FETCH_HINT says how to fill it; an editable install:
# src/draftverify/backends/gguf.py -> the repository root)
CHECKOUT = Path(__file__).resolve().parents[3]  # an editable install's repository root
CHECKOUT_CONVERTER = CHECKOUT / ".cache" / "llama.cpp"
FETCH_HINT = "scripts/fetch_llama_cpp_converter.sh unpacks the one llama-cpp-python was built from"
GPT2_PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's pre-tokenizer regex


def llama_cpp_dir() -> Path:
    """The llama.cpp source tree: $DRAFTVERIFY_LLAMA_CPP, else the checkout's .cache/llama.cpp where the fetch
    script puts it; a clear error when neither holds the converter."""
    value = os.environ.get(LLAMA_CPP_ENV)
    if not value:
        if (CHECKOUT_CONVERTER / CONVERTER).is_file() and (CHECKOUT_CONVERTER / "gguf-py").is_dir():
            return CHECKOUT_CONVERTER
        raise DraftVerifyError(
            f"set ${LLAMA_CPP_ENV} to a llama.cpp source tree with {CONVERTER} and gguf-py/ ({FETCH_HINT})"
        )
    folder = Path(value)
    for needed in (CONVERTER, "gguf-py"):
        if not (folder / needed).exists():
            raise DraftVerifyError(f"${LLAMA_CPP_ENV}={folder} has no {needed}; point it at llama.cpp's source tree")
    return folder


TOOLS_ENV = "DRAFTVERIFY_LLAMA_CPP_TOOLS"  # a folder holding llama-server (and the other built tools)
BUILD_SCRIPT = "scripts/build_llama_cpp_tools.sh"
BUILD_FOLDER = Path(".cache") / "llama.cpp-build" / "bin"  # where the script puts them, under a checkout
SERVER = "llama-server"


def tools_dir() -> Path:
    """The folder holding llama-server: $DRAFTVERIFY_LLAMA_CPP_TOOLS, else .cache/llama.cpp-build/bin of the
    checkout or of the working folder; a one-line error naming the build script when none has it."""
    value = os.environ.get(TOOLS_ENV)
    if value:
        folder = Path(value)
        if not (folder / SERVER).is_file():
            raise DraftVerifyError(f"${TOOLS_ENV}={folder} has no {SERVER}; build the tools with {BUILD_SCRIPT}")
        return folder
    for root in (CHECKOUT, Path.cwd()):
        if (root / BUILD_FOLDER / SERVER).is_file():
            return root / BUILD_FOLDER
    raise DraftVerifyError(
        f"llama.cpp's own tools ({SERVER}) are not built: run {BUILD_SCRIPT} (or set ${TOOLS_ENV} to their folder)"
    )


def default_build_dir() -> Path | None:
    """The folder of llama-server built as llama.cpp's own CMake builds it by default, with shared libraries
    (scripts/build_llama_cpp_tools.sh puts it in DEST/shared/bin, beside the static tools in DEST/bin), or None
    when tools_dir() has none beside it."""
    try:
        folder = tools_dir().parent / "shared" / "bin"
    except DraftVerifyError:
        return None
    return folder if (folder / SERVER).is_file() else None


def tools_built() -> bool:
    """Whether tools_dir() finds llama.cpp's built tools (tests and bench rows that need them skip otherwise)."""
    try:
        tools_dir()
    except DraftVerifyError:
        return False
    return True


def converter_available() -> bool:
    try:
        llama_cpp_dir()
    except DraftVerifyError:
        return False
    return True


def is_gpt2_pre_tokenizer(tokenizer_json: dict) -> bool:
    """GPT-2's pre-tokenization: one byte-level step with GPT-2's regex and no prefix space."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    return (
        pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True) is True
        and pre.get("add_prefix_space", False) is False
    )


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


def convert(
    model_dir: str | Path, out: str | Path, llama_cpp: Path, outtype: str = "f32", target_dir: Path | None = None
) -> Path:
    """model_dir -> GGUF file `out` (f32 by default: the same weights and arithmetic width as our float32 rows).
    target_dir: the target model folder a draft checkpoint that has no tokenizer of its own (an EAGLE-3 head) is
    converted against."""
    model_dir, out = Path(model_dir), Path(out)
    check_convertible(target_dir if target_dir is not None else model_dir)
    command = [sys.executable, "-m", "draftverify.backends.gguf", str(llama_cpp), str(model_dir), str(out), outtype]
    if target_dir is not None:
        command.append(str(target_dir))
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise DraftVerifyError(f"llama.cpp's converter cannot convert {model_dir}: {reason[-300:]}")
    return out


def gguf_cache_dir() -> Path:
    value = os.environ.get(GGUF_CACHE_ENV)
    return Path(value) if value else Path.home() / ".cache" / "draftverify" / "gguf"


MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt")


def model_key(model_dir: Path, outtype: str) -> str:
    """A hash of the model folder's files (names and contents: config, tokenizer, weights), the precision and the
    llama-cpp-python version (its converter and its reader change together), naming the cached GGUF file."""
    import importlib.metadata

    digest = hashlib.sha256()
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    digest.update(f"{outtype}\0{version}\0".encode())
    for path in sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def gguf_for(
    model_dir: str | Path,
    outtype: str = "f32",
    llama_cpp: Path | None = None,
    cache_dir: Path | None = None,
    target_dir: Path | None = None,
) -> Path:
    """The GGUF file of a Hugging Face model folder at a precision: converted with llama.cpp's converter on first
    use and kept in the cache folder ($DRAFTVERIFY_GGUF_CACHE, default ~/.cache/draftverify/gguf), so later runs
    start at once. A half-written file never lands there (written beside it, then renamed). target_dir: the
    target a draft checkpoint without a tokenizer (an EAGLE-3 head) converts against."""
    model_dir = Path(model_dir)
    target_dir = Path(target_dir) if target_dir is not None else None
    if not model_dir.is_dir():
        raise DraftVerifyError(f"{model_dir} is neither a .gguf file nor a Hugging Face model folder")
    check_convertible(target_dir if target_dir is not None else model_dir)
    cached = (cache_dir or gguf_cache_dir()) / f"{model_dir.name}-{model_key(model_dir, outtype)}-{outtype}.gguf"
    if cached.is_file():
        return cached
    source = llama_cpp if llama_cpp is not None else llama_cpp_dir()
    # a k-quant is made by llama.cpp's own llama-quantize from the f32 file (the converter writes none)
    base = gguf_for(model_dir, "f32", source, cache_dir, target_dir) if outtype in QUANTIZE_TYPES else None
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".converting-") as work:
        if base is not None:
            quantize(base, Path(work) / cached.name, outtype)
        else:
            convert(model_dir, Path(work) / cached.name, source, outtype, target_dir)
        os.replace(Path(work) / cached.name, cached)
    return cached


# GGUF types made by llama-quantize from the f32 file -> its type name
QUANTIZE_TYPES = {"q4_k_m": "Q4_K_M", "q4_0": "Q4_0", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K"}


def quantize(source: Path, out: Path, outtype: str) -> Path:
    """source (a GGUF file) -> `out` at a k-quant type, with llama.cpp's llama-quantize (built by BUILD_SCRIPT)."""
    done = subprocess.run(
        [str(tools_dir() / "llama-quantize"), str(source), str(out), QUANTIZE_TYPES[outtype]],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not out.is_file():
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise DraftVerifyError(f"llama-quantize cannot make {outtype} from {source.name}: {reason[-300:]}")
    return out


def token_tensors(path: Path, llama_cpp: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A GGUF model's token embedding and output layer [V, H] (float32; the embedding twice where the file ties
    them), read with the vendored gguf-py; and whether both are stored unquantized (so their values are the
    original weights). Read once per file version: a drafter wraps the target anew for every request."""
    stat = Path(path).stat()
    return _token_tensors(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size, llama_cpp)


@functools.lru_cache(maxsize=4)
def _token_tensors(
    path: str, mtime_ns: int, size: int, llama_cpp: Path | None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    import numpy as np
    import torch

    sys.path.insert(0, str((llama_cpp if llama_cpp is not None else llama_cpp_dir()) / "gguf-py"))
    from gguf import GGMLQuantizationType, GGUFReader  # noqa: E402  (the vendored gguf-py)
    from gguf.quants import dequantize  # noqa: E402

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    if "token_embd.weight" not in tensors:
        raise DraftVerifyError(f"{path} has no token_embd.weight")
    plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)

    def read(name: str) -> torch.Tensor:
        t = tensors[name]
        hidden, vocab = (int(n) for n in t.shape[:2])  # GGUF's order: the row length first
        values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        return torch.from_numpy(values.reshape(vocab, hidden).copy())

    names = ["token_embd.weight", "output.weight" if "output.weight" in tensors else "token_embd.weight"]
    return read(names[0]), read(names[1]), all(tensors[n].tensor_type in plain for n in names)


def _run_converter(llama_cpp: Path, model_dir: Path, out: Path, outtype: str, target_dir: Path | None) -> None:
    """In the child process: register the GPT-2 pre-tokenizer answer for the architecture, run the converter."""
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter; puts its gguf-py on sys.path)
    from conversion import ModelBase, get_model_class  # noqa: E402  (the converter's model class registry)

    architecture = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    check_convertible(target_dir if target_dir is not None else model_dir)
    base = get_model_class(architecture)

    class GPT2PreTokenizerModel(base):  # type: ignore[misc, valid-type]
        """The converter's class for this architecture, told what the tokenizer hash cannot tell it."""

        model_arch = base.model_arch  # the converter asks every subclass to name its GGUF architecture

        def set_vocab(self) -> None:
            # a byte-level BPE with merges (tokenizer.json): the converter's GPT-2 path, without first trying
            # SentencePiece (which needs the sentencepiece package only to find no tokenizer.model); a draft
            # checkpoint without a tokenizer reads its target's
            own = self.dir_model
            self.dir_model = target_dir if target_dir is not None else own
            try:
                self._set_vocab_gpt2()
            finally:
                self.dir_model = own

        def get_vocab_base_pre(self, tokenizer) -> str:
            return GPT2_PRE_TOKENIZER

    ModelBase.register(architecture)(GPT2PreTokenizerModel)
    sys.argv = [CONVERTER, str(model_dir), "--outfile", str(out), "--outtype", outtype]
    if target_dir is not None:
        sys.argv += ["--target-model-dir", str(target_dir)]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    _run_converter(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
        Path(sys.argv[5]) if sys.argv[5:] else None,
    )
