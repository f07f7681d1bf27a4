"""llama.cpp libraries built from the vendored source for llama-cpp-python to load (LLAMA_CPP_LIB_PATH), as CI
builds them: the one with llama.cpp's own kernels (scripts/build_llama_cpp_lib.sh), which must write the text the
shipped library writes, and the one without llamafile (scripts/build_llama_cpp_invariant_lib.sh), on which, flash
attention off, a quantized file's verify passes score as one-token decoding does, so a test may assert that a method
keeps that file's greedy text. llama_cpp picks its library when it is imported, so such checks run in a child
process pointed at it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB_ENV = "DRAFTVERIFY_LLAMA_CPP_LIB"  # the folder build_llama_cpp_lib.sh printed (CI sets it)
INVARIANT_ENV = "DRAFTVERIFY_LLAMA_CPP_INVARIANT_LIB"  # the folder build_llama_cpp_invariant_lib.sh printed
NO_LIB = "no llama.cpp library built from the vendored source (scripts/build_llama_cpp_lib.sh)"
NO_INVARIANT_LIB = "no llama.cpp library built without llamafile (scripts/build_llama_cpp_invariant_lib.sh)"


def _built(folder: Path) -> Path | None:
    return folder if any((folder / name).is_file() for name in ("libllama.so", "libllama.dylib")) else None


def built_lib() -> Path | None:
    return _built(Path(os.environ.get(LIB_ENV) or ROOT / ".cache" / "llama.cpp-lib" / "bin"))


def invariant_lib() -> Path | None:
    return _built(Path(os.environ.get(INVARIANT_ENV) or ROOT / ".cache" / "llama.cpp-invariant" / "bin"))


def run_on_library(lib: Path | None, code: str, gguf_cache: Path, *args: str, timeout: float = 900) -> dict:
    """Runs `code` (which prints one JSON object as its last line) in a child process on the library in folder lib
    (None: llama-cpp-python's own) with its GGUF files cached in gguf_cache; the object it printed."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    env["DRAFTVERIFY_GGUF_CACHE"] = str(gguf_cache)
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
    child = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def run_on_invariant_lib(code: str, gguf_cache: Path, *args: str, timeout: float = 900) -> dict:
    """run_on_library on the library built without llamafile."""
    lib = invariant_lib()
    assert lib is not None, NO_INVARIANT_LIB
    return run_on_library(lib, code, gguf_cache, *args, timeout=timeout)
