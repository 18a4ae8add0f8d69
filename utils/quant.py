"""Quantization helpers for lesson 06 (the quantizers themselves are the lesson's exercises).

Every scheme maps float weights to a few bits plus the float *scales* needed to map back; the
lesson writes the quantizers (absmax, zero-point, block-wise int8, NF4, double quantization;
their answers are in ``utils/solutions/lesson06.py``, checked against bitsandbytes by
``tests/library/test_quant.py``). What the lesson uses around them is here:

* :data:`NF4_CODE`: the 16 values of 4-bit NormalFloat (quantiles of a normal distribution, with
  an exact 0), bitsandbytes' code book;
* the dequantizers of the int8 schemes, and of double quantization;
* :func:`pack_4bit` / :func:`unpack_4bit`: two 4-bit codes per byte, high nibble first, as
  bitsandbytes stores them;
* :func:`nf4_bytes`: the storage an NF4 tensor takes, with or without double quantization.

Shapes: "flattened" means ``x.reshape(-1)`` in row-major order, padded with zeros to a whole number
of blocks (the padding is dropped on dequantization).
"""
from __future__ import annotations

import math

import torch

# bitsandbytes' NF4 code book (bitsandbytes.functional.get_4bit_type("nf4")), ascending.
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
])


# ----------------------------------------------------------------------------- int8
def absmax_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` as float32: the inverse of absmax quantization (``q = round(x / scale)``), up to rounding."""
    return q.float() * scale


def zeropoint_dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """``(q - zero_point) * scale`` as float32."""
    return (q.float() - zero_point) * scale


# ----------------------------------------------------------------------------- blocks
def blockwise_dequantize(q: torch.Tensor, absmax: torch.Tensor, shape, blocksize: int = 64) -> torch.Tensor:
    """Inverse of block-wise absmax int8 (``q = round(127 * x / absmax_block)`` per block of ``blocksize``
    consecutive values of the flattened tensor): a float32 tensor of ``shape``."""
    values = (q.float().view(-1, blocksize) * (absmax[:, None] / 127)).reshape(-1)
    return values[:math.prod(shape)].reshape(shape)


# ----------------------------------------------------------------------------- NF4
def pack_4bit(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, the first in the high nibble (bitsandbytes' layout).

    Args:
        codes: uint8 (N,) with values in [0, 15]; N even.
    Returns:
        uint8 (N // 2,).
    """
    if codes.numel() % 2:
        raise ValueError(f"pack_4bit needs an even number of codes, got {codes.numel()}")
    c = codes.reshape(-1, 2).to(torch.uint8)
    return (c[:, 0] << 4) | c[:, 1]


def unpack_4bit(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_4bit`: uint8 (2 * N,)."""
    p = packed.reshape(-1).to(torch.uint8)
    return torch.stack([p >> 4, p & 15], dim=1).reshape(-1)


# ----------------------------------------------------------------------------- double quantization
def double_dequantize(q: torch.Tensor, absmax2: torch.Tensor, offset: torch.Tensor, n: int,
                      blocksize: int = 256) -> torch.Tensor:
    """Inverse of double quantization (block-wise int8 of ``scales - offset``, blocks of ``blocksize``):
    the ``n`` scales as float32."""
    return blockwise_dequantize(q, absmax2, (n,), blocksize) + offset


def nf4_bytes(numel: int, blocksize: int = 64, double: bool = False) -> float:
    """Bytes to store ``numel`` weights in NF4: half a byte each, plus the scales
    (4 bytes per block; with ``double``: 1 byte per block + 4 per 256 blocks + 4 for the offset)."""
    n_blocks = math.ceil(numel / blocksize)
    scales = (n_blocks + 4 * math.ceil(n_blocks / 256) + 4) if double else 4 * n_blocks
    return numel / 2 + scales
