"""Feature-ring compaction: the captured target features of the accepted slots go into the draft's
context ring at positions committed … committed + n − 1 (modulo the ring length).

Layout: ring [R, F] (F = n_taps · hidden); tree_features [N, F] captured per verified slot.
Source and destination are different buffers, so (j, f) elements are independent.
"""

from __future__ import annotations

import numpy as np

from numba import cuda

from lucebox_cli.state._launch import launch

def feature_compact_ref(ring: np.ndarray, tree_features: np.ndarray, path: np.ndarray, committed: int) -> np.ndarray:
    """numpy twin: writes the ring in place; returns it."""
    rows = (committed + np.arange(len(path))) % ring.shape[0]
    ring[rows] = tree_features[np.asarray(path)]
    return ring

@cuda.jit
def feature_compact_kernel(ring, tree_features, path, committed):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    width = ring.shape[1]
    for item in range(start, path.shape[0] * width, stride):
        j = item // width
        f = item % width
        ring[(committed + j) % ring.shape[0], f] = tree_features[path[j], f]

def run_feature_compact(ring, tree_features, path, committed: int, stream=None) -> None:
    """Device version of feature_compact_ref on numba device arrays (same argument order)."""
    launch(feature_compact_kernel, path.shape[0] * ring.shape[1], stream, ring, tree_features, path, committed)
