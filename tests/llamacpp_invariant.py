"""The llama.cpp library built without llamafile (scripts/build_llama_cpp_invariant_lib.sh, as CI does): with it and
flash attention off a quantized file's verify passes score as one-token decoding does, so a test may assert that a
method keeps that file's greedy text. llama_cpp picks its library when it is imported, so such checks run in a
child process pointed at it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INVARIANT_ENV = "DRAFTVERIFY_LLAMA_CPP_INVARIANT_LIB"  # the folder the build script printed (CI sets it)
NO_INVARIANT_LIB = "no llama.cpp library built without llamafile (scripts/build_llama_cpp_invariant_lib.sh)"


def invariant_lib() -> Path | None:
    folder = Path(os.environ.get(INVARIANT_ENV) or ROOT / ".cache" / "llama.cpp-invariant" / "bin")
    return folder if any((folder / name).is_file() for name in ("libllama.so", "libllama.dylib")) else None


def run_on_invariant_lib(code: str, gguf_cache: Path, *args: str, timeout: float = 900) -> dict:
    """Runs `code` (which prints one JSON object as its last line) on the invariant library with its GGUF files
    cached in gguf_cache; the object it printed."""
    lib = invariant_lib()
    assert lib is not None, NO_INVARIANT_LIB
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib), "DRAFTVERIFY_GGUF_CACHE": str(gguf_cache)}
    child = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])
