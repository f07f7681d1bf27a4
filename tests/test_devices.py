"""--device / --dtype: a device string is checked against what the machine has (one line naming what is there), auto
picks a dtype that fits the device, and load(device=) puts every model and tensor a method builds on that device."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import draftverify
from draftverify import devices
from draftverify.cli import app
from draftverify.errors import DraftVerifyError

runner = CliRunner()


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine that reports one CUDA GPU (nothing runs on it: only the checks read these)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize("text", ["cpu", "cuda", "cuda:0", "cuda:12", "mps", " cpu "])
def test_device_strings_are_read(text):
    assert devices.check_device_form(text) == text.strip()


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:x", "cuda0", "CPU", "", "cpu:0", 3, None])
def test_malformed_device_strings_are_refused(text):
    with pytest.raises(DraftVerifyError, match=r"--device must be cpu, cuda, cuda:N or mps"):
        devices.check_device_form(text)


def test_cpu_resolves():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    assert devices.resolve("cpu", "auto") == (torch.device("cpu"), "float32")


def test_cuda_without_a_gpu_is_refused_naming_what_is_there(no_gpu):
    with pytest.raises(DraftVerifyError) as err:
        devices.resolve_device("cuda")
    message = str(err.value)
    assert "'cuda' is not available" in message and message.endswith("available: cpu")
    assert "\n" not in message


def test_a_gpu_index_past_the_last_is_refused(one_gpu):
    assert devices.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(DraftVerifyError, match=r"1 CUDA GPU \(cuda:0\.\.cuda:0\); available: cpu, cuda, cuda:0$"):
        devices.resolve_device("cuda:3")


def test_mps_off_a_mac_is_refused(no_gpu):
    with pytest.raises(DraftVerifyError, match="MPS needs a Mac"):
        devices.resolve_device("mps")


def test_auto_dtype_fits_the_device(monkeypatch):
    assert devices.resolve_dtype("auto", "cpu") == "float32"
    assert devices.resolve_dtype("auto", "mps") == "float16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert devices.resolve_dtype("auto", "cuda:1") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert devices.resolve_dtype("auto", "cuda") == "float16"
    assert devices.resolve_dtype("float16", "cpu") == "float16"  # asked for: kept
    with pytest.raises(DraftVerifyError, match="--dtype must be one of auto, float32, bfloat16, float16"):
        devices.resolve_dtype("fp8", "cpu")


def test_load_refuses_a_missing_device_before_reading_weights(no_gpu, tmp_path):
    with pytest.raises(DraftVerifyError, match="'cuda:1' is not available"):
        draftverify.load(target=tmp_path / "nothing-here", method="ngram", device="cuda:1")


def test_the_llamacpp_backend_refuses_a_gpu_device(one_gpu, tmp_path):
    with pytest.raises(DraftVerifyError, match="llamacpp backend runs on the CPU only"):
        draftverify.load(target=tmp_path / "x.gguf", method="ngram", backend="llamacpp", device="cuda", dtype="float32")


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--zoo", "code", "--prompt", "x", "--device", "cuda:3"],
        ["generate", "--zoo", "code", "--prompt", "x", "--device", "tpu"],
        ["serve", "--zoo", "code", "--device", "cuda:3", "--port", "0"],
        ["bench", "speed", "--quick", "--device", "cuda:3", "--no-plots"],
        ["bench", "speed", "--cost-curve", "--quick", "--device", "cuda:3", "--no-plots"],
        ["train", "heads", "--device", "cuda:3", "--max-steps", "1"],
    ],
)
def test_commands_refuse_a_missing_device_in_one_line(args, no_gpu, tmp_path):
    result = runner.invoke(app, args + (["--out", str(tmp_path / "out")] if args[0] in ("bench", "train") else []))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) <= 2 and "Traceback" not in result.output  # the loading notice, then the error
    assert "available: cpu" in lines[-1] or "--device must be" in lines[-1]


def _tensors(obj, seen: set[int], depth: int = 0):
    """Every parameter, buffer and tensor reachable from a drafter's attributes (modules walked whole)."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, seen, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, seen, depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("draftverify"):
        for item in vars(obj).values():
            yield from _tensors(item, seen, depth + 1)


@pytest.mark.parametrize("method", ["bpd", "bita", "specdec", "model", "early_exit"])
def test_every_model_and_tensor_a_method_builds_follows_the_target(method):
    pipe = draftverify.load(zoo="code", method=method, device="cpu", dtype="auto")
    pipe.generate("def add(a, b):", max_new_tokens=4)  # the per-generation state is built too
    target = pipe.target
    assert target.device == torch.device("cpu")
    modules = [target.model, *(m.model for m in pipe.drafter.models() if hasattr(m, "model"))]
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    tensors += list(_tensors(pipe.drafter, set()))
    assert len(tensors) > 10
    assert {t.device for t in tensors} == {torch.device("cpu")}
    assert {p.dtype for p in target.model.parameters()} == {torch.float32}  # auto on the CPU


@pytest.mark.parametrize("method", ["bpd", "bita", "specdec"])
def test_the_zoos_pieces_load_on_a_bfloat16_target(method):
    """What --device cuda --dtype auto gives a GPU: the shipped heads, adapter and NAT drafter match the target."""
    pipe = draftverify.load(zoo="code", method=method, dtype="bfloat16")
    assert next(pipe.target.model.parameters()).dtype == torch.bfloat16
    assert pipe.generate("def add(a, b):", max_new_tokens=4).output.stats.new_tokens == 4
