"""Host twin of the GPU DeltaNet tree verify (cuda/ops/gdn_delta.cu): the save plan, a numpy emulation
of the kernel's walk, the replay that commits an accepted path, and the state-traffic arithmetic.

The kernel keeps each head's recurrent state on chip while slot i+1 continues slot i (the spine), and
writes a slot's state to scratch only when a later slot other than i+1 branches from it. Verify never
writes the committed state; commit replays the accepted slots' saved inputs (k, v, g, beta) onto it.
`emulate_tree_delta` follows exactly that walk (one live state, saves, reloads, one-pass update) so a
CPU test proves the walk equals cpu.gated_delta_tree on any tree; the GPU tests then only have to show
the kernel matches this walk's math.
"""

from __future__ import annotations

import numpy as np

from lucebox_cli.engines.cpu import _tile_heads

# qwen35.md: the 27B's 48 DeltaNet layers x 48 value heads x 128 x 128 fp32.
STATE_BYTES_27B = 48 * 48 * 128 * 128 * 4


def save_plan(parents) -> np.ndarray:
    """[N] int32: the compact scratch index of slot i's saved state, or -1 when no slot branches from it
    (slot i is saved iff some child c of i has c != i + 1). Same rule as lb_gdn_tree_plan."""
    par = np.asarray(parents, dtype=np.int64).reshape(-1)
    n = par.size
    need = np.zeros(n, dtype=bool)
    for c in range(2, n):
        p = par[c]
        if 0 <= p < c - 1:
            need[p] = True
    idx = np.full(n, -1, dtype=np.int32)
    idx[need] = np.arange(int(need.sum()), dtype=np.int32)
    return idx


def _one_pass(s, q, k, v, g, beta):
    """The kernel's update for all heads: s [Hv, dk, dv]; q, k [Hv, dk]; v [Hv, dv]; g, beta [Hv]."""
    alpha = np.exp(g).astype(np.float32)
    ks = np.einsum("hk,hkv->hv", k, s)
    qs = np.einsum("hk,hkv->hv", q, s)
    kq = np.einsum("hk,hk->h", k, q)
    u = beta[:, None] * (v - alpha[:, None] * ks)
    o = alpha[:, None] * qs + kq[:, None] * u
    s = alpha[:, None, None] * s + k[:, :, None] * u[:, None, :]
    return o.astype(np.float32), s.astype(np.float32)


def emulate_tree_delta(q, k, v, g, beta, state, parents):
    """The GPU tree walk in numpy: (o [N, Hv, dv], saves [n_saves, Hv, dk, dv], reloads).

    Inputs as cpu.gated_delta_tree (q, k [N, Hk, dk] with Hk heads tiled to Hv; state [Hv, dk, dv]).
    `reloads` counts the slots that re-read a saved state (the scratch traffic besides the writes).
    """
    n, hv, dv = v.shape
    qt, kt = _tile_heads(q, hv), _tile_heads(k, hv)
    par = np.asarray(parents, dtype=np.int64)
    plan = save_plan(par)
    committed = np.asarray(state, dtype=np.float32)
    saves = np.full((int((plan >= 0).sum()), *committed.shape), np.nan, dtype=np.float32)
    live = committed.copy()
    out = np.empty((n, hv, dv), dtype=np.float32)
    reloads = 0
    for i in range(n):
        if i > 0 and par[i] != i - 1:
            reloads += 1
            live = committed.copy() if par[i] < 0 else saves[plan[par[i]]].copy()
        out[i], live = _one_pass(live, qt[i], kt[i], v[i], g[i], beta[i])
        if plan[i] >= 0:
            saves[plan[i]] = live
    return out, saves, reloads


def replay(k, v, g, beta, state, path) -> np.ndarray:
    """lb_gdn_commit's state half: the committed state after the accepted slots `path` (root first)."""
    hv = v.shape[1]
    kt = _tile_heads(k, hv)
    s = np.asarray(state, dtype=np.float32).copy()
    zeros = np.zeros_like(kt[0])
    for slot in path:
        _, s = _one_pass(s, zeros, kt[slot], v[slot], g[slot], beta[slot])
    return s


def verify_state_traffic(parents, state_bytes: int = STATE_BYTES_27B) -> dict[str, int]:
    """Bytes of recurrent state one verify + commit moves, spine-on-chip + replay vs a state per node.

    every_node: verify reads the committed state and writes one state per slot; commit then copies the
    accepted node's state over the committed one (read + write).
    spine: verify reads the committed state, writes the planned saves and re-reads one per branch;
    commit replays (read + write of the committed state).
    """
    par = np.asarray(parents, dtype=np.int64)
    n = par.size
    n_saves = int((save_plan(par) >= 0).sum())
    reloads = int(sum(1 for i in range(1, n) if par[i] != i - 1))
    every = state_bytes * (1 + n) + 2 * state_bytes
    spine = state_bytes * (1 + n_saves + reloads) + 2 * state_bytes
    return {"slots": n, "saves": n_saves, "reloads": reloads, "every_node_bytes": every, "spine_bytes": spine,
            "saved_bytes": every - spine}
