"""llama.cpp (llama-cpp-python) and our CPU engine on the same quantized GGUF files.

(a) llama.cpp loads OUR Q4_K_M file and (b) we load llama.cpp's own Q8_0 / Q4_K_M files (made by
`llama_model_quantize` from our F32 GGUF); on each, both engines' logits are compared. The model is
a tiny random Qwen3.5 with hidden 256, so the hidden-wide matrices get real K-quants (Q4_K / Q6_K),
the 128-wide ones the Q5_0 / Q8_0 fallbacks.

Why the bound is not the issue's 1e-3 on a quantized file: ggml's CPU mul_mat converts the
ACTIVATIONS to the weight type's `vec_dot_type` before the dot product (Q8_K for Q4_K/Q5_K/Q6_K,
Q8_0 for Q8_0/Q5_0/Q4_0, F16 for F16); our engine multiplies float32 activations by the dequantized
weights. Measured on this model (18 prompt tokens, llama.cpp with an F32 KV cache), per-position
relative RMS of the logits, max (mean):

    file              ours vs llama.cpp      ours + activation rounding vs llama.cpp
    F32 (ours)        1.2e-5 (2.9e-6)        -
    Q8_0 (llama.cpp)  2.0e-1 (6.7e-2)        3.0e-7 (2.9e-7)
    Q4_K_M (llama)    2.0e-1 (5.5e-2)        1.0e-2 (4.9e-3)
    Q4_K_M (ours)     2.0e-1 (5.5e-2)        1.0e-2 (4.9e-3)

With the activations passed through Q8_K / Q8_0 quantize→dequantize (numpy below, checked
bit-exact against the quantize_row_q8_K / quantize_row_q8_0 that libggml-cpu runs), the Q8_0 file
agrees to float rounding. The Q4_K_M residual is one rounding tie: the blk.3 attn_q input at
token 3, element 47, scales to exactly -42.5 in llama.cpp (rounds to -42) and to -42.50001 in ours
(-43), a 2e-7 float difference upstream; that one int8 step moves token 3's q and k, hence every
later token that attends to it, by up to 1e-2 (tokens that attend elsewhere, and all tokens before
3, agree to 3e-7). The tiny random model amplifies activation noise (the rounding alone moves its
logits by 20%), so one tie is visible. How many ties there are depends on which ggml-cpu kernels
the machine gets: on an AMD EPYC without AVX2 (session 11, llama-cpp-python 0.3.36 built natively)
three positions are hit, rest max 1.0e-2 and mean 6.7e-3 against a gap mean of 5.5e-2 (88%
explained), while positions 0-2 still agree to 3e-7. Hence the bounds: F32 1e-4; quantized files:
activation rounding must explain at least 80% of the mean gap, some position must agree to float
rounding (< 1e-5: the rounding emulation is exact where no tie has propagated), and what remains
is held under 2.5e-2 (about twice one tie). The default F16 KV cache adds 7e-4 on its own (F32 file), so the comparison asks
llama.cpp for an F32 cache instead.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from lucebox_cli.gguf_io import GGUFModel
from lucebox_cli.models.qwen35_gguf import load_model_gguf
from lucebox_cli.quant.convert import quantize
from lucebox_cli.quant.mixes import FTYPES

llama_cpp = pytest.importorskip("llama_cpp")
cpu = pytest.importorskip("lucebox_cli.engines.cpu")
from tiny_models import make_tiny_checkpoint  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b  # 你好 😀\n"
GGML_TYPE_F32 = 0


def _rel_rms(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Relative RMS error of each position's logits: [T, V] → [T]."""
    return np.sqrt(np.mean((got - want) ** 2, axis=-1)) / np.sqrt(np.mean(want**2, axis=-1))


# ---- ggml's activation rounding, in numpy ------------------------------------------------------


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 then dequantize (x86 SIMD form): blocks of 32, d = amax/127 stored as f16,
    q = round-half-even(x · 127/amax)."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q * _f16(amax / np.float32(127.0))).astype(np.float32).reshape(np.shape(x))


