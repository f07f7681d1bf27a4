"""Where and with what a benchmark ran: machine, library versions, git commit, date, command line."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it; elsewhere what platform knows (e.g. "arm", "x86_64")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def accelerator(device: str) -> dict:
    """The device the models ran on and, for a GPU, its name (what a table of GPU figures must say)."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return {"device": device, "gpu": torch.cuda.get_device_name(torch.device(device))}
    return {"device": device, **({"gpu": "Apple silicon (mps)"} if kind == "mps" else {})}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions() -> dict:
    import torch
    import transformers

    from .. import __version__

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "draftverify": __version__,
        "torch_threads": torch.get_num_threads(),
        "git_commit": _git("rev-parse", "HEAD"),
    }
    status = _git("status", "--porcelain", "--untracked-files=no")
    info["git_dirty"] = bool(status) if status is not None else None
    if "llama_cpp.llama_cpp" in sys.modules:  # llama.cpp rows ran: which library, with which kernels
        from ..backends.llamacpp_kernels import library

        info["llama_cpp_library"] = library(sys.modules["llama_cpp.llama_cpp"])
    for name in ("sacrebleu", "matplotlib"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def command_line() -> str:
    """The exact command line of this process, quoted as a shell would take it (reproduce_command shows it as
    `draftverify ...`): what a result and a training card record as the command that made them."""
    return shlex.join(sys.argv)


def header(name: str, command: str | None = None, device: str | None = None) -> dict:
    """The fields a result opens with: its name, the date, the command (None: this process's) and that command as
    `draftverify ...`, the machine (with `device`, also where the models ran) and the library versions."""
    command = command_line() if command is None else command
    return {
        "name": name,
        "date": now(),
        "command": command,
        "reproduce": reproduce_command(command),
        "machine": machine() if device is None else {**machine(), **accelerator(device)},
        "versions": versions(),
    }


def reproduce_command(command: str) -> str:
    """`command` with the entry point (a path to the script or to cli.py) shown as `draftverify`."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if argv and (Path(argv[0]).name == "draftverify" or argv[0].endswith(os.path.join("draftverify", "cli.py"))):
        argv[0] = "draftverify"
    elif len(argv) > 2 and argv[1] == "-m" and argv[2] == "draftverify.cli":
        argv = ["draftverify", *argv[3:]]
    library = os.environ.get("LLAMA_CPP_LIB_PATH")  # llama-cpp-python loads llama.cpp from there (its kernels count)
    if library:
        folder = Path(library).resolve()
        shown = folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder
        return f"LLAMA_CPP_LIB_PATH={shlex.quote(str(shown))} {shlex.join(argv)}"
    return shlex.join(argv)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")
