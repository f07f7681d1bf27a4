# The steps the llama.cpp build scripts share (sourced by build_llama_cpp_tools.sh, build_llama_cpp_lib.sh and
# build_llama_cpp_invariant_lib.sh): the source and llama-cpp-python checks, the no-op rerun when DEST already holds
# a build for the same llama-cpp-python version and flags (DEST/$stamp_name), a build folder configured from another
# source tree cleared, then a CPU-only Release configure with the caller's flags, a build of its targets into DEST/bin
# (log: DEST/build.log) and the export line that points at them.
# The caller sets src, dest, jobs, stamp_name, export_var, the arrays flags and targets, and defines built().

# A shared library for Python to load (llama-cpp-python's LLAMA_CPP_LIB_PATH): libllama and the ggml libraries only.
# A shared library is position-independent code, and by default the compiler then lets any exported function be
# replaced at load time (ELF interposition), so it neither inlines nor calls directly one exported function from
# another inside the library, and calls into the other ggml libraries go through the PLT; the static build of
# llama.cpp's tools pays none of that. -fno-semantic-interposition and -fno-plt give the shared library the
# static build's calls (the same kernels, and the same text: tests/backends/test_llamacpp_lib.py); llama.cpp's
# default shared build (build_llama_cpp_tools.sh's DEST/shared) keeps its own flags, as users get it.
python_library_flags=(-DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF)
if [ "$(uname -s)" = Linux ]; then
    python_library_flags+=("-DCMAKE_C_FLAGS=-fno-semantic-interposition -fno-plt"
        "-DCMAKE_CXX_FLAGS=-fno-semantic-interposition -fno-plt")
fi
llama_cpp_build() {
    [ -f "$src/CMakeLists.txt" ] || {
        echo "no llama.cpp source in $src: run scripts/fetch_llama_cpp_converter.sh first" >&2; exit 2; }
    command -v cmake >/dev/null || { echo "cmake is not installed" >&2; exit 2; }
    local version
    version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null)" || {
        echo "llama-cpp-python is not installed: pip install -e '.[llamacpp]'" >&2; exit 2; }
    local stamp="$dest/$stamp_name" built_as="llama-cpp-python ${version}; ${flags[*]}"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$built_as" ] && built; then
        echo "export $export_var=$(cd "$dest/bin" && pwd)"
        exit 0
    fi
    # a build folder configured from another source tree (a cache outside a fresh clone) cannot be reused by cmake
    if [ -f "$dest/CMakeCache.txt" ]; then
        local configured
        configured="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dest/CMakeCache.txt")"
        [ "$(realpath -m "$configured")" = "$(realpath "$src")" ] || rm -rf "$dest"
    fi
    mkdir -p "$dest"
    rm -f "$stamp"
    local log="$dest/build.log"
    # LLAMA_CURL is gone from this llama.cpp (a deprecation warning only); downloads would go through OpenSSL, off
    cmake -S "$src" -B "$dest" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF \
        "${flags[@]}" >"$log" 2>&1 || { echo "cmake could not configure llama.cpp, see $log" >&2; exit 1; }
    cmake --build "$dest" --config Release -j "$jobs" --target "${targets[@]}" >>"$log" 2>&1 || {
        echo "the llama.cpp build failed, see $log" >&2; exit 1; }
    built || { echo "the build finished without ${targets[*]} in $dest/bin, see $log" >&2; exit 1; }
    echo "$built_as" >"$stamp"
    echo "export $export_var=$(cd "$dest/bin" && pwd)"
}
