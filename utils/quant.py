"""Weight quantization, written out (reference implementations for the quantization lesson).

Every scheme maps float weights to a few bits plus the float *scales* needed to map back:

* :func:`absmax_quantize`: symmetric int8, ``q = round(x / s)``, ``s = absmax / 127``, one scale
  per tensor (``dim=None``) or per row (``dim=-1``).
* :func:`zeropoint_quantize`: asymmetric int8 over ``[min, max]``, ``q = round(x / s) + z``,
  ``s = (max - min) / 255``: uses all 256 levels when the values are not centred on 0.
* :func:`blockwise_quantize`: absmax int8 per block of ``blocksize`` consecutive values (of the
  flattened tensor), as bitsandbytes does: an outlier only costs precision in its own block.
* :func:`nf4_quantize`: 4-bit NormalFloat (Dettmers et al., 2023, QLoRA): each block is scaled
  by its absmax into [-1, 1] and every value is replaced by the index of the nearest of the 16
  values of :data:`NF4_CODE` (quantiles of a normal distribution, with an exact 0). Equal to
  ``bitsandbytes.functional.quantize_4bit(..., quant_type="nf4")`` (``tests/test_quant.py``).
  :func:`pack_4bit` stores two codes per byte, high nibble first, as bitsandbytes does.
* :func:`double_quantize`: QLoRA's double quantization of the per-block scales: subtract their
  mean, then int8 absmax per block of 256 scales, so a scale costs ~1 byte instead of 4.

Shapes: ``x`` any float tensor; "flattened" means ``x.reshape(-1)`` in row-major order, padded
with zeros to a whole number of blocks (the padding is dropped on dequantization).
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


def _check_float(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got {type(x).__name__}"
                         f"{'' if not isinstance(x, torch.Tensor) else ' of dtype ' + str(x.dtype)}")


# ----------------------------------------------------------------------------- int8
def absmax_quantize(x: torch.Tensor, dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization.

    Args:
        x: float tensor.
        dim: None for one scale for the whole tensor, or the dimension to reduce over
            (``dim=-1`` on a (rows, cols) weight gives one scale per row).
    Returns:
        ``(q, scale)``: ``q`` int8 of x's shape, ``round(x / scale)`` in [-127, 127];
        ``scale`` float32, ``absmax / 127`` (shape () or x's shape with ``dim`` kept as 1).
        An all-zero tensor (or row) gets scale 1.
    """
    _check_float(x)
    x = x.float()
    absmax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def absmax_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` as float32 (the inverse of :func:`absmax_quantize`, up to rounding)."""
    return q.float() * scale


def zeropoint_quantize(x: torch.Tensor, dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric (zero-point) int8 quantization over ``[min, max]``.

    Returns:
        ``(q, scale, zero_point)``: ``scale = (max - min) / 255`` (1 if max == min), ``zero_point =
        -128 - round(min / scale)`` (float32), ``q = clamp(round(x / scale) + zero_point, -128, 127)``
        int8. ``min`` maps to -128 and ``max`` to 127 (up to rounding).
    """
    _check_float(x)
    x = x.float()
    lo = x.amin() if dim is None else x.amin(dim=dim, keepdim=True)
    hi = x.amax() if dim is None else x.amax(dim=dim, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / 255, torch.ones_like(hi))
    zero_point = -128 - torch.round(lo / scale)
    q = torch.clamp(torch.round(x / scale) + zero_point, -128, 127).to(torch.int8)
    return q, scale, zero_point


def zeropoint_dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """``(q - zero_point) * scale`` as float32."""
    return (q.float() - zero_point) * scale


# ----------------------------------------------------------------------------- blocks
def _blocks(x: torch.Tensor, blocksize: int) -> torch.Tensor:
    """x flattened, zero-padded to a multiple of ``blocksize``, as (n_blocks, blocksize) float32."""
    if not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"blocksize must be a positive int, got {blocksize!r}")
    flat = x.float().reshape(-1)
    pad = (-flat.numel()) % blocksize
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, blocksize)


def _block_absmax(blocks: torch.Tensor) -> torch.Tensor:
    """(n_blocks,) absmax of each row of ``blocks``, 1 for an all-zero block."""
    absmax = blocks.abs().amax(dim=1)
    return torch.where(absmax > 0, absmax, torch.ones_like(absmax))


def blockwise_quantize(x: torch.Tensor, blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax int8 per block of ``blocksize`` consecutive values of the flattened tensor.

    Returns:
        ``(q, absmax)``: ``q`` int8 of shape (n_blocks * blocksize,) (padded), ``round(127 * x /
        absmax_block)``; ``absmax`` float32 (n_blocks,) (1 for an all-zero block).
    """
    _check_float(x)
    blocks = _blocks(x, blocksize)
    absmax = _block_absmax(blocks)
    q = torch.round(blocks / absmax[:, None] * 127).clamp(-127, 127).to(torch.int8)
    return q.reshape(-1), absmax


def blockwise_dequantize(q: torch.Tensor, absmax: torch.Tensor, shape, blocksize: int = 64) -> torch.Tensor:
    """Inverse of :func:`blockwise_quantize`: float32 tensor of ``shape``."""
    values = (q.float().view(-1, blocksize) * (absmax[:, None] / 127)).reshape(-1)
    return values[:math.prod(shape)].reshape(shape)


# ----------------------------------------------------------------------------- NF4
def nf4_quantize(x: torch.Tensor, blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """4-bit NormalFloat quantization per block (bitsandbytes' ``quant_type="nf4"``).

    Each block of ``blocksize`` consecutive values (flattened tensor) is divided by its absmax,
    and each value becomes the index of the nearest entry of :data:`NF4_CODE`.

    Returns:
        ``(codes, absmax)``: ``codes`` uint8 in [0, 15], shape (n_blocks * blocksize,) (padded);
        ``absmax`` float32 (n_blocks,) (1 for an all-zero block).
    """
    _check_float(x)
    blocks = _blocks(x, blocksize)
    absmax = _block_absmax(blocks)
    normed = (blocks / absmax[:, None]).reshape(-1, 1)
    codes = (normed - NF4_CODE.to(normed.device)).abs().argmin(dim=1)   # nearest code (chunk for huge tensors)
    return codes.to(torch.uint8), absmax


def nf4_dequantize(codes: torch.Tensor, absmax: torch.Tensor, shape, blocksize: int = 64) -> torch.Tensor:
    """Inverse of :func:`nf4_quantize`: ``NF4_CODE[codes] * absmax_block``, float32 of ``shape``."""
    values = (NF4_CODE.to(absmax.device)[codes.long()].view(-1, blocksize) * absmax[:, None]).reshape(-1)
    return values[:math.prod(shape)].reshape(shape)


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
def double_quantize(absmax: torch.Tensor, blocksize: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """QLoRA's double quantization of the per-block scales.

    Args:
        absmax: float32 (n_blocks,), the scales of a first quantization (e.g. NF4's).
        blocksize: scales per second-level block (QLoRA and bitsandbytes: 256).
    Returns:
        ``(q, absmax2, offset)``: ``offset`` the mean of ``absmax`` (float32 scalar); ``q`` int8
        (padded to whole blocks), ``absmax2`` float32 (n_blocks2,): :func:`blockwise_quantize` of
        ``absmax - offset``. Storage: 1 byte per scale plus 4 bytes per 256 scales plus 4.
    """
    _check_float(absmax, "absmax")
    offset = absmax.float().mean()
    q, absmax2 = blockwise_quantize(absmax.float() - offset, blocksize)
    return q, absmax2, offset


def double_dequantize(q: torch.Tensor, absmax2: torch.Tensor, offset: torch.Tensor, n: int,
                      blocksize: int = 256) -> torch.Tensor:
    """Inverse of :func:`double_quantize`: the ``n`` scales as float32."""
    return blockwise_dequantize(q, absmax2, (n,), blocksize) + offset


def nf4_bytes(numel: int, blocksize: int = 64, double: bool = False) -> float:
    """Bytes to store ``numel`` weights in NF4: half a byte each, plus the scales
    (4 bytes per block; with ``double``: 1 byte per block + 4 per 256 blocks + 4 for the offset)."""
    n_blocks = math.ceil(numel / blocksize)
    scales = (n_blocks + 4 * math.ceil(n_blocks / 256) + 4) if double else 4 * n_blocks
    return numel / 2 + scales
