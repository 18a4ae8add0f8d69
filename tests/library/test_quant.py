"""Lesson 06's quantizers (utils/solutions/lesson06.py) and utils/quant.py: hand-computed values, and NF4 equal
to bitsandbytes' quantize_4bit / dequantize_4bit."""
import math

import bitsandbytes.functional as bnbf
import nbformat
import pytest
import torch

from utils import quant
from utils.constants import NOTEBOOKS_DIR
from utils.solutions import lesson06 as l06


# ============================================================================= hand-computed values
def test_absmax_per_tensor_and_per_row():
    q, s = l06.absmax_quantize(torch.tensor([1.0, -2.0, 0.5, 0.0]))
    assert q.dtype == torch.int8 and q.tolist() == [64, -127, 32, 0]     # 63.5 rounds to even (64)
    assert s.item() == pytest.approx(2 / 127)
    assert quant.absmax_dequantize(q, s).tolist() == pytest.approx([64 * 2 / 127, -2.0, 32 * 2 / 127, 0.0])
    q, s = l06.absmax_quantize(torch.tensor([[1.0, -2.0], [0.5, 0.25]]), dim=-1)
    assert q.tolist() == [[64, -127], [127, 64]] and s.shape == (2, 1)
    assert s.flatten().tolist() == pytest.approx([2 / 127, 0.5 / 127])
    q, s = l06.absmax_quantize(torch.zeros(3))
    assert q.tolist() == [0, 0, 0] and s.item() == 1.0


def test_zeropoint_uses_all_levels():
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    q, s, z = l06.zeropoint_quantize(x)
    assert q.tolist() == [-128, -43, 42, 127]
    assert s.item() == pytest.approx(3 / 255) and z.item() == -128
    assert torch.allclose(quant.zeropoint_dequantize(q, s, z), x, atol=1e-5)
    # on values far from 0, zero-point beats absmax
    y = torch.linspace(10, 11, 100)
    err_zp = (quant.zeropoint_dequantize(*l06.zeropoint_quantize(y)) - y).abs().max()
    err_abs = (quant.absmax_dequantize(*l06.absmax_quantize(y)) - y).abs().max()
    assert err_zp < err_abs / 5


def test_blockwise_isolates_an_outlier():
    q, absmax = l06.blockwise_quantize(torch.tensor([1.0, -2.0, 4.0, 8.0]), blocksize=2)
    assert q.tolist() == [64, -127, 64, 127] and absmax.tolist() == [2.0, 8.0]
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0))
    x[5] = 100.0                                                    # one outlier
    per_tensor = (quant.absmax_dequantize(*l06.absmax_quantize(x)) - x).abs().mean()
    blockwise = (quant.blockwise_dequantize(*l06.blockwise_quantize(x, 64), x.shape, 64) - x).abs().mean()
    assert blockwise < per_tensor / 5


def test_nf4_known_codes_pack_and_padding():
    codes, absmax = l06.nf4_quantize(torch.tensor([1.0, -0.5, 0.0, 0.1]), blocksize=4)
    assert codes.tolist() == [15, 2, 7, 8] and absmax.tolist() == [1.0]
    assert quant.pack_4bit(codes).tolist() == [0xF2, 0x78]
    assert quant.unpack_4bit(quant.pack_4bit(codes)).tolist() == [15, 2, 7, 8]
    x = torch.randn(5, 7)                                           # 35 values: one padded block of 64
    codes, absmax = l06.nf4_quantize(x)
    assert codes.shape == (64,) and absmax.shape == (1,)
    back = l06.nf4_dequantize(codes, absmax, x.shape)
    assert back.shape == x.shape and (back - x).abs().max() <= absmax.item() * 0.17   # half the widest code gap
    assert len(quant.NF4_CODE) == 16 and quant.NF4_CODE[7] == 0 and quant.NF4_CODE.diff().min() > 0


