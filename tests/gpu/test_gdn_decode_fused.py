"""The forms of the decode DeltaNet step (cuda/ops/gdn_decode_fused.cu), selected by LUCEBOX_GDN_DECODE (read once
per process): unset (or "push") = the fused kernel's push form, decode_fused_kernel<true>, the default; "pull" = the
fused kernel's pull form, decode_fused_kernel<false> (peers' o read through DSMEM after the cluster barrier, end
barrier; the default before the push form); "split" = the three kernels conv_prep + delta + out_norm.

Each case runs in child processes, one per LUCEBOX_GDN_DECODE value:
  - the default vs pull and vs split, 8 consecutive decode steps (y NaN-poisoned before each): the same formulas
    and summation orders, so y and the recurrent state agree to 1e-6 relative RMS (bit for bit unless nvcc
    contracts an expression differently), the conv state bit for bit;
  - against cpu.py's chained step at the 27B head counts and odd ones (r = 1, r = 3, r = 8 = the most warps);
  - under programmatic dependent launch (lb_set_pdl(1)), the steps of ONE layer back to back on a stream and in
    one captured graph (default and pull): step i + 1's blocks start while step i still runs, so its reads race
    with step i's state and conv writes unless the kernel orders them;
  - test_gdn_ops.py's decode tests (path, steps, fused vs split, graph replays) under pull (test_gdn_ops.py itself
    runs them under the default), and the engine tests that caught session 10's pre-wait state loads
    (test_dflash_engine / test_dflash_pdl, a few cases) under the default and under pull.

Bench (H200; not a test): `python3 tests/gpu/test_gdn_decode_fused.py --bench` times lb_gdn_decode_step over the
48 DeltaNet layers of the 27B (48 states of 3.1 MB each: 302 MB, so the states come from DRAM as in a real step)
for push (the default) / pull / split, with PDL off and on, CUDA events around back-to-back launches held behind a
spin kernel (needs torch with CUDA, as scripts/bench_gdn_attn.py).

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_gdn_decode_fused.py`.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from gpu_lib import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
D = 128
EPS = 1e-6
TOL = 1e-4
SAME_TOL = 1e-6  # push vs pull / split: the same arithmetic (see the module doc)
STEPS = 8
OTHERS = ["pull", "split"]  # compared against the default (push)
FUSED_FORMS = ["default", "pull"]  # the fused kernel's two forms
HEADS = [(16, 48), (2, 6), (4, 4), (3, 24)]
HEAD_IDS = ["Hk16-Hv48", "Hk2-Hv6", "Hk4-Hv4", "Hk3-Hv24"]
f32 = np.float32


def _seed(hk: int, hv: int) -> int:
    return 180 + hk + hv


def _child(variant: str, mode: str, hk: int, hv: int, out: Path) -> dict:
    """Run this file's --dump in a child process under LUCEBOX_GDN_DECODE=variant ("default": unset)."""
    env = _env(variant)
    env.pop("LUCEBOX_PDL", None)  # the pdl modes turn it on themselves; the plain mode keeps the default
    r = subprocess.run([sys.executable, __file__, "--dump", str(out), mode, str(hk), str(hv)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return dict(np.load(out))


def _env(variant: str) -> dict:
    """This environment with LUCEBOX_GDN_DECODE=variant ("default": unset, whatever the parent has)."""
    env = dict(os.environ)
    env.pop("LUCEBOX_GDN_DECODE", None)
    if variant != "default":
        env["LUCEBOX_GDN_DECODE"] = variant
    return env


def _dump(mode: str, hk: int, hv: int) -> dict:
    """`STEPS` decode steps of one layer on this process's kernel form. plain: test_gdn_ops' _decode_run (one
    synchronised call a step, outputs after each). pdl_stream / pdl_graph: lb_set_pdl(1), every step back to back
    on one stream (or captured in one graph and replayed once), each step its own NaN-poisoned y; y of every
    step, the final state and conv state."""
    import test_gdn_ops as G
    from gdn_attn_dev import Pool, lib

    L = lib()
    if mode == "plain":
        got = G._decode_run(hk, hv, STEPS, _seed(hk, hv))
        return {"y": got["y"][:, 0], "state": got["state"][-1], "conv": got["conv"][-1], "path": got["path"],
                "states": got["state"], "convs": got["conv"]}
    assert mode in ("pdl_stream", "pdl_graph"), mode
    L.fn.lb_set_pdl(1)
    w, x, state0 = G._fused_case(hk, hv, STEPS, _seed(hk, hv))
    c = (2 * hk + hv) * D
    s, exe = ctypes.c_void_p(), ctypes.c_void_p()
    L.call("lb_stream_create", ctypes.byref(s))
    try:
        with Pool() as p:
            wd = G._wdev(p, w)
            pre, a, b, z = p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["z"])
            conv, st = p.of(x["conv"]), p.of(state0)
            ys = [p.nan(hv * D * 4) for _ in range(STEPS)]
            scratch = p.nan(L.fn.lb_gdn_step_scratch_bytes(1, hk, hv))

            def steps():
                for i in range(STEPS):
                    L.call("lb_gdn_decode_step", pre.at(i * c * 4), a.at(i * hv * 4), b.at(i * hv * 4),
                           z.at(i * hv * D * 4), wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr,
                           wd["norm_w"].ptr, conv.ptr, st.ptr, ys[i].ptr, scratch.ptr, 1, hk, hv, ctypes.c_float(EPS), s)

            if mode == "pdl_graph":
                L.call("lb_graph_begin", s)
                steps()
                L.call("lb_graph_end", s, ctypes.byref(exe))
                L.call("lb_graph_launch", exe, s)
            else:
                steps()
            L.call("lb_dev_sync")
            out = {"y": np.stack([y.get(f32, (hv * D,)) for y in ys]), "state": st.get(f32, state0.shape),
                   "conv": conv.get(f32, (3, c)), "path": np.int32(L.fn.lb_gdn_decode_path(1, hk, hv))}
            if exe.value:
                L.call("lb_graph_destroy", exe)
            return out
    finally:
        L.call("lb_stream_destroy", s)


def _reference(hk: int, hv: int):
    import test_gdn_ops as G

    w, x, state0 = G._fused_case(hk, hv, STEPS, _seed(hk, hv))
    y_ref, s_ref, c_ref = G._chained_ref(w, x, state0, hk, hv, STEPS)
    return y_ref[:, 0], s_ref, c_ref


def _path_expected(variant: str) -> int:
    """lb_gdn_decode_path(1, hk, hv <= 8 hk) in a child under `variant`: the fused kernel on an sm_90+ GPU unless
    the knob says split (not test_gdn_ops._fused_expected: that one reads this process's environment)."""
    from lucebox_cli.engines import _lib

    if variant == "split":
        return 0
    return int(_lib.probe_gpus().gpus[0]["cc_major"] >= 9)


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("other", OTHERS)
def test_default_vs_other_and_cpu(other, hk, hv, tmp_path):
    """8 steps, one synchronised call a step: the default (push) against pull / split (1e-6, conv bit for bit, after
    every step), and both against cpu.py's chained math (1e-4)."""
    from gdn_attn_dev import assert_close

    got = _child("default", "plain", hk, hv, tmp_path / "default.npz")
    ref = _child(other, "plain", hk, hv, tmp_path / "other.npz")
    assert int(got["path"]) == _path_expected("default"), "the default did not take the fused kernel"
    assert int(ref["path"]) == _path_expected(other), f"LUCEBOX_GDN_DECODE={other} took the wrong path"
    y_ref, s_ref, c_ref = _reference(hk, hv)
    for i in range(STEPS):
        assert_close(got["y"][i], ref["y"][i], SAME_TOL, f"default vs {other} y, step {i}")
        assert_close(got["states"][i], ref["states"][i], SAME_TOL, f"default vs {other} state, step {i}")
        assert np.array_equal(got["convs"][i], ref["convs"][i]), f"default vs {other} conv state, step {i}"
        for name, run in (("default", got), (other, ref)):
            assert_close(run["y"][i], y_ref[i], TOL, f"{name} y vs cpu, step {i}")
            assert_close(run["states"][i], s_ref[i], TOL, f"{name} state vs cpu, step {i}")
            assert np.array_equal(run["convs"][i], c_ref[i]), f"{name} conv state vs cpu, step {i}"


@pytest.mark.parametrize("hk,hv", [(16, 48), (2, 6)], ids=["Hk16-Hv48", "Hk2-Hv6"])
@pytest.mark.parametrize("mode", ["pdl_stream", "pdl_graph"])
@pytest.mark.parametrize("variant", FUSED_FORMS)
def test_variant_under_pdl(variant, mode, hk, hv, tmp_path):
    """One layer's 8 steps back to back under PDL (each step's state and conv state are the next step's input):
    every step's y against cpu.py's chain, the final state (1e-4) and conv state (bit for bit)."""
    from gdn_attn_dev import assert_close

    got = _child(variant, mode, hk, hv, tmp_path / "pdl.npz")
    assert int(got["path"]) == _path_expected(variant)
    y_ref, s_ref, c_ref = _reference(hk, hv)
    for i in range(STEPS):
        assert_close(got["y"][i], y_ref[i], TOL, f"{variant} {mode} y, step {i}")
    assert_close(got["state"], s_ref[-1], TOL, f"{variant} {mode} final state")
    assert np.array_equal(got["conv"], c_ref[-1]), f"{variant} {mode} conv state"


def test_gdn_ops_decode_suite_under_pull():
    """test_gdn_ops.py's fused-decode tests with the pull form as the child's kernel (the default runs them in
    test_gdn_ops.py itself)."""
    env = _env("pull")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_gdn_ops.py"),
                        "-k", "decode_path or decode_steps or decode_fused_vs_split or decode_graph_replays"],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


