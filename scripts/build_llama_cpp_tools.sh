#!/usr/bin/env bash
# Build llama.cpp's own C++ tools (llama-server, llama-speculative-simple, llama-completion, llama-quantize) from the
# vendored source that scripts/fetch_llama_cpp_converter.sh unpacks (the source the `llamacpp` extra builds), for
# the `llamacpp_native[...]` rows of `draftverify bench speed`. CPU only, Release, only those targets, nothing fetched
# while building (no OpenSSL, no web UI download). The tools link llama.cpp statically (BUILD_SHARED_LIBS=OFF), the
# fastest way llama.cpp builds on a CPU; llama-server is also built as llama.cpp's own CMake and release archives
# build it by default, with shared libraries, into DEST/shared/bin (`bench overhead` runs both). A rerun is a no-op
# when DEST already holds them, built for the same llama-cpp-python version (DEST/draftverify-tools.stamp). The
# build logs are DEST/build.log and DEST/shared/build.log.
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
# each build in a subshell: a no-op rerun exits there; the static tools first (a build folder configured from another
# source tree is cleared, DEST/shared with it), then llama.cpp's default build of llama-server into DEST/shared
(llama_cpp_build)
(
    dest="$dest/shared"
    flags=(-DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON)
    targets=(llama-server)
    built() { [ -x "$dest/bin/llama-server" ]; }
    llama_cpp_build >/dev/null
)
