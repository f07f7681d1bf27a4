"""scripts/build_llama_cpp_{lib,invariant_lib,tools}.sh against a stand-in cmake that records its arguments: the
libraries Python loads are compiled with the static build's direct calls (-fno-semantic-interposition, -fno-plt),
the tools' two builds as llama.cpp builds them, and a rerun rebuilds exactly when the version or the flags
changed. (CI builds the real ones; their text is checked against the shipped library in
tests/backends/test_llamacpp_lib.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
DIRECT_CALLS = "-fno-semantic-interposition -fno-plt"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the flags are set on Linux only")

# configure: -S SRC -B DEST ...; build: --build DEST ... --target T...: each call one line of arguments in the log,
# and a build leaves what the scripts look for in DEST/bin
FAKE_CMAKE = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$CMAKE_LOG"
if [ "$1" = --build ]; then
    mkdir -p "$2/bin"
    for t in "$@"; do
        case "$t" in
            llama) touch "$2/bin/libllama.so" ;;
            llama-*) touch "$2/bin/$t"; chmod +x "$2/bin/$t" ;;
        esac
    done
fi
"""


@pytest.fixture
def tools_on_path(tmp_path):
    """A bin folder with the stand-in cmake and a python that names llama-cpp-python's version, first on PATH."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "python").write_text('#!/usr/bin/env bash\necho "${FAKE_LLAMA_CPP_PYTHON:-0.3.36}"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    src = tmp_path / "src"
    (src / "tools" / "completion").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("")
    (src / "tools" / "completion" / "CMakeLists.txt").write_text("")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CMAKE_LOG": str(tmp_path / "cmake.log")}, src


def build(script: str, env: dict, src: Path, dest: Path, **extra: str) -> tuple[str, list[str]]:
    """Runs the script; what it printed and the cmake calls it made (one string of arguments each)."""
    log = Path(env["CMAKE_LOG"])
    log.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", str(SCRIPTS / script), str(src), str(dest)],
        env={**os.environ, **env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, log.read_text().splitlines() if log.exists() else []


def configure_calls(calls: list[str]) -> list[str]:
    return [call for call in calls if call.startswith("-S ")]


def test_the_library_python_loads_is_built_with_direct_calls_and_llama_cpps_kernels(tools_on_path, tmp_path):
    env, src = tools_on_path
    printed, calls = build("build_llama_cpp_lib.sh", env, src, tmp_path / "lib")
    (configure,) = configure_calls(calls)
    assert "-DBUILD_SHARED_LIBS=ON" in configure
    assert f"-DCMAKE_C_FLAGS={DIRECT_CALLS}" in configure and f"-DCMAKE_CXX_FLAGS={DIRECT_CALLS}" in configure
    assert "GGML_LLAMAFILE" not in configure  # llama.cpp's own kernels
    assert printed.strip() == f"export LLAMA_CPP_LIB_PATH={tmp_path / 'lib' / 'bin'}"


def test_the_invariant_library_is_built_the_same_way_without_llamafile(tools_on_path, tmp_path):
    env, src = tools_on_path
    _, calls = build("build_llama_cpp_invariant_lib.sh", env, src, tmp_path / "invariant")
    (configure,) = configure_calls(calls)
    assert "-DGGML_LLAMAFILE=OFF" in configure
    assert f"-DCMAKE_C_FLAGS={DIRECT_CALLS}" in configure and "-DBUILD_SHARED_LIBS=ON" in configure


def test_llama_cpps_tools_keep_llama_cpps_own_flags(tools_on_path, tmp_path):
    env, src = tools_on_path
    _, calls = build("build_llama_cpp_tools.sh", env, src, tmp_path / "tools")
    static, shared = configure_calls(calls)
    assert "-DBUILD_SHARED_LIBS=OFF" in static and "-DBUILD_SHARED_LIBS=ON" in shared
    assert not any("CMAKE_C_FLAGS" in call for call in (static, shared))  # the yardsticks as llama.cpp builds them


def test_a_rerun_rebuilds_only_for_another_version_or_other_flags(tools_on_path, tmp_path):
    env, src = tools_on_path
    dest = tmp_path / "lib"
    build("build_llama_cpp_lib.sh", env, src, dest)
    printed, calls = build("build_llama_cpp_lib.sh", env, src, dest)
    assert calls == [] and printed.startswith("export LLAMA_CPP_LIB_PATH=")  # a no-op
    _, calls = build("build_llama_cpp_lib.sh", env, src, dest, FAKE_LLAMA_CPP_PYTHON="0.3.37")
    assert len(configure_calls(calls)) == 1  # another llama-cpp-python
    (dest / "draftverify-lib.stamp").write_text("llama-cpp-python 0.3.37\n")  # a build from before the flags
    _, calls = build("build_llama_cpp_lib.sh", env, src, dest, FAKE_LLAMA_CPP_PYTHON="0.3.37")
    assert len(configure_calls(calls)) == 1
