#!/usr/bin/env bash
# Build llama.cpp's shared library (libllama and the ggml libraries) from the vendored source that
# scripts/fetch_llama_cpp_converter.sh unpacks, without llamafile's matrix kernels (GGML_LLAMAFILE=OFF). llama.cpp
# multiplies two or more rows with those kernels and one row with ggml's own, so a verify pass over several tokens
# rounds differently from one-token decoding and a near-tie can flip on a quantized file; without them (and with
# --no-flash-attn) a chain's verify pass computes every token as one-token decoding does, bit for bit.
# llama-cpp-python loads it in place of its own when LLAMA_CPP_LIB_PATH names the folder: this script prints that
# export line. CPU only, Release, the library targets only. A rerun is a no-op when DEST already holds it, built
# for the same llama-cpp-python version (DEST/draftverify-lib.stamp). The build log is DEST/build.log.
#   scripts/build_llama_cpp_invariant_lib.sh [SRC] [DEST]   (defaults: .cache/llama.cpp, .cache/llama.cpp-invariant)
# Environment: JOBS (parallel compile jobs, default 2).
set -euo pipefail
src="${1:-.cache/llama.cpp}"
dest="${2:-.cache/llama.cpp-invariant}"
jobs="${JOBS:-2}"
[ -f "$src/CMakeLists.txt" ] || {
    echo "no llama.cpp source in $src: run scripts/fetch_llama_cpp_converter.sh first" >&2; exit 2; }
command -v cmake >/dev/null || { echo "cmake is not installed" >&2; exit 2; }
version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null)" || {
    echo "llama-cpp-python is not installed: pip install -e '.[llamacpp]'" >&2; exit 2; }
stamp="$dest/draftverify-lib.stamp"
built() { [ -f "$dest/bin/libllama.so" ] || [ -f "$dest/bin/libllama.dylib" ]; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "llama-cpp-python ${version}" ] && built; then
    echo "export LLAMA_CPP_LIB_PATH=$(cd "$dest/bin" && pwd)"
    exit 0
fi
# a build folder configured from another source tree (a cache outside a fresh clone) cannot be reused by cmake
if [ -f "$dest/CMakeCache.txt" ]; then
    configured="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dest/CMakeCache.txt")"
    [ "$(realpath -m "$configured")" = "$(realpath "$src")" ] || rm -rf "$dest"
fi
mkdir -p "$dest"
rm -f "$stamp"
log="$dest/build.log"
cmake -S "$src" -B "$dest" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_LLAMAFILE=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$log" 2>&1 || {
    echo "cmake could not configure llama.cpp, see $log" >&2; exit 1; }
cmake --build "$dest" --config Release -j "$jobs" --target llama >>"$log" 2>&1 || {
    echo "the llama.cpp build failed, see $log" >&2; exit 1; }
built || { echo "the build finished without libllama in $dest/bin, see $log" >&2; exit 1; }
echo "llama-cpp-python ${version}" >"$stamp"
echo "export LLAMA_CPP_LIB_PATH=$(cd "$dest/bin" && pwd)"
