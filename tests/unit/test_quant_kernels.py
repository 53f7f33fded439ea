"""Our numba quantizers give llama.cpp's bytes exactly, and gguf's dequantizers read them back."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from lucebox_cli.quant.blocks import TYPES
from lucebox_cli.quant.floats import to_bf16, to_f16
from lucebox_cli.quant.legacy import quantize_q4_0, quantize_q5_0, quantize_q5_1
from lucebox_cli.quant.q4_k import quantize_q4_k
from lucebox_cli.quant.q5_k import quantize_q5_k
from lucebox_cli.quant.q6_k import quantize_q6_k
from lucebox_cli.quant.q8_0 import quantize_q8_0
from tests.unit.ggml_ref import ggml_base, reference_quantize

QUANTIZERS = {
    "Q8_0": quantize_q8_0,
    "Q4_K": quantize_q4_k,
    "Q5_K": quantize_q5_k,
    "Q6_K": quantize_q6_k,
    "Q4_0": quantize_q4_0,
    "Q5_0": quantize_q5_0,
    "Q5_1": quantize_q5_1,
}
COLS = 512


def _adversarial(cols: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    g = rng.standard_normal(cols).astype(np.float32)
    outlier = (g * 0.01).astype(np.float32)
    outlier[37] = 1000.0
    ties = (np.arange(cols, dtype=np.float32) % 33 - 16) * np.float32(0.5)
    one_nonzero = np.zeros(cols, np.float32)
    one_nonzero[300 % cols] = -3.0
    mixed = g.copy()
    mixed[: cols // 2] *= 1e-4  # blocks of very different ranges in one row
    return {
        "zeros": np.zeros(cols, np.float32),
        "outlier": outlier,
        "equal-pos": np.full(cols, 0.37, np.float32),
        "equal-neg": np.full(cols, -2.5, np.float32),
        "negative-only": -np.abs(g) - np.float32(0.1),
        "positive-only": np.abs(g) + np.float32(0.1),
        "denormals": (g * np.float32(1e-39)).astype(np.float32),
        "tiny": (g * np.float32(1e-20)).astype(np.float32),
        "huge": (g * np.float32(1e15)).astype(np.float32),
        "ties": ties,
        "one-nonzero": one_nonzero,
        "mixed-ranges": mixed,
        "int-grid": np.round(g * 8).astype(np.float32),
        "heavy-tail": (rng.standard_t(2, cols) * 0.05).astype(np.float32),
    }


def _random(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row_scale = rng.uniform(1e-3, 3.0, (rows, 1))
    return (rng.standard_normal((rows, cols)) * row_scale).astype(np.float32)


def _ggml_id(name: str) -> int:
    return TYPES[name].ggml_type


@pytest.fixture(scope="module", autouse=True)
def _need_reference():
    ggml_base()


@pytest.mark.parametrize("qtype", list(QUANTIZERS))
def test_random_matrix_matches_llama_cpp(qtype):
    x = _random(40, COLS, seed=hash(qtype) % 1000)
    ours = QUANTIZERS[qtype](x)
    ref = reference_quantize(_ggml_id(qtype), x)
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref), f"{(ours != ref).any(axis=1).sum()} of {x.shape[0]} rows differ"


@pytest.mark.parametrize("case", list(_adversarial(COLS)))
@pytest.mark.parametrize("qtype", list(QUANTIZERS))
def test_adversarial_row_matches_llama_cpp(qtype, case):
    x = _adversarial(COLS)[case].reshape(1, -1)
    ours = QUANTIZERS[qtype](x)
    ref = reference_quantize(_ggml_id(qtype), x)
    assert np.array_equal(ours, ref), f"bytes {np.nonzero(ours[0] != ref[0])[0][:16]} differ"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1"])
def test_gguf_dequantizes_ours_close_to_input(qtype):
    x = _random(8, COLS, seed=3)
    q = QUANTIZERS[qtype](x)
    back = quants.dequantize(q, GGMLQuantizationType[qtype]).reshape(x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2))
    bound = {"Q8_0": 0.01, "Q6_K": 0.02, "Q5_K": 0.04, "Q5_0": 0.05, "Q5_1": 0.05, "Q4_K": 0.08, "Q4_0": 0.1}
    assert rel < bound[qtype]


def test_bf16_matches_gguf_rounding_and_nan():
    vals = np.array(
        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.4e38, np.inf, -np.inf, 1e-40, -1.5e-39],
        np.float32,
    )
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF], np.uint32).view(np.float32)
    x = np.concatenate([vals, nans, _random(4, 64, 1).ravel()])
    ours = to_bf16(x)
    theirs = quants.quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    assert np.array_equal(ours, theirs)


def test_f16_matches_ggml_row_conversion():
    ggml = ggml_base()
    x = np.concatenate([
        _random(2, 256, 5).ravel() * 1000,
        np.array([65519.0, 65520.0, 70000.0, 6e-8, 3e-8, 2.9e-8, 1e-10, -0.0], np.float32),
        np.array([0x7FC00000, 0xFFC12345], np.uint32).view(np.float32),
    ]).astype(np.float32)
    ref = np.zeros(x.size, np.uint16)
    ggml.ggml_quantize_chunk(TYPES["F16"].ggml_type, x.ctypes.data, ref.ctypes.data, 0, 1, x.size, None)
    assert np.array_equal(to_f16(x).view(np.uint16), ref)


def _q6_k_superblocks() -> np.ndarray:
    """Super-blocks whose sub-blocks (16 values each) hit make_qx_quants' edge cases side by side
    with ordinary ones, so one lane's special path cannot leak into its neighbours."""
    rng = np.random.default_rng(11)
    blocks = [(rng.standard_normal(256) * s).astype(np.float32) for s in (0.02, 1.0, 1e3, 1e-3)]
    special = (rng.standard_normal((8, 256)) * 0.05).astype(np.float32)
    special[0, 16:32] = 0.0  # all-zero sub-block: early return, quants 0, scale 0
    special[1, 48:64] = (rng.standard_normal(16) * 1e-39).astype(np.float32)  # denormal, below the eps
    special[2, 0:16] = np.float32(0.25) * np.where(np.arange(16) % 2, 1, -1)  # |x| ties: first wins
    special[3, 240:256] = 0.0
    special[3, 247] = -3.0  # one non-zero value
    special[4, 128:144] = np.float32(2e-15)  # just above GROUP_MAX_EPS
    special[5] = np.round(special[5] * 200)  # integer grid: ties in the candidate scales
    special[6, 32:48] *= np.float32(1e30)  # huge next to ordinary lanes
    special[7] = np.abs(special[7])  # positive only: the max is positive, iscale negative
    return np.concatenate([np.stack(blocks), special])