def test_double_quantization():
    q, absmax2, offset = l06.double_quantize(torch.tensor([1.0, 2.0, 3.0, 4.0]), blocksize=2)
    assert offset.item() == 2.5 and q.tolist() == [-127, -42, 42, 127] and absmax2.tolist() == [1.5, 1.5]
    back = quant.double_dequantize(q, absmax2, offset, 4, blocksize=2)
    assert back.tolist() == pytest.approx([1.0, 2.5 - 42 * 1.5 / 127, 2.5 + 42 * 1.5 / 127, 4.0], abs=1e-6)
    assert quant.nf4_bytes(4096) == 2048 + 64 * 4
    assert quant.nf4_bytes(4096, double=True) == 2048 + 64 + 4 + 4


def test_errors_are_helpful():
    with pytest.raises(ValueError, match="even"):
        quant.pack_4bit(torch.tensor([1, 2, 3], dtype=torch.uint8))


# ============================================================================= against bitsandbytes
@pytest.mark.parametrize("shape", [(256, 192), (100, 30)])       # a whole number of blocks, and not
def test_nf4_equals_bitsandbytes(shape):
    import bitsandbytes.functional as bnbf

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=gen) * 0.02
    w.view(-1)[::97] *= 20                                          # some outliers
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    assert torch.allclose(state.code.float(), quant.NF4_CODE), "the code book is bitsandbytes' NF4"

    codes, absmax = l06.nf4_quantize(w, blocksize=64)
    torch.testing.assert_close(absmax, state.absmax.float())
    assert torch.equal(quant.pack_4bit(codes)[:packed.numel()], packed.reshape(-1)), "the same bytes"
    theirs = bnbf.dequantize_4bit(packed, state)
    ours = l06.nf4_dequantize(codes, absmax, shape)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    # and the quantization error itself is bounded by half the largest gap of the code book, per block
    assert ((ours - w).abs() <= 0.17 * absmax.repeat_interleave(64)[: w.numel()].view(shape) + 1e-7).all()


def test_double_quantized_scales_close_to_bitsandbytes():
    import bitsandbytes.functional as bnbf

    w = torch.randn(512, 512, generator=torch.Generator().manual_seed(1))
    _, plain = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    _, double = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    q, absmax2, offset = l06.double_quantize(plain.absmax.float())
    ours = quant.double_dequantize(q, absmax2, offset, plain.absmax.numel())
    theirs = bnbf.dequantize_blockwise(double.absmax, double.state2) + double.offset
    assert offset.item() == pytest.approx(double.offset.item(), rel=1e-5)   # both subtract the mean
    # both keep the scales to within 1 % of their value (ours: linear int8; theirs: 8-bit dynamic code)
    assert ((ours - plain.absmax).abs() / plain.absmax).max() < 0.01
    assert ((theirs - plain.absmax).abs() / plain.absmax).max() < 0.01


def _nf4_check_cell() -> str:
    lesson = nbformat.read(NOTEBOOKS_DIR / "06_quantization.ipynb", as_version=4)
    (cell,) = [c for c in lesson.cells if c.get("id") == "afd9bb11"]
    assert cell.source.startswith("# Graded check: NF4")
    return cell.source


def test_nf4_graded_check_rejects_an_answer_that_ignores_the_absmax():
    """The graded check of lesson 06 fails an NF4 that never divides by (or multiplies back by) the
    block absmax, and passes the reference answer."""
    def no_scaling_quantize(x, blocksize=64, code=quant.NF4_CODE):
        flat = x.float().reshape(-1)
        flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % blocksize)])
        absmax = flat.view(-1, blocksize).abs().amax(dim=1)
        return (flat.reshape(-1, 1) - code).abs().argmin(dim=1).to(torch.uint8), absmax

    def no_scaling_dequantize(codes, absmax, shape, blocksize=64, code=quant.NF4_CODE):
        return code[codes.long()][:math.prod(shape)].reshape(shape)

    env = {"torch": torch, "quant": quant, "bnbf": bnbf, "math": math}
    exec(_nf4_check_cell(), dict(env, nf4_quantize=l06.nf4_quantize, nf4_dequantize=l06.nf4_dequantize))
    with pytest.raises(AssertionError):
        exec(_nf4_check_cell(), dict(env, nf4_quantize=no_scaling_quantize, nf4_dequantize=l06.nf4_dequantize))
    with pytest.raises(AssertionError):
        exec(_nf4_check_cell(), dict(env, nf4_quantize=l06.nf4_quantize, nf4_dequantize=no_scaling_dequantize))
