"""utils.course.cpu_bf16: a rehearsal's bf16 matrix products, computed in fp32 as a card computes them."""
import pytest
import torch

from utils.course import cpu_bf16

TORCH_LINEAR = cpu_bf16._TORCH_LINEAR


def operands(dtype, seed=0, bias=True):
    """(input (2, 5, 96), weight (40, 96), bias (40,)): 96 terms a sum, large enough that where the rounding
    happens shows in bf16."""
    g = torch.Generator().manual_seed(seed)
    made = [torch.randn(2, 5, 96, generator=g), torch.randn(40, 96, generator=g), torch.randn(40, generator=g)]
    return [t.to(dtype).requires_grad_() for t in (made if bias else made[:2])]


def grads(fn, tensors):
    out = fn(*tensors)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
    found = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return out.detach(), found


@pytest.mark.parametrize("bias", [True, False])
def test_a_bf16_product_is_the_fp32_product_of_bf16_operands_rounded_once(bias):
    tensors = operands(torch.bfloat16, bias=bias)
    out, got = grads(cpu_bf16.linear, tensors)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got)
    exact = TORCH_LINEAR(*(t.detach().float() for t in tensors)).to(torch.bfloat16)
    assert torch.equal(out, exact), "one rounding, of the fp32 sum"
    # torch's own bf16 kernel (fp32 accumulation too) agrees to bf16's precision, forward and backward
    ref, want = grads(TORCH_LINEAR, tensors)
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.016)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.016)


def test_under_cpu_autocast_fp32_operands_are_rounded_to_bf16_first():
    tensors = operands(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, got = grads(cpu_bf16.linear, tensors)
        ref, want = grads(TORCH_LINEAR, tensors)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert torch.equal(out, TORCH_LINEAR(*(t.detach().to(torch.bfloat16).float() for t in tensors)).to(torch.bfloat16))
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.016)
    assert all(g.dtype == torch.float32 for g in got), "the fp32 parameters get fp32 gradients, as under autocast"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.016)


def test_anything_else_is_torchs_own_linear():
    tensors = operands(torch.float32)
    assert torch.equal(cpu_bf16.linear(*tensors), TORCH_LINEAR(*tensors)), "fp32 untouched, bit for bit"
    x, w, b = operands(torch.bfloat16)
    with pytest.raises(RuntimeError) as theirs:
        TORCH_LINEAR(x.float(), w, b)
    with pytest.raises(RuntimeError) as ours:
        cpu_bf16.linear(x.float(), w, b)
    assert str(ours.value) == str(theirs.value), "a dtype mismatch a card would reject is still rejected"


def test_install_replaces_linear_only_where_needed(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "linear", TORCH_LINEAR)
    monkeypatch.setattr(cpu_bf16, "needed", lambda: False)
    assert cpu_bf16.install() is False and torch.nn.functional.linear is TORCH_LINEAR
    monkeypatch.setattr(cpu_bf16, "needed", lambda: True)
    assert cpu_bf16.install() is True and torch.nn.functional.linear is cpu_bf16.linear
    layer = torch.nn.Linear(96, 40).to(torch.bfloat16)
    x = operands(torch.bfloat16)[0]
    assert torch.equal(layer(x), cpu_bf16.linear(x, layer.weight, layer.bias)), "nn.Linear goes through it"
