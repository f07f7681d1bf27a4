#!/usr/bin/env bash
# Build llama.cpp's shared library (libllama and the ggml libraries) from the vendored source that
# scripts/fetch_llama_cpp_converter.sh unpacks, without llamafile's matrix kernels (GGML_LLAMAFILE=OFF). llama.cpp
# multiplies two or more rows with those kernels and one row with ggml's own, so a verify pass over several tokens
# rounds differently from one-token decoding and a near-tie can flip on a quantized file; without them (and with
# --no-flash-attn) a chain's verify pass computes every token as one-token decoding does, bit for bit.
# llama-cpp-python loads it in place of its own when LLAMA_CPP_LIB_PATH names the folder: this script prints that
# export line. CPU only, Release, the library targets only, built as build_llama_cpp_lib.sh builds (the static
# build's calls inside the library: llama_cpp_cmake.sh's python_library_flags). A rerun is a no-op when DEST already
# holds it, built for the same llama-cpp-python version and flags (DEST/draftverify-lib.stamp). The build log is
# DEST/build.log.
#   scripts/build_llama_cpp_invariant_lib.sh [SRC] [DEST]   (defaults: .cache/llama.cpp, .cache/llama.cpp-invariant)
# Environment: JOBS (parallel compile jobs, default 2).
set -euo pipefail
. "$(dirname "$0")/llama_cpp_cmake.sh"
src="${1:-.cache/llama.cpp}"
dest="${2:-.cache/llama.cpp-invariant}"
jobs="${JOBS:-2}"
stamp_name=draftverify-lib.stamp
export_var=LLAMA_CPP_LIB_PATH
targets=(llama)
flags=(-DGGML_LLAMAFILE=OFF "${python_library_flags[@]}")
built() { [ -f "$dest/bin/libllama.so" ] || [ -f "$dest/bin/libllama.dylib" ]; }
llama_cpp_build
