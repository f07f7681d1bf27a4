"""Which device and precision models run on: `--device` / `--dtype` of every command and `load(device=, dtype=)`.

A device string is checked against what this machine has before any model loads, so a missing GPU is one line
naming the devices there are, not a CUDA traceback half-way through loading. torch is imported only by the checks
that need it: the CLI's argument errors stay fast.
"""

from __future__ import annotations

import re

from .errors import DraftVerifyError

DEVICE_FORMS = "cpu, cuda, cuda:N or mps"
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
DEVICE_HELP = f"Where the models run: {DEVICE_FORMS} (default cpu)."
DTYPE_HELP = (
    "Weights' precision: auto (float32 on cpu, bfloat16 on a CUDA GPU that supports it else float16, float16 on mps), "
    "float32, bfloat16 or float16."
)
_FORM = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")


def available_devices() -> list[str]:
    """The device strings this machine can run on, cpu first."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        out += ["cuda"] + [f"cuda:{i}" for i in range(count)]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def check_device_form(device: object) -> str:
    """device, if it is written as a device (no torch import); else DraftVerifyError."""
    if not isinstance(device, str) or not _FORM.match(device.strip()):
        raise DraftVerifyError(f"--device must be {DEVICE_FORMS}, got {device!r}")
    return device.strip()


def resolve_device(device: object = "cpu"):
    """The torch.device for a device string, if this machine has it; else one DraftVerifyError naming those it has."""
    import torch

    name = check_device_form(device)
    have = available_devices()
    if name not in have:
        raise DraftVerifyError(f"device {name!r} is not available here: {_why(name)}; available: {', '.join(have)}")
    return torch.device(name)


def _why(name: str) -> str:
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            built = getattr(torch.version, "cuda", None)
            return "this torch finds no CUDA GPU" if built else "this torch was built without CUDA"
        count = torch.cuda.device_count()
        return f"this machine has {count} CUDA GPU{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})"
    return "MPS needs a Mac with Apple silicon and a torch built with MPS"


def check_dtype_name(dtype: object) -> str:
    """dtype, if it is one of DTYPE_NAMES (no torch import); else DraftVerifyError."""
    if dtype not in DTYPE_NAMES:
        raise DraftVerifyError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    return dtype


def resolve_dtype(dtype: object, device) -> str:
    """The dtype name a model on `device` loads at: `auto` picks the one that fits the device (see DTYPE_HELP)."""
    if check_dtype_name(dtype) != "auto":
        return dtype
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float16" if kind == "mps" else "float32"


def resolve(device: object = "cpu", dtype: object = "auto") -> tuple:
    """(torch.device, dtype name): both checked, auto resolved."""
    dev = resolve_device(device)
    return dev, resolve_dtype(dtype, dev)
