"""Recurrent-state select: after a verify, the DeltaNet state becomes the state saved after the deepest
accepted slot (verify keeps one fp32 state per slot, so commit needs no recompute).

Layout: state [...] (e.g. [layers, Hv, dk, dv]); node_states [N, ...] with the same trailing shape.
"""

from __future__ import annotations

import numpy as np

from numba import cuda

from lucebox_cli.state._launch import launch

def state_select_ref(state: np.ndarray, node_states: np.ndarray, slot: int) -> np.ndarray:
    """numpy twin: state[...] = node_states[slot]; returns state."""
    state[...] = node_states[slot]
    return state

@cuda.jit
def state_select_kernel(state, node_states, slot):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, state.shape[0], stride):
        state[i] = node_states[slot, i]

def run_state_select(state, node_states, slot: int, stream=None) -> None:
    """Device version of state_select_ref on C-contiguous numba device arrays (same argument order)."""
    flat = state.reshape(state.size)
    nodes = node_states.reshape(node_states.shape[0], state.size)
    launch(state_select_kernel, state.size, stream, flat, nodes, slot)