def test_q6_k_lane_fits_match_scalar_make_qx_quants():
    from lucebox_cli.quant.q6_k import make_qx_quants_rmse1, q6_scratch, subblock_fits

    for x in _q6_k_superblocks():
        L, scales, lanes = q6_scratch()
        L[:] = -999  # every quant must be written
        scales[:] = np.nan  # every scale must be written
        for a in lanes:
            a[...] = np.nan  # no lane may read scratch it did not write
        subblock_fits(x, 0, L, scales, lanes)
        ref_L = np.full(256, -999, np.int64)
        ref_scales = np.array([make_qx_quants_rmse1(x, 16 * j, 16, 32, ref_L, 16 * j) for j in range(16)],
                              np.float32)
        assert np.array_equal(L, ref_L)
        assert np.array_equal(scales.view(np.uint32), ref_scales.view(np.uint32))


def test_q6_k_odd_shapes_match_llama_cpp():
    # an odd row count and a row length of 3 super-blocks; the lane edge cases inside real rows
    x = np.concatenate([_random(37, 768, seed=5), _q6_k_superblocks().reshape(-1, 768)])
    ours = quantize_q6_k(x)
    ref = reference_quantize(_ggml_id("Q6_K"), x)
    assert np.array_equal(ours, ref), f"{(ours != ref).any(axis=1).sum()} of {x.shape[0]} rows differ"


