"""Where PDL on and off disagree in the 27B target engine (device only; a diagnostic, not a test).

    python3 scripts/pdl_check.py [--layers 8]

tests/gpu/test_dflash_pdl.py::test_pdl_on_and_off_agree fails (prefill logits 5e-4 apart with lb_set_pdl(1)), and
PDL makes the graph-replayed decode step ~9% faster on the H200 (session 9), so the question is which kernels race.
This runs the tiny Q4_K_M model of the gpu tests with every layer tapped, PDL off twice (the noise floor: stream-K
atomics add in any order) and on once, and prints the relative RMS of each layer's residual stream per phase: the
64-row prefill pass, the 6-row pass, each decode step (graphs on and off), and the 23-slot verify's logits.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit"), str(ROOT / "tests" / "gpu")]


def session(lib, path: Path, layers: int, on: int, graphs: bool) -> dict:
    from test_dflash_engine import VOCAB, branched_tree

    from lucebox_cli.engines.dflash import DFlashTargetEngine

    lib.fn.lb_set_pdl(on)
    eng = DFlashTargetEngine(str(path), max_context=512, budget=22, tap_layers=tuple(range(layers)), lib=lib)
    eng.use_graphs = graphs
    try:
        ids = np.random.default_rng(21).integers(0, VOCAB, 70)
        eng.poison()
        out = {"prefill": eng.prefill(ids)}
        tok = int(np.argmax(out["prefill"]))
        steps = []
        for _ in range(6):
            eng.poison()
            lg = eng.step(tok)
            steps.append(lg)
            tok = int(np.argmax(lg))
        out["steps"] = np.stack(steps)
        out["features"] = eng.features.reshape(eng.n_past, layers, -1)
        eng.poison()
        out["verify"] = eng.verify(branched_tree(22, 23)).logits
        return out
    finally:
        eng.close()
        lib.fn.lb_set_pdl(0)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.isfinite(a).all():
        return float("nan")
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b**2)), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    from gpu_lib import lib
    from test_dflash_engine import VOCAB  # noqa: F401

    from dflash_tiny import make_tiny_q4km

    folder = ROOT / ".gl" / "dflash"
    folder.mkdir(parents=True, exist_ok=True)
    path = make_tiny_q4km(folder / f"tiny{a.layers}", n_layers=a.layers, hv_ratio=3, vocab=4096)
    L = lib()
    for graphs in (True, False):
        ref = session(L, path, a.layers, 0, graphs)
        runs = {"off again": session(L, path, a.layers, 0, graphs), "PDL on": session(L, path, a.layers, 1, graphs)}
        print(f"== graphs {'on' if graphs else 'off'}: rel RMS against a PDL-off run")
        for tag, r in runs.items():
            f, fr = r["features"], ref["features"]
            steps = " ".join("%.1e" % rel(r["steps"][i], ref["steps"][i]) for i in range(6))
            print(f"  {tag:10s} prefill logits {rel(r['prefill'], ref['prefill']):.2e}, steps {steps}, verify "
                  f"{rel(r['verify'], ref['verify']):.2e}")
            for name, rows in (("rows 0-63", slice(0, 64)), ("rows 64-69", slice(64, 70)), ("steps", slice(70, 76))):
                per = [rel(f[rows, i], fr[rows, i]) for i in range(a.layers)]
                print(f"    {name:10s} by layer: " + " ".join(f"{v:.1e}" for v in per))
    return 0


if __name__ == "__main__":
    sys.exit(main())
