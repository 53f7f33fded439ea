"""Tree attention mask and positions from parent links.

mask[i] has bit j set iff slot j is slot i or one of its ancestors (bit j of row i lives in word j // 32,
bit j % 32); positions[i] = committed + depth[i]. One thread per slot walks its parent chain, so rows
never race and the walk costs depth ≤ 15 loads.
"""

from __future__ import annotations

import numpy as np

from numba import cuda

from lucebox_cli.state._launch import launch

def mask_words(n_slots: int) -> int:
    """uint32 words per mask row."""
    return (n_slots + 31) // 32

def unpack_mask(mask: np.ndarray, n_slots: int) -> np.ndarray:
    """[N, W] uint32 bit rows → [N, N] bool (for tests and the CPU engine)."""
    bits = (mask[:, :, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    return bits.reshape(mask.shape[0], -1)[:, :n_slots].astype(bool)

def tree_mask_ref(parents: np.ndarray, committed: int, mask: np.ndarray, positions: np.ndarray) -> tuple:
    """numpy twin: fills `mask` [N, W] uint32 and `positions` [N] in place; returns both."""
    n = parents.shape[0]
    mask[...] = 0
    for i in range(n):
        j, depth = i, 0
        while j >= 0:
            mask[i, j >> 5] |= np.uint32(1 << (j & 31))
            j = int(parents[j])
            depth += 1
        positions[i] = committed + depth - 1
    return mask, positions

@cuda.jit
def tree_mask_kernel(parents, committed, mask, positions):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = parents.shape[0]
    for i in range(start, n, stride):
        for w in range(mask.shape[1]):
            mask[i, w] = 0
        j = i
        depth = 0
        while j >= 0:
            word = j >> 5
            mask[i, word] = mask[i, word] | (np.uint32(1) << np.uint32(j & 31))
            j = parents[j]
            depth += 1
        positions[i] = committed + depth - 1

def run_tree_mask(parents, committed: int, mask, positions, stream=None) -> None:
    """Device version of tree_mask_ref on numba device arrays (same argument order)."""
    launch(tree_mask_kernel, parents.shape[0], stream, parents, committed, mask, positions)
