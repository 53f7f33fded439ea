"""The B side of the small-N kernels' mma, modelled on the CPU for the map tests (test_qmm_smalln_v5_map.py,
test_qmm_smalln_v6_map.py): which 16-k group each (lane part t, step) of a map covers, and XStager::stage
(cuda/common/qmm_smalln.cuh), which puts x into shared memory as the B fragments of whatever map the weights use.
A map is free as long as A and B follow the same bijection, so both tests check their A model against this B."""

from __future__ import annotations

from typing import Callable

import numpy as np

QK = 256


def find_group(grp: int, klane: Callable[[int], int], kstep: Callable[[int, int, int], int]) -> tuple[int, int]:
    """(q4 = 2c + s, t) of the map whose klane(t) + kstep(c, 0, s) is the 16-k group grp (exactly one must be)."""
    found = [(c * 2 + s, tt) for tt in range(4) for c in range(2) for s in range(2)
             if klane(tt) + kstep(c, 0, s) == 16 * grp]
    assert len(found) == 1, f"group {grp}: {found}"
    return found[0]


def stage(x: np.ndarray, kb: int, nt: int, w_warps: int, group: Callable[[int], tuple[int, int]]) -> dict:
    """XStager::stage into one buffer: {uint2 index: ((x[k0], x[k0 + 2]), (x[k0 + 1], x[k0 + 3]))}; x is [k, 8·nt]
    (columns past n zero); group(grp) = (q4, t) of the map (find_group)."""
    buf: dict = {}
    for warp in range(w_warps):
        for lane in range(32):
            g, u = lane >> 2, lane & 3
            for i in range(16 // w_warps):
                grp = warp + w_warps * i
                q4, t = group(grp)
                d = ((4 * q4 + u) * nt) * 32 + ((4 * g + t) ^ u)
                for ct in range(nt):
                    k0 = kb * QK + 16 * grp + 4 * u
                    v = x[k0: k0 + 4, 8 * ct + g]
                    idx = d + 32 * ct
                    assert idx not in buf, "a staging slot written twice"
                    buf[idx] = ((v[0], v[2]), (v[1], v[3]))
    assert sorted(buf) == list(range(16 * nt * 32)), "the staging fills the buffer exactly"
    return buf
