"""lb_dequant_f16's variants (LUCEBOX_DEQUANT=<name>, cuda/ops/dequant_f16.cu) against the default, bit for bit.

The switch is read once per process, so each variant runs in a child process (this file in script mode, --child)
on the same GGUF bytes: every type (Q4_K, Q4_K_T, Q5_K, Q6_K, Q6_K_T, Q8_0), odd row ranges (the row-range path,
the Q6_K / Q8_0 trailing d arrays indexed by the whole tensor's rows) and whole 16-row tiles (the tiled types' stored-
order path), K = 256 .. 5120, matrices large enough (4,096 of 4,099 / 4,112 rows × 5,120: 81,920 blocks) that the
persistent and async variants' warps stride over several units; the output NaN-poisoned first and guard values after
it checked untouched. "base" (the kernel before session 12) and the default (the table's first entry, what runs with
LUCEBOX_DEQUANT unset, which is run as such too) are checked against the gguf package's dequantization on the small
cases, as in test_gemm_q_cublas.py; every variant and the unset run against base.
The variant names come from the kernel's table (the X("name", ...) entries), so a new variant is tested unasked.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpu_lib import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "cuda" / "ops" / "dequant_f16.cu"
GUARD = 8
QTS = ("Q4_K", "Q4_K_T", "Q5_K", "Q6_K", "Q6_K_T", "Q8_0")
# (rows, k, row0, n): rows are rounded up to 16 for the tiled types (fit_rows); the ranges stay as written. The large
# ones: rows 0..4096 (whole tiles: the tiled types' stored-order path; the persistent / async variants' warps stride
# over several units there) and 1..3002 (the row-range path).
SHAPES = [(37, 256, 0, 37), (37, 256, 5, 31), (41, 1280, 13, 27), (9, 5120, 3, 5), (300, 2304, 101, 199),
          (64, 1280, 16, 32), (304, 2304, 0, 304), (4099, 5120, 0, 4096), (4099, 5120, 1, 3001)]
SMALL = 7  # the first SMALL shapes are also checked against gguf (and compared value by value)

pytestmark = pytest.mark.gpu


def variant_names() -> list[str]:
    text = SOURCE.read_text()
    block = text[text.index("#define LB_DEQUANT_VARIANTS(X)") :]
    block = block[: block.index("\n\n")]
    names = re.findall(r'X\("(\w+)"', block)
    assert names and "base" in names, names
    return names


def cases() -> list[tuple[str, int, int, int, int, bool]]:
    """(qtype, rows, k, row0, n, small: also checked against gguf)."""
    from test_quant_gemv import fit_rows

    return [(qt, fit_rows(qt, rows), k, row0, n, j < SMALL) for qt in QTS for j, (rows, k, row0, n) in enumerate(SHAPES)]


def child(inp: str, outp: str) -> None:
    """Dequantize every case of inp (npz of GGUF bytes) with this process's LUCEBOX_DEQUANT; outputs to outp."""
    from test_gemm_q_cublas import device_weights
    from test_quant_gemv import ALL_QTYPES, Dev, lib

    data = np.load(inp)
    got = {}
    for i, (qt, rows, k, row0, n, small) in enumerate(cases()):
        raw = data[f"c{i}"]
        w = device_weights(qt, raw, rows, k)
        out = Dev(2 * (n * k + GUARD))
        try:
            lib().call("lb_dev_memset", out.ptr, 0xFF, out.nbytes)  # NaN everywhere
            lib().call("lb_dequant_f16", ALL_QTYPES[qt], w.ptr, rows, k, row0, n, out.ptr, None)
            lib().call("lb_dev_sync")
            a = out.get(np.uint16, n * k + GUARD)
            # the large cases come back as a digest (13 variants x 42 MB each would be gigabytes of files) and the
            # two facts checked on the values: no NaN pattern left in the rows, the guard untouched
            got[f"c{i}"] = a if small else np.frombuffer(hashlib.sha256(a.tobytes()).digest(), np.uint8)
            got[f"f{i}"] = np.array([(a[: n * k] == 0xFFFF).any(), (a[n * k :] != 0xFFFF).any()])
        finally:
            w.close()
            out.close()
    np.savez(outp, **got)


