#!/usr/bin/env bash
# Unpack llama.cpp's source tree (convert_hf_to_gguf.py + gguf-py) from the llama-cpp-python sdist of the installed
# version, for the llama.cpp rows of `draftverify bench speed`; prints the export line to use. A rerun with that
# version already unpacked in DEST only prints the line (no download, and DEST is left as it is: a bench converting
# a model beside it keeps its converter).
#   scripts/fetch_llama_cpp_converter.sh [DEST]        (default DEST: .cache/llama.cpp, ignored by git)
set -euo pipefail
dest="${1:-.cache/llama.cpp}"
version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')" || {
    echo "llama-cpp-python is not installed: pip install -e '.[llamacpp]'" >&2; exit 2; }
stamp="$dest/.llama-cpp-python-version"  # the version DEST was unpacked from
if [ -f "$dest/convert_hf_to_gguf.py" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "export DRAFTVERIFY_LLAMA_CPP=$(cd "$dest" && pwd)"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==${version}" -d "$work"
tar -xzf "$work"/llama_cpp_python-"${version}".tar.gz -C "$work"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$work/llama_cpp_python-${version}/vendor/llama.cpp" "$dest"
echo "$version" > "$stamp"
echo "export DRAFTVERIFY_LLAMA_CPP=$(cd "$dest" && pwd)"
