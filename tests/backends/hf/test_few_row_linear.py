import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from conftest import build_model
from draftverify.backends.hf.few_row_linear import ENV_SWITCH, MAX_ROWS, FewRowLinear, few_row_linears


class CountingMode(torch.overrides.TorchFunctionMode):
    """Records which torch functions the mode under it forwarded (mm = the W @ x.T layout was taken)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def run(x, weight, bias, mode_on=True):
    counter = CountingMode()
    with torch.no_grad(), counter, FewRowLinear() if mode_on else torch.overrides.TorchFunctionMode():
        out = F.linear(x, weight, bias)
    return out, counter.seen


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, MAX_ROWS + 4), lead=st.sampled_from([(), (1,), (2,)]), with_bias=st.booleans())
def test_same_numbers_as_f_linear(rows, lead, with_bias):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(24, 16, generator=g)
    bias = torch.randn(24, generator=g) if with_bias else None
    x = torch.randn(*lead, rows, 16, generator=g)
    out, seen = run(x, weight, bias)
    assert out.shape == (*lead, rows, 24)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    total_rows = x.numel() // 16
    assert ("mm" in seen) == (2 <= total_rows <= MAX_ROWS)  # one row and many rows keep torch's own kernel


def test_one_row_is_bit_identical_and_untouched():
    weight, x = torch.randn(32, 8), torch.randn(1, 8)
    out, seen = run(x, weight, None)
    assert "mm" not in seen
    assert torch.equal(out, F.linear(x, weight))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_pass_through(dtype):
    weight, x = torch.randn(32, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)
    out, seen = run(x, weight, None)
    assert "mm" not in seen
    assert torch.equal(out, F.linear(x, weight))


def test_training_keeps_stock_kernels_and_gradients():
    weight = torch.randn(12, 6, requires_grad=True)
    x = torch.randn(4, 6)
    with FewRowLinear():
        out = F.linear(x, weight)
    out.sum().backward()
    assert weight.grad is not None and torch.allclose(weight.grad, x.sum(0).expand(12, 6))


def test_switches(monkeypatch):
    cpu = torch.device("cpu")
    assert isinstance(few_row_linears(cpu, torch.float32, rows=4), FewRowLinear)
    assert isinstance(few_row_linears(cpu, torch.float32, rows=MAX_ROWS), FewRowLinear)
    for rows in (1, MAX_ROWS + 1):  # one-token decoding and prefills pay no mode dispatch at all
        assert not isinstance(few_row_linears(cpu, torch.float32, rows=rows), FewRowLinear)
    assert not isinstance(few_row_linears(cpu, torch.bfloat16, rows=4), FewRowLinear)
    assert not isinstance(few_row_linears(cpu, torch.float32, rows=4, on=False), FewRowLinear)
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert not isinstance(few_row_linears(cpu, torch.float32, rows=4), FewRowLinear)


def test_cached_lm_logits_match_the_stock_layout(monkeypatch):
    """A verify pass of 4 tokens through CachedLM: same logits (to float32 rounding) with the layout on and off."""
    from draftverify.backends.hf.cached_lm import CachedLM

    tiny_llama = build_model("llama")
    ids = torch.randint(3, tiny_llama.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    outs = []
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV_SWITCH, switch)
        lm = CachedLM(tiny_llama)
        with torch.no_grad():
            lm.start(ids[:, :8])
            outs.append(lm.forward(ids[:, 7:11]).logits)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