def run_variant(name: str, inp: Path, outp: Path) -> dict:
    env = dict(os.environ, LUCEBOX_DEQUANT=name)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests" / "gpu"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--child", str(inp), str(outp)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"variant {name}: child failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "not a dequantization variant" not in proc.stderr, proc.stderr
    data = np.load(outp)
    return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    from test_quant_gemv import lib, random_gguf_bytes

    lib()  # skips without a GPU
    tmp = tmp_path_factory.mktemp("dequant_variants")
    raws = {f"c{i}": random_gguf_bytes(qt, rows, k, seed=1000 + i) for i, (qt, rows, k, *_) in enumerate(cases())}
    inp = tmp / "in.npz"
    np.savez(inp, **raws)
    outs = {name: run_variant(name, inp, tmp / f"out_{name}.npz") for name in variant_names()}
    outs["(unset)"] = run_variant("", inp, tmp / "out_unset.npz")  # LUCEBOX_DEQUANT empty: the default
    return raws, outs


@pytest.mark.parametrize("name", ["base", variant_names()[0]])
def test_base_and_default_match_gguf(outputs, name):
    import gguf

    from test_quant_gemv import gguf_type

    raws, outs = outputs
    for i, (qt, rows, k, row0, n, small) in enumerate(cases()):
        if not small:
            continue
        ref = gguf.quants.dequantize(raws[f"c{i}"], gguf.GGMLQuantizationType[gguf_type(qt)]).reshape(rows, k)
        want = np.asarray(ref, np.float32).astype(np.float16)[row0 : row0 + n].view(np.uint16)
        got = outs[name][f"c{i}"]
        assert not outs[name][f"f{i}"].any(), f"{name} {qt} case {i}: NaN poison left, or wrote past the rows"
        bad = np.argwhere(got[: n * k].reshape(n, k) != want)
        assert not bad.size, f"{name} {qt} rows {row0}..{row0 + n} of {rows}, K {k}: {len(bad)} differ, first {bad[0]}"


@pytest.mark.parametrize("name", [v for v in variant_names() if v != "base"] + ["(unset)"])
def test_variant_bit_identical_to_base(outputs, name):
    _, outs = outputs
    for i, (qt, rows, k, row0, n, _) in enumerate(cases()):
        base, got = outs["base"][f"c{i}"], outs[name][f"c{i}"]
        left, past = outs[name][f"f{i}"]
        where = f"{name} {qt} rows {row0}..{row0 + n} of {rows}, K {k}"
        assert not past, f"{where}: wrote past the rows asked for"
        assert not left, f"{where}: some values never written (NaN poison left)"
        bad = np.argwhere(got != base)
        assert not bad.size, f"{where}: differs from base ({len(bad)} values or digest bytes, first at {bad[0]})"


def test_unknown_name_runs_default(tmp_path):
    """An unknown LUCEBOX_DEQUANT says so once on stderr and runs the default."""
    env = dict(os.environ, LUCEBOX_DEQUANT="no-such-variant")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests" / "gpu"), env.get("PYTHONPATH", "")])
    code = ("from test_quant_gemv import lib, Dev, QTYPES\n"
            "w = Dev(lib().fn.lb_quant_bytes(QTYPES['Q8_0'], 16, 256)); o = Dev(2 * 16 * 256)\n"
            "lib().call('lb_dev_memset', w.ptr, 0, w.nbytes)\n"
            "for _ in range(2): lib().call('lb_dequant_f16', QTYPES['Q8_0'], w.ptr, 16, 256, 0, 16, o.ptr, None)\n"
            "lib().call('lb_dev_sync')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(REPO / "tests" / "gpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("LUCEBOX_DEQUANT=no-such-variant is not a dequantization variant") == 1, proc.stderr


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    child(sys.argv[2], sys.argv[3])