def round_q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K then dequantize: blocks of 256, iscale = -127/(the signed element of largest
    magnitude), q = min(127, round-half-even(iscale · x)), d = 1/iscale stored as f32."""
    b = np.asarray(x, np.float32).reshape(-1, 256)
    peak = b[np.arange(b.shape[0]), np.abs(b).argmax(axis=1)][:, None]
    with np.errstate(divide="ignore"):
        iscale = np.where(peak != 0, np.float32(-127.0) / peak, np.float32(0.0)).astype(np.float32)
        d = np.where(iscale != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * b))
    return (q * d).astype(np.float32).reshape(np.shape(x))


# ggml-cpu's type_traits_cpu[type].vec_dot_type, for the weight types these files hold.
ACTIVATION_ROUNDING = {
    "Q4_K": round_q8_k, "Q5_K": round_q8_k, "Q6_K": round_q8_k,
    "Q8_0": round_q8_0, "Q5_0": round_q8_0, "Q4_0": round_q8_0,
    "F16": _f16, "F32": None,
}


class _RoundedT:
    """`h @ this` = round(h) @ Wᵀ. numpy defers `@` to __rmatmul__ because __array_ufunc__ is None."""

    __array_ufunc__ = None

    def __init__(self, wt: np.ndarray, rounding):
        self.wt, self.rounding = wt, rounding

    def __rmatmul__(self, h: np.ndarray) -> np.ndarray:
        return self.rounding(np.ascontiguousarray(h, dtype=np.float32)) @ self.wt


class _RoundedWeight:
    """Stands in for a weight matrix that the engine only uses as `h @ w.T`."""

    def __init__(self, w: np.ndarray, rounding):
        self.shape = w.shape
        self.T = _RoundedT(w.T, rounding)


def round_activations_like_ggml(engine, path: Path) -> dict[str, str]:
    """Make `engine` round every matmul input the way ggml-cpu does for the weight's stored type.
    Only matrices used as `h @ W.T` are wrapped: the embedding lookup (get_rows) and ssm_conv1d
    (ssm_conv) are exact in ggml too, and the tied head is wrapped through `_head` alone.
    Returns the stored type of every tensor."""
    model = GGUFModel(path)
    types = {n: model.tensor_info(n).ggml_type for n in engine._w}
    for name, w in list(engine._w.items()):
        rounding = ACTIVATION_ROUNDING[types[name]] if w.ndim == 2 else None
        if rounding is not None and name != "token_embd.weight" and not name.endswith("ssm_conv1d.weight"):
            engine._w[name] = _RoundedWeight(w, rounding)
    head = "token_embd.weight" if engine.cfg.tied else "output.weight"
    rounding = ACTIVATION_ROUNDING[types[head]]
    if rounding is not None:
        engine._head = _RoundedWeight(engine._head, rounding)
    return types


# ---- the emulation against the functions llama.cpp runs -----------------------------------------


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    libdir = Path(llama_cpp.__file__).parent / "lib"
    found = [sorted(libdir.glob(f"libggml-{k}.*")) for k in ("base", "cpu")]
    if not all(found):
        pytest.skip(f"no libggml-base / libggml-cpu in {libdir}")
    base, cpu_lib = (ctypes.CDLL(str(f[0])) for f in found)
    fns = (base.dequantize_row_q8_0, base.dequantize_row_q8_K, cpu_lib.quantize_row_q8_0, cpu_lib.quantize_row_q8_K)
    for fn in fns:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return base, cpu_lib


@pytest.mark.parametrize("block", ["q8_0", "q8_K"])
def test_activation_rounding_equals_ggml_cpu(block):
    base, cpu_lib = _libs()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((48, 256)).astype(np.float32) * rng.uniform(1e-3, 30, (48, 1)).astype(np.float32)
    x[0] = 0.0
    x[1, :] = -2.0  # every element the block's peak
    x[2, 5] = 1e4  # one outlier
    x = x.reshape(-1)
    # generous buffer: block_q8_0 is 34 bytes per 32 values, block_q8_K 292 per 256
    packed = np.zeros(x.size * 2, np.uint8)
    getattr(cpu_lib, f"quantize_row_{block}")(x.ctypes.data, packed.ctypes.data, x.size)
    want = np.zeros_like(x)
    getattr(base, f"dequantize_row_{block}")(packed.ctypes.data, want.ctypes.data, x.size)
    got = (round_q8_0 if block == "q8_0" else round_q8_k)(x)
    np.testing.assert_array_equal(got, want)


# ---- the model and its files --------------------------------------------------------------------


def _llama_quantize(src: Path, dst: Path, qtype: str) -> Path:
    _, pure, ftype = FTYPES[qtype]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure, params.nthread = ftype, pure, 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed ({rc})"
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamacpp-logits")
    folder = make_tiny_checkpoint(root / "hf", hidden=256, n_layers=4, tied=True)
    f32 = quantize(folder, root / "ours-F32.gguf", "F32").out
    return {
        "ours-F32": Path(f32),
        "ours-Q4_K_M": Path(quantize(folder, root / "ours-Q4_K_M.gguf", "Q4_K_M").out),
        "llama-Q8_0": _llama_quantize(Path(f32), root / "llama-Q8_0.gguf", "Q8_0"),
        "llama-Q4_K_M": _llama_quantize(Path(f32), root / "llama-Q4_K_M.gguf", "Q4_K_M"),
    }


def _llama_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64, n_threads=2, verbose=False,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return logits


def _logits(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, str]]:
    """(llama.cpp's, ours, ours with ggml's activation rounding) logits [T, V] of PROMPT on one file,
    and the file's tensor types."""
    cfg, weights, tok = load_model_gguf(path)
    ids = tok.encode(PROMPT)
    plain = cpu.CPUEngine(cfg, weights, max_context=64).prefill(ids, all_logits=True)
    engine = cpu.CPUEngine(cfg, weights, max_context=64)
    types = round_activations_like_ggml(engine, path)
    rounded = engine.prefill(ids, all_logits=True)
    theirs = _llama_logits(path, ids)
    assert theirs.shape == plain.shape == (len(ids), cfg.vocab)
    return theirs, plain, rounded, types


