"""bf16 matrix products on a CPU without native bf16 units, computed as a card computes them (rehearsals only).

A GPU's bf16 matrix product reads bf16 operands, accumulates in fp32 and rounds the result to bf16. On a CPU,
torch hands a bf16 product to oneDNN only where the CPU has AVX-512's bf16 instructions (or AMX); elsewhere
(AVX2 machines: many AMD EPYCs) ATen falls back to a plain loop. Measured on a 2-core AVX2 EPYC, one thread: the
logits layer of a rehearsal's stand-in (256 tokens x 64 -> Qwen's 151,936-token vocabulary) took 1.8 s forward
and 17.2 s backward in bf16, against 0.22 s and 0.50 s in fp32: a `24g` rehearsal of lesson 04 took 234 s.

:func:`install` replaces ``torch.nn.functional.linear`` (what ``nn.Linear``, PEFT's LoRA layers and the models'
heads call) with :func:`linear`, and ``torch.mm`` (what TRL's chunked log-probabilities, ``trl/kernels/
chunked_logprob.py``, call on each tile of the logits) with :func:`mm`. Both do exactly that arithmetic in fp32
kernels: bf16 operands (rounded to bf16 first, as autocast would), an fp32 product and sum, one rounding to bf16.
Every other case, mixed dtypes included, goes to torch's own function unchanged, so a dtype error a card would
raise is still raised. A rehearsal's kernel installs both at start-up (``utils.course.rehearsal.KERNEL_STARTUP``)
on such CPUs only; nothing a rehearsal records is compared, and its report says so. No lesson imports this
module: a lesson's run computes with torch's own kernels.

The start-up runs this file's source (it imports nothing of ``utils``), before the notebook's setup cell makes
``utils`` importable.
"""
from __future__ import annotations

import torch

_TORCH_LINEAR = torch.nn.functional.linear
_TORCH_MM = torch.mm


def needed() -> bool:
    """True where torch has no fast bf16 matrix product on this CPU (oneDNN's needs AVX-512 bf16 or AMX)."""
    try:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):   # a torch built without oneDNN: ATen's loop, as above
        return True


def _bf16_product(tensors) -> bool:
    """Whether a product of ``tensors`` (plain tensors: ``linear``'s input, weight and the bias when given, or
    ``mm``'s two matrices) is a bf16 product: all bf16, or all floating point under CPU autocast to bf16 (which
    casts them to bf16 before the product); on the CPU."""
    if not all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.is_floating_point()
               for t in tensors):
        return False
    return all(t.dtype == torch.bfloat16 for t in tensors) or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def _as_a_card(op, tensors) -> torch.Tensor:
    """``op(*tensors)`` as a card computes a bf16 product: from the operands rounded to bf16, in fp32 (autocast off),
    the result rounded to bf16 once."""
    with torch.autocast("cpu", enabled=False):
        return op(*(t.to(torch.bfloat16).float() for t in tensors)).to(torch.bfloat16)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear`` (``input @ weight.T + bias``; input ``(*, in)``, weight ``(out, in)``, bias
    ``(out,)``); a bf16 product (:func:`_bf16_product`) is computed in fp32 from the bf16-rounded operands and
    returned in bf16, differentiable as the original. Anything else is torch's own ``linear``."""
    tensors = (input, weight) if bias is None else (input, weight, bias)
    if not _bf16_product(tensors):
        return _TORCH_LINEAR(input, weight, bias)
    return _as_a_card(_TORCH_LINEAR, tensors)


def mm(input: torch.Tensor, mat2: torch.Tensor, **kwargs) -> torch.Tensor:
    """``torch.mm`` (input ``(n, m)`` @ mat2 ``(m, p)`` -> ``(n, p)``, optionally into ``out=``); a bf16 product
    (:func:`_bf16_product`) is computed in fp32 from the bf16-rounded operands and rounded to bf16 once,
    differentiable as the original. Into ``out=`` only all-bf16 tensors of matching shapes without autograd (torch
    autocasts no ``out=`` call and differentiates none). Anything else is torch's own ``mm``."""
    out = kwargs.get("out")
    ours = not set(kwargs) - {"out"} and _bf16_product((input, mat2)) and input.dim() == mat2.dim() == 2
    if ours and out is not None:
        ours = (type(out) is torch.Tensor and input.dtype == mat2.dtype == out.dtype == torch.bfloat16
                and out.shape == (input.shape[0], mat2.shape[1])
                and not (torch.is_grad_enabled() and (input.requires_grad or mat2.requires_grad)))
    if not ours:
        return _TORCH_MM(input, mat2, **kwargs)
    result = _as_a_card(_TORCH_MM, (input, mat2))
    return result if out is None else out.copy_(result)


def install() -> bool:
    """Make ``torch.nn.functional.linear`` :func:`linear` and ``torch.mm`` :func:`mm` where :func:`needed`; True
    if it did."""
    if not needed():
        return False
    torch.nn.functional.linear, torch.mm = linear, mm
    return True
