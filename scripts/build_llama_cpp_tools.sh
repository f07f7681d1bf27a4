#!/usr/bin/env bash
# Build llama.cpp's own C++ tools (llama-server, llama-speculative-simple, llama-completion, llama-quantize) from the
# vendored source that scripts/fetch_llama_cpp_converter.sh unpacks (the source the `llamacpp` extra builds), for
# the `llamacpp_native[...]` rows of `draftverify bench`. CPU only, Release, only those targets, nothing fetched
# while building (no OpenSSL, no web UI download). A rerun is a no-op when DEST already holds them, built for the
# same llama-cpp-python version (DEST/draftverify-tools.stamp). The build log is DEST/build.log.
#   scripts/build_llama_cpp_tools.sh [SRC] [DEST]   (defaults: .cache/llama.cpp, .cache/llama.cpp-build)
# Environment: JOBS (parallel compile jobs, default 2). Prints the export line that points the bench at the tools.
set -euo pipefail
src="${1:-.cache/llama.cpp}"
dest="${2:-.cache/llama.cpp-build}"
jobs="${JOBS:-2}"
[ -f "$src/CMakeLists.txt" ] || {
    echo "no llama.cpp source in $src: run scripts/fetch_llama_cpp_converter.sh first" >&2; exit 2; }
command -v cmake >/dev/null || { echo "cmake is not installed" >&2; exit 2; }
version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null)" || {
    echo "llama-cpp-python is not installed: pip install -e '.[llamacpp]'" >&2; exit 2; }
targets=(llama-server llama-speculative-simple llama-quantize)
# llama-completion is llama-cli's plain-completion half in newer llama.cpp; older trees have llama-cli alone
if [ -f "$src/tools/completion/CMakeLists.txt" ]; then targets+=(llama-completion); else targets+=(llama-cli); fi
stamp="$dest/draftverify-tools.stamp"
built() { for t in "${targets[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "llama-cpp-python ${version}" ] && built; then
    echo "export DRAFTVERIFY_LLAMA_CPP_TOOLS=$(cd "$dest/bin" && pwd)"
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
# LLAMA_CURL is gone from this llama.cpp (a deprecation warning only); downloads would go through OpenSSL, off here
cmake -S "$src" -B "$dest" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >"$log" 2>&1 || {
    echo "cmake could not configure llama.cpp, see $log" >&2; exit 1; }
cmake --build "$dest" --config Release -j "$jobs" --target "${targets[@]}" >>"$log" 2>&1 || {
    echo "the llama.cpp build failed, see $log" >&2; exit 1; }
built || { echo "the build finished without ${targets[*]} in $dest/bin, see $log" >&2; exit 1; }
echo "llama-cpp-python ${version}" >"$stamp"
echo "export DRAFTVERIFY_LLAMA_CPP_TOOLS=$(cd "$dest/bin" && pwd)"