def test_f32_logits_match(files):
    cfg, weights, tok = load_model_gguf(files["ours-F32"])
    ids = tok.encode(PROMPT)
    ours = cpu.CPUEngine(cfg, weights, max_context=64).prefill(ids, all_logits=True)
    errors = _rel_rms(ours, _llama_logits(files["ours-F32"], ids))
    assert errors.max() < 1e-4, errors  # float summation order only (measured 1.2e-5)


@pytest.mark.parametrize("key", ["ours-Q4_K_M", "llama-Q8_0", "llama-Q4_K_M"])
def test_quantized_logits_match(files, key):
    theirs, plain, rounded, types = _logits(files[key])
    # real K-quants on the hidden-wide matrices of the Q4_K_M files (Q6_K head), Q8_0 everywhere else
    k_quants = key.endswith("Q4_K_M")
    assert types["blk.0.ffn_up.weight"] == ("Q4_K" if k_quants else "Q8_0")
    assert types["token_embd.weight"] == ("Q6_K" if k_quants else "Q8_0")
    gap, rest = _rel_rms(plain, theirs), _rel_rms(rounded, theirs)
    # Without the activation rounding the engines differ by what that rounding moves (measured 0.20
    # max), and the rounding is the cause: it accounts for at least 80% of the gap (90% on a CPU whose
    # ggml kernels hit one tie, 88% on one that hits more; see the docstring), and where no tie has
    # reached a position yet the two agree to float rounding.
    assert gap.max() < 0.35, gap
    assert rest.mean() < 0.2 * gap.mean(), (rest, gap)
    assert rest.min() < 1e-5, rest
    # What remains is float rounding (3e-7) plus at most a rounding tie or two (1e-2 each, see above).
    assert rest.max() < 2.5e-2, rest
    np.testing.assert_array_equal(rounded.argmax(axis=-1), theirs.argmax(axis=-1))
