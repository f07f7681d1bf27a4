"""scripts/fetch_llama_cpp_converter.sh against a stand-in python whose `pip download` writes a small sdist and
records the call: the first run unpacks llama.cpp's source, a rerun of the same version downloads nothing and leaves
the folder as it is (a bench may be converting a model with it), another version unpacks again. (CI runs the real
one before the tests.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fetch_llama_cpp_converter.sh"

pytestmark = pytest.mark.skipif(sys.platform.startswith("win"), reason="a bash script")

# `python -c ...` names llama-cpp-python's version; `python -m pip download ... -d DIR` logs its call and writes
# DIR/llama_cpp_python-VERSION.tar.gz holding vendor/llama.cpp/convert_hf_to_gguf.py
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "$FAKE_VERSION"; exit 0; fi
echo "$*" >> "$PIP_LOG"
dir="${@: -1}"
src="$(mktemp -d)/llama_cpp_python-$FAKE_VERSION/vendor/llama.cpp"
mkdir -p "$src"
echo "# converter $FAKE_VERSION" > "$src/convert_hf_to_gguf.py"
tar -czf "$dir/llama_cpp_python-$FAKE_VERSION.tar.gz" -C "$(dirname "$(dirname "$(dirname "$src")")")" \
    "llama_cpp_python-$FAKE_VERSION"
"""


@pytest.fixture
def fetch(tmp_path):
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "pip.log"
    dest = tmp_path / "cache" / "llama.cpp"

    def run(version: str) -> tuple[str, int]:
        """Runs the script for `version`; what it printed and how many downloads it made so far."""
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_LOG": str(log)}
        done = subprocess.run(
            ["bash", str(SCRIPT), str(dest)],
            env={**env, "FAKE_VERSION": version},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout, len(log.read_text().splitlines()) if log.exists() else 0

    return run, dest


def test_a_rerun_of_the_same_version_downloads_nothing_and_keeps_the_folder(fetch):
    run, dest = fetch
    printed, downloads = run("0.3.36")
    assert printed == f"export DRAFTVERIFY_LLAMA_CPP={dest}\n" and downloads == 1
    assert (dest / "convert_hf_to_gguf.py").read_text() == "# converter 0.3.36\n"
    (dest / "model.gguf.part").write_text("a conversion in progress")
    printed, downloads = run("0.3.36")
    assert printed == f"export DRAFTVERIFY_LLAMA_CPP={dest}\n" and downloads == 1
    assert (dest / "model.gguf.part").exists()


def test_another_version_is_unpacked_again(fetch):
    run, dest = fetch
    run("0.3.36")
    _, downloads = run("0.3.37")
    assert downloads == 2 and (dest / "convert_hf_to_gguf.py").read_text() == "# converter 0.3.37\n"
