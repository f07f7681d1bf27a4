"""Linear layers on a few rows, computed as W @ x.T on the CPU: what makes verifying 2-16 tokens cheap there.

`F.linear(x, W)` computes x @ W.T. For one row the CPU BLAS takes its matrix-vector path; for 2-16 rows (a verify
pass of n tokens runs every linear of the model at n rows) MKL on x86 takes a GEMM path that streams the
model's weights far more slowly, so scoring a few tokens costs well over one token's time although the weights
read are the same. The same product as W @ x.T stays near the one-row time.

The switch is a torch function mode entered around a model's forward: it changes no module, holds no state
(modes are per thread, so concurrent requests in a server are safe) and applies to every architecture that calls
`F.linear` (all Hugging Face models do). Results equal `F.linear`'s up to float32 summation order (about 1e-5 on
the zoo's logits); one row, other dtypes and other devices pass through untouched.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# past a few rows the product is compute-bound and the stock GEMM path catches up (`bench --cost-curve`'s
# eager-float32-gemm mode shows where on a given machine)
MAX_ROWS = 8
ENV_SWITCH = "DRAFTVERIFY_FEW_ROW_LINEAR"  # "0" turns the layout off for a process


class FewRowLinear(TorchFunctionMode):
    """Inside this mode, F.linear on 2..MAX_ROWS rows of a CPU float32 input runs as W @ x.T (inference only:
    with autograd on, training keeps the stock kernels)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
            if (
                2 <= rows <= MAX_ROWS
                and weight.dim() == 2
                and x.dtype == weight.dtype == torch.float32
                and x.device.type == "cpu"
                and not torch.is_grad_enabled()
            ):
                return few_row_linear(x, weight, bias)
        return func(*args, **kwargs)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as W @ x.T: x [..., in], weight [out, in] -> [..., out]. For callers that
    run their own linears (backends/lean.py) and so need no mode; `takes_few_rows` says when it pays."""
    rows = x.numel() // max(x.shape[-1], 1)
    out = torch.mm(weight, x.reshape(rows, -1).t()).t()  # [rows, out]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def takes_few_rows(device: torch.device, dtype: torch.dtype, rows: int) -> bool:
    """Whether a linear over `rows` rows of a `dtype` input on `device` is faster as W @ x.T (and it is switched on)."""
    return 2 <= rows <= MAX_ROWS and device.type == "cpu" and dtype == torch.float32 and enabled()


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def few_row_linears(device: torch.device, dtype: torch.dtype, rows: int, on: bool = True):
    """The mode for a forward of `rows` token rows (batch x tokens) of a model on `device` in `dtype`; a no-op
    context where it cannot help. A mode sees every torch call of the forward (a Python dispatch per call, a
    cost one-token decoding need not pay), so it is entered only for 2..MAX_ROWS rows."""
    if on and takes_few_rows(device, dtype, rows):
        return FewRowLinear()
    return contextlib.nullcontext()