def _k_quant_superblocks() -> np.ndarray:
    """Super-blocks whose sub-blocks (32 values each) hit make_qkx2_quants' edge cases side by side
    with ordinary ones, so one lane's special path cannot leak into its neighbours (16 lanes: the
    8 sub-blocks of two super-blocks)."""
    rng = np.random.default_rng(13)
    blocks = [(rng.standard_normal(256) * s).astype(np.float32) for s in (0.02, 1.0, 1e3, 1e-3)]
    special = (rng.standard_normal((10, 256)) * 0.05).astype(np.float32)
    special[0, 32:64] = 0.0  # all zero: max == min, early return (quants 0, scale 0, min 0)
    special[1, 64:96] = np.float32(0.37)  # constant positive: min clamps to 0, max != min
    special[1, 96:128] = np.float32(-2.5)  # constant negative: max == min, early return with -min
    special[2, 0:32] = np.abs(special[2, 0:32]) + np.float32(0.1)  # positive only: min clamps to 0
    special[3, 224:256] = -np.abs(special[3, 224:256]) - np.float32(0.1)  # negative only
    special[4, 128:160] = (rng.standard_normal(32) * 1e-39).astype(np.float32)  # denormal range
    special[5, 160:192] = 0.0
    special[5, 170] = -3.0  # one non-zero value
    special[6] = np.round(special[6] * 200)  # integer grid: ties in the candidate quants
    special[7, 32:64] *= np.float32(1e15)  # huge next to ordinary lanes
    special[8, 192:224] = (np.arange(32) % 3 - 1) * np.float32(0.5)  # three levels: D = 0 candidates
    special[9, 0:32] = (rng.standard_normal(32) * 1e-20).astype(np.float32)  # tiny
    return np.concatenate([np.stack(blocks), special])


@pytest.mark.parametrize("nmax, rmin, nstep", [(15, -1.0, 20), (31, -0.5, 15), (15, -1.0, 0)],
                         ids=["q4_k", "q5_k", "no-search"])
def test_k_quant_lane_fits_match_scalar_make_qkx2_quants(nmax, rmin, nstep):
    from numba import njit

    from lucebox_cli.quant.q4_k import subblock_fits, subblock_fits_scalar

    @njit(error_model="numpy")  # as the quantizer kernels: float division by zero gives inf/NaN
    def lanes(x, o0, o1, L, scales, mins):
        subblock_fits(x, o0, o1, nmax, np.float32(rmin), np.float32(0.1), nstep, L, scales, mins)

    @njit(error_model="numpy")
    def scalar(x, o, L, scales, mins):
        subblock_fits_scalar(x, o, nmax, np.float32(rmin), np.float32(0.1), nstep, L, scales, mins)

    blocks = _k_quant_superblocks()
    flat = blocks.ravel()
    n = len(blocks)
    # every block in both lane halves, next to a different block each time, and once paired with itself
    pairs = [(a, (a + 1) % n) for a in range(n)] + [((a + 3) % n, a) for a in range(n)] + [(2, 2)]
    for a, b in pairs:
        L = np.full(512, -999, np.int64)  # every quant must be written
        scales = np.full(16, np.nan, np.float32)  # every scale and min must be written
        mins = np.full(16, np.nan, np.float32)
        lanes(flat, 256 * a, 256 * b, L, scales, mins)
        for half, blk in enumerate((a, b)):
            ref_L = np.full(256, -999, np.int64)
            ref_scales = np.full(8, np.nan, np.float32)
            ref_mins = np.full(8, np.nan, np.float32)
            scalar(flat, 256 * blk, ref_L, ref_scales, ref_mins)
            lanes8 = slice(8 * half, 8 * half + 8)
            assert np.array_equal(L[256 * half:256 * half + 256], ref_L), (a, b, half)
            assert np.array_equal(scales[lanes8].view(np.uint32), ref_scales.view(np.uint32)), (a, b, half)
            assert np.array_equal(mins[lanes8].view(np.uint32), ref_mins.view(np.uint32)), (a, b, half)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_k_quant_odd_shapes_match_llama_cpp(qtype):
    # super-blocks are fitted two at a time: an odd count per row (3, then 1) fits the last one
    # alone; odd row counts; the lane edge cases inside real rows
    x3 = np.concatenate([_random(37, 768, seed=6), _k_quant_superblocks()[:12].reshape(-1, 768)])
    x1 = np.concatenate([_random(5, 256, seed=7), _k_quant_superblocks()])
    for x in (x3, x1):
        ours = QUANTIZERS[qtype](x)
        ref = reference_quantize(_ggml_id(qtype), x)
        assert np.array_equal(ours, ref), f"{(ours != ref).any(axis=1).sum()} of {x.shape[0]} rows differ"
