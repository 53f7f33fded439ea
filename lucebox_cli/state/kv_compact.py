"""KV compaction after a verify: rows of the accepted slots move onto committed … committed + n − 1.

Layout: one cache per K and V, [layers, kv_heads, max_ctx, head_dim]; verify wrote slot s's row at
committed + s. path[j] (the j-th accepted slot) is strictly increasing with path[j] ≥ j, so copying j in
ascending order in place never overwrites a row still to be read. Threads own (layer, head, dim)
columns and loop over j sequentially: parallel j would race when path[j'] == j for some j' > j.
"""

from __future__ import annotations

import numpy as np

from numba import cuda

from lucebox_cli.state._launch import launch

def kv_compact_ref(k_cache: np.ndarray, v_cache: np.ndarray, path: np.ndarray, committed: int) -> tuple:
    """numpy twin: compacts both caches in place; returns them."""
    for j, slot in enumerate(np.asarray(path).tolist()):
        if slot != j:
            k_cache[:, :, committed + j, :] = k_cache[:, :, committed + slot, :]
            v_cache[:, :, committed + j, :] = v_cache[:, :, committed + slot, :]
    return k_cache, v_cache

@cuda.jit
def kv_compact_kernel(k_cache, v_cache, path, committed):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_heads = k_cache.shape[1]
    head_dim = k_cache.shape[3]
    columns = k_cache.shape[0] * n_heads * head_dim
    for col in range(start, columns, stride):
        d = col % head_dim
        h = (col // head_dim) % n_heads
        layer = col // (head_dim * n_heads)
        for j in range(path.shape[0]):
            src = committed + path[j]
            dst = committed + j
            if src != dst:
                k_cache[layer, h, dst, d] = k_cache[layer, h, src, d]
                v_cache[layer, h, dst, d] = v_cache[layer, h, src, d]

def run_kv_compact(k_cache, v_cache, path, committed: int, stream=None) -> None:
    """Device version of kv_compact_ref on numba device arrays (same argument order)."""
    columns = k_cache.shape[0] * k_cache.shape[1] * k_cache.shape[3]
    launch(kv_compact_kernel, columns, stream, k_cache, v_cache, path, committed)
