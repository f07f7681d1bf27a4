"""Reading what a run's last checkpoint (transformers' checkpoint-<step> folder) holds, for the tests."""

from __future__ import annotations

from draftverify.train.runner import last_checkpoint


def weights(run_dir) -> dict:
    """The model's tensors in run_dir's last checkpoint (tied ones once)."""
    from safetensors.torch import load_file

    return load_file(last_checkpoint(run_dir) / "model.safetensors")


def optimizer_state(run_dir) -> dict:
    """The optimizer's state_dict in run_dir's last checkpoint."""
    import torch

    return torch.load(last_checkpoint(run_dir) / "optimizer.pt", weights_only=False)


def assert_same_run(a, b) -> None:
    """Two runs' last checkpoints hold the same weights and the same Adam moments."""
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    oa, ob = optimizer_state(a)["state"], optimizer_state(b)["state"]
    assert oa.keys() == ob.keys() and len(oa) > 0
    for pid, st in oa.items():
        assert torch.equal(st["exp_avg_sq"], ob[pid]["exp_avg_sq"])
