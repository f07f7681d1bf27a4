#!/usr/bin/env bash
# Build llama.cpp's own C++ tools (llama-server, llama-speculative-simple, llama-completion, llama-quantize) from the
# vendored source that scripts/fetch_llama_cpp_converter.sh unpacks (the source the `llamacpp` extra builds), for
# the `llamacpp_native[...]` rows of `draftverify bench speed`. CPU only, Release, only those targets, nothing fetched
# while building (no OpenSSL, no web UI download). A rerun is a no-op when DEST already holds them, built for the
# same llama-cpp-python version (DEST/draftverify-tools.stamp). The build log is DEST/build.log.
#   scripts/build_llama_cpp_tools.sh [SRC] [DEST]   (defaults: .cache/llama.cpp, .cache/llama.cpp-build)
# Environment: JOBS (parallel compile jobs, default 2). Prints the export line that points the bench at the tools.
set -euo pipefail
. "$(dirname "$0")/llama_cpp_cmake.sh"
src="${1:-.cache/llama.cpp}"
dest="${2:-.cache/llama.cpp-build}"
jobs="${JOBS:-2}"
stamp_name=draftverify-tools.stamp
export_var=DRAFTVERIFY_LLAMA_CPP_TOOLS
targets=(llama-server llama-speculative-simple llama-quantize)
# llama-completion is llama-cli's plain-completion half in newer llama.cpp; older trees have llama-cli alone
if [ -f "$src/tools/completion/CMakeLists.txt" ]; then targets+=(llama-completion); else targets+=(llama-cli); fi
flags=(-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON)
built() { for t in "${targets[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done; }
llama_cpp_build
