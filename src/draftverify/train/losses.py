"""Next-token losses of a causal LM on token windows ``x [B, T+1]`` (inputs ``x[:, :-1]``, targets ``x[:, 1:]``).

One implementation for the CPU recipes (`train lm`, `train early-exit`) and the zoo's GPU recipe, so the
early-exit layer the zoo ships was trained with exactly the loss the recipe reports and checks.

BiLD section 4.4 (Kim et al.): to make the target's first L layers a usable small model, fine-tune with the
average of the last layer's loss and layer L's, where layer L's hidden state goes through the model's own
(shared) final norm and LM head, as the `early_exit` drafter runs it.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from .settings import TrainError


def autocast(bf16: bool, device=None):
    """bf16 autocast for the ops on `device` (a torch.device or its name; None: the CPU's and, on a machine with a
    CUDA GPU, the GPU's, so a recipe's loss needs no device of its own), or nothing."""
    import torch

    if not bf16:
        return contextlib.nullcontext()
    kinds = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])] if device is None else [torch.device(device).type]
    return _autocasts(kinds)


@contextlib.contextmanager
def _autocasts(kinds: list[str]):
    import torch

    with contextlib.ExitStack() as stack:
        for kind in kinds:
            stack.enter_context(torch.autocast(kind, dtype=torch.bfloat16))
        yield


def _cross_entropy(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def early_exit_head(model, hidden):
    """Logits of a hidden state of an intermediate layer: the model's final norm, then its LM head (Llama-style
    models: ``model.model.norm`` and ``lm_head``)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None:
        raise TrainError(f"{type(model).__name__} has no model.norm: early-exit training supports Llama-style models")
    return model.get_output_embeddings()(norm(hidden))


def next_token_losses(model, x, exit_layer: Optional[int] = None):
    """(final-layer loss, layer `exit_layer`'s loss or None). Mean cross-entropy per token; call under autocast."""
    out = model(input_ids=x[:, :-1], use_cache=False, output_hidden_states=exit_layer is not None)
    targets = x[:, 1:]
    final = _cross_entropy(out.logits, targets)
    if exit_layer is None:
        return final, None
    # hidden_states[0] is the embedding output, hidden_states[L] the output of layer L
    return final, _cross_entropy(early_exit_head(model, out.hidden_states[exit_layer]), targets)


def averaged_loss(final, early):
    """BiLD 4.4's training objective: the plain average of the last layer's and the early layer's losses."""
    return 0.5 * (final + early)


def lm_loss(model, x, bf16: bool):
    """The final layer's next-token loss (the plain LM objective)."""
    with autocast(bf16):
        return next_token_losses(model, x)[0]


def held_out_losses(
    model, windows, bf16: bool, batch_size: int, exit_layer: Optional[int] = None, device: str = "cpu"
) -> tuple[float, Optional[float]]:
    """Mean (final, early-exit or None) loss over fixed windows, in eval mode without gradients; the model's
    training mode is restored."""
    import torch

    was_training = model.training
    model.eval()
    tot, tot_early, n = 0.0, 0.0, 0
    with torch.no_grad(), autocast(bf16, device):
        for i in range(0, len(windows), batch_size):
            xb = windows[i : i + batch_size].to(device)
            final, early = next_token_losses(model, xb, exit_layer)
            tot += final.item() * xb.size(0)
            tot_early += 0.0 if early is None else early.item() * xb.size(0)
            n += xb.size(0)
    if was_training:
        model.train()
    n = max(n, 1)
    return tot / n, (None if exit_layer is None else tot_early / n)


def evaluate(model, windows, bf16: bool, batch_size: int, device="cpu") -> float:
    """Mean held-out loss of the final layer over fixed windows (the figure every model card reports)."""
    return held_out_losses(model, windows, bf16, batch_size, device=device)[0]
