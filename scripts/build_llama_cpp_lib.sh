#!/usr/bin/env bash
# Build llama.cpp's shared library (libllama and the ggml libraries) from the vendored source that
# scripts/fetch_llama_cpp_converter.sh unpacks, with llama.cpp's own kernels, for llama-cpp-python to load in place of
# the library it ships: the same code, compiled so that calls inside the library are as direct as in llama.cpp's
# static build of its tools (llama_cpp_cmake.sh's python_library_flags), so one-token decoding from Python runs at
# that build's speed. Same kernels, same text (tests/backends/test_llamacpp_lib.py). llama-cpp-python loads it when
# LLAMA_CPP_LIB_PATH names the folder: this script prints that export line. CPU only, Release (-march=native), the
# library targets only. A rerun is a no-op when DEST already holds it, built for the same llama-cpp-python version and
# flags (DEST/draftverify-lib.stamp). The build log is DEST/build.log.
#   scripts/build_llama_cpp_lib.sh [SRC] [DEST]   (defaults: .cache/llama.cpp, .cache/llama.cpp-lib)
# Environment: JOBS (parallel compile jobs, default 2).
set -euo pipefail
. "$(dirname "$0")/llama_cpp_cmake.sh"
src="${1:-.cache/llama.cpp}"
dest="${2:-.cache/llama.cpp-lib}"
jobs="${JOBS:-2}"
stamp_name=draftverify-lib.stamp
export_var=LLAMA_CPP_LIB_PATH
targets=(llama)
flags=("${python_library_flags[@]}")
built() { [ -f "$dest/bin/libllama.so" ] || [ -f "$dest/bin/libllama.dylib" ]; }
llama_cpp_build