@pytest.mark.parametrize("variant", FUSED_FORMS)
def test_engine_under_variant(variant):
    """The engine tests that caught session 10's state loads before pdl_wait (a wrong first step after a prefill or
    a commit; docs/perf.md "A decode step under PDL"), with each fused form as the decode DeltaNet kernel: the
    decode step graph runs under PDL, where that failure showed."""
    env = _env(variant)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(HERE / "test_dflash_engine.py"), str(HERE / "test_dflash_pdl.py"),
                        "-k", "prefill_and_greedy or verify_commit_step or pdl_on_and_off"],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout, "nothing ran (all skipped?):\n" + r.stdout[-2000:]


# ---- the bench ----------------------------------------------------------------------------------------------

HK, HV, N_LAYERS = 16, 48, 48


def _bench_child(pdl: int, reps: int) -> dict:
    """This process's kernel form over 48 layers, launches back to back behind a spin kernel; µs per layer."""
    import torch
    from gpu_lib import lib

    L = lib()
    if pdl:
        L.fn.lb_set_pdl(1)
    dev = torch.device("cuda")
    stream = torch.cuda.Stream()
    sp = ctypes.c_void_p(stream.cuda_stream)
    fused = int(L.fn.lb_gdn_decode_path(1, HK, HV))
    iters = max(2, 900 // (N_LAYERS * (1 if fused else 3)))  # stay under the launch queue's depth

    def P(t):
        return ctypes.c_void_p(t.data_ptr())

    g = torch.Generator(device=dev).manual_seed(0)
    opt = dict(device=dev, dtype=torch.float32)
    c = (2 * HK + HV) * D
    states = [torch.randn(HV, D, D, generator=g, **opt) * 0.1 for _ in range(N_LAYERS)]
    convs = [torch.randn(3, c, generator=g, **opt) for _ in range(N_LAYERS)]
    pre, z = torch.randn(c, generator=g, **opt), torch.randn(HV * D, generator=g, **opt)
    a_in, b_in = torch.randn(HV, generator=g, **opt), torch.randn(HV, generator=g, **opt)
    conv_w = torch.randn(c, 4, generator=g, **opt) * 0.5
    ssm_a, dt_bias = -torch.rand(HV, generator=g, **opt) - 0.5, torch.randn(HV, generator=g, **opt) * 0.5
    norm_w, y = torch.ones(D, **opt), torch.empty(HV * D, **opt)
    scratch = torch.empty(int(L.fn.lb_gdn_step_scratch_bytes(1, HK, HV)) // 4 + 1, **opt)
    eps = ctypes.c_float(EPS)

    def body():
        for i in range(N_LAYERS):
            L.call("lb_gdn_decode_step", P(pre), P(a_in), P(b_in), P(z), P(conv_w), P(ssm_a), P(dt_bias), P(norm_w),
                   P(convs[i]), P(states[i]), P(y), P(scratch), 1, HK, HV, eps, sp)

    with torch.cuda.stream(stream):
        body()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(100_000_000)  # hold the stream while the host enqueues (host gaps do not count)
            start.record(stream)
            for _ in range(iters):
                body()
            end.record(stream)
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (iters * N_LAYERS))
    state_bytes = 2 * HV * D * D * 4
    us = float(np.median(times))
    return {"us_per_layer": round(us, 3), "min": round(min(times), 3), "max": round(max(times), 3),
            "state_GBps": round(state_bytes / us / 1e3, 0), "fused": fused, "iters": iters}


def bench(reps: int) -> int:
    rows = []
    for variant in ["default", "pull", "split"]:  # default: push
        for pdl in (0, 1):
            env = _env(variant)
            env.pop("LUCEBOX_PDL", None)
            r = subprocess.run([sys.executable, __file__, "--bench-child", str(pdl), str(reps)], env=env,
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                print(f"{variant} pdl={pdl}: failed\n{r.stdout[-2000:]}{r.stderr[-2000:]}", flush=True)
                continue
            row = {"variant": variant, "pdl": pdl, **json.loads(r.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = {r["pdl"]: r["us_per_layer"] for r in rows if r["variant"] == "pull"}
    print("\n| variant | PDL | µs / layer (median) | min..max | state GB/s | vs pull |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rel = f"{r['us_per_layer'] / base[r['pdl']]:.3f}" if r["pdl"] in base else "-"
        print(f"| {r['variant']} | {r['pdl']} | {r['us_per_layer']:.2f} | {r['min']:.2f}..{r['max']:.2f} | "
              f"{r['state_GBps']:.0f} | {rel} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(HERE.parents[1]))
    if len(sys.argv) == 6 and sys.argv[1] == "--dump":
        np.savez(sys.argv[2], **_dump(sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
        sys.exit(0)
    if len(sys.argv) == 4 and sys.argv[1] == "--bench-child":
        print(json.dumps(_bench_child(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
        sys.exit(0)
    if len(sys.argv) >= 2 and sys.argv[1] == "--bench":
        sys.exit(bench(int(sys.argv[2]) if len(sys.argv) > 2 else 5))
    import pytest as _pytest

    sys.exit(_pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
