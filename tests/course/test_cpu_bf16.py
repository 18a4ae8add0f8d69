"""utils.course.cpu_bf16: a rehearsal's bf16 matrix products, computed in fp32 as a card computes them."""
import pytest
import torch

from utils.course import cpu_bf16

TORCH_LINEAR, TORCH_MM = cpu_bf16._TORCH_LINEAR, cpu_bf16._TORCH_MM


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


def test_install_replaces_linear_and_mm_only_where_needed(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "linear", TORCH_LINEAR)
    monkeypatch.setattr(torch, "mm", TORCH_MM)
    monkeypatch.setattr(cpu_bf16, "needed", lambda: False)
    assert cpu_bf16.install() is False and torch.nn.functional.linear is TORCH_LINEAR and torch.mm is TORCH_MM
    monkeypatch.setattr(cpu_bf16, "needed", lambda: True)
    assert cpu_bf16.install() is True and torch.nn.functional.linear is cpu_bf16.linear and torch.mm is cpu_bf16.mm
    layer = torch.nn.Linear(96, 40).to(torch.bfloat16)
    x = operands(torch.bfloat16)[0]
    assert torch.equal(layer(x), cpu_bf16.linear(x, layer.weight, layer.bias)), "nn.Linear goes through it"


def matrices(dtype, seed=1):
    """(a (12, 96), b (96, 40)): as :func:`operands`, a sum of 96 terms."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(12, 96, generator=g).to(dtype).requires_grad_(), torch.randn(96, 40, generator=g).to(dtype)]


def test_mm_is_the_fp32_product_of_bf16_operands_rounded_once_with_or_without_out():
    a, b = matrices(torch.bfloat16)
    b.requires_grad_()
    out, got = grads(cpu_bf16.mm, [a, b])
    exact = TORCH_MM(a.detach().float(), b.detach().float()).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact)
    ref, want = grads(TORCH_MM, [a, b])
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.016)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=0.05, rtol=0.016)
    buffer = torch.full((16, 48), 7.0, dtype=torch.bfloat16)   # TRL's pattern: a tile, a view of a larger buffer
    with torch.no_grad():
        tile = buffer[:12, :40]
        assert cpu_bf16.mm(a, b, out=tile) is tile
    assert torch.equal(tile, exact) and (buffer[12:] == 7).all() and (buffer[:, 40:] == 7).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32 = [t.detach().float() for t in (a, b)]
        assert torch.equal(cpu_bf16.mm(*fp32), exact) and TORCH_MM(*fp32).dtype == torch.bfloat16


def test_mm_leaves_everything_else_to_torch():
    a, b = matrices(torch.float32)
    assert torch.equal(cpu_bf16.mm(a, b), TORCH_MM(a, b)), "fp32 untouched, bit for bit"
    x, y = matrices(torch.bfloat16)
    cases = [((x.float(), y), {}),                                              # mixed dtypes
             ((x, y), {"out": torch.empty(12, 40, dtype=torch.bfloat16)}),       # out= under autograd
             ((x.detach(), y), {"out": torch.empty(12, 40)})]                    # an fp32 out for bf16 operands
    for args, kwargs in cases:
        with pytest.raises(RuntimeError) as theirs:
            TORCH_MM(*args, **kwargs)
        with pytest.raises(RuntimeError) as ours:
            cpu_bf16.mm(*args, **kwargs)
        assert str(ours.value) == str(theirs.value)


def test_trls_chunked_log_probabilities_go_through_mm(monkeypatch):
    """TRL's fused log-probabilities (GRPO's and DPO's on a GPU preset) compute their logits tiles with
    ``torch.mm``: installed, the shim computes them, and the log-probabilities and gradients stay those of
    torch's own bf16 kernel to bf16's precision."""
    from trl.kernels import ChunkedLogProbFunction

    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(10, 32, generator=g).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(300, 32, generator=g) / 4).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 300, (10,), generator=g)

    def run():
        logprobs, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 128)
        (logprobs.sum() + entropy.sum()).backward()
        found = [logprobs.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone()]
        hidden.grad = weight.grad = None
        return found

    want = run()
    calls = []
    monkeypatch.setattr(torch.nn.functional, "linear", TORCH_LINEAR)
    monkeypatch.setattr(torch, "mm", TORCH_MM)
    monkeypatch.setattr(cpu_bf16, "needed", lambda: True)
    monkeypatch.setattr(cpu_bf16, "_TORCH_MM", lambda *a, **k: calls.append(a[0].dtype) or TORCH_MM(*a, **k))
    assert cpu_bf16.install() is True and torch.mm is cpu_bf16.mm
    got = run()
    assert calls and set(calls) == {torch.float32}, "every tile's product computed in fp32"
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=0.05, rtol=0.016)
