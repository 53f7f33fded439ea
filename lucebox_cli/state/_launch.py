"""Grid sizing shared by the state kernels (all grid-stride loops, so any grid gives the same result)."""

from __future__ import annotations

from numba import config

THREADS = 256
MAX_BLOCKS = 1024
# The simulator runs every thread as a Python thread; tiny blocks keep it fast.
SIM_THREADS = 8
SIM_MAX_BLOCKS = 2

def grid(n_items: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over `n_items` work items."""
    threads, max_blocks = (SIM_THREADS, SIM_MAX_BLOCKS) if config.ENABLE_CUDASIM else (THREADS, MAX_BLOCKS)
    blocks = max(1, min((max(n_items, 1) + threads - 1) // threads, max_blocks))
    return blocks, threads

def launch(kernel, n_items: int, stream, *args) -> None:
    """Launch `kernel` over `n_items` grid-stride items, on `stream` when given (else the default one)."""
    blocks, threads = grid(n_items)
    if stream is None:
        kernel[blocks, threads](*args)
    else:
        kernel[blocks, threads, stream](*args)
