"""Conv-window gather: the DeltaNet conv state after a commit is the last W inputs along the ancestry of
the deepest accepted slot, falling back into the committed window when the ancestry is shorter than W.

Layout: conv_state [layers, W, C] (W = d_conv − 1, oldest first); node_inputs [N, layers, C] (the conv
input of each verified slot); parents [N]. The new window is "committed window, then the path inputs",
last W of it: output k sits b = W − 1 − k steps up the ancestry; past the root it is committed entry
k + n (n = path length). Writing k in ascending order reads only committed entries > k, so the update is
safe in place with one thread per (layer, channel).
"""

from __future__ import annotations

import numpy as np

from numba import cuda

from lucebox_cli.state._launch import launch

def conv_gather_ref(conv_state: np.ndarray, node_inputs: np.ndarray, parents: np.ndarray, slot: int) -> np.ndarray:
    """numpy twin: updates conv_state in place; returns it."""
    path = []
    j = int(slot)
    while j >= 0:
        path.append(j)
        j = int(parents[j])
    seq = np.concatenate([conv_state.transpose(1, 0, 2), node_inputs[path[::-1]]], axis=0)  # [W + n, L, C]
    conv_state[...] = seq[-conv_state.shape[1] :].transpose(1, 0, 2)
    return conv_state

@cuda.jit
def conv_gather_kernel(conv_state, node_inputs, parents, slot):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    n_layers = conv_state.shape[0]
    width = conv_state.shape[1]
    channels = conv_state.shape[2]
    # path length n = depth(slot) + 1
    n = 0
    j = slot
    while j >= 0:
        n += 1
        j = parents[j]
    for col in range(start, n_layers * channels, stride):
        layer = col // channels
        ch = col % channels
        for k in range(width):
            back = width - 1 - k
            if back < n:
                j = slot
                for _ in range(back):
                    j = parents[j]
                conv_state[layer, k, ch] = node_inputs[j, layer, ch]
            else:
                conv_state[layer, k, ch] = conv_state[layer, k + n, ch]

def run_conv_gather(conv_state, node_inputs, parents, slot: int, stream=None) -> None:
    """Device version of conv_gather_ref on numba device arrays (same argument order)."""
    launch(conv_gather_kernel, conv_state.shape[0] * conv_state.shape[2], stream, conv_state, node_inputs, parents, slot)
