"""The numpy pieces of the DFlash draft's reference forward (models/dflash_draft.py): Qwen3 RMSNorm,
rotate-half RoPE, the position mask, grouped-query attention, the per-layer context K/V cache, and
the top-K log-probs a proposal is made of."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3 RMSNorm: plain x · w (the weight is not centred on zero)."""
    x = x.astype(np.float32, copy=False)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


def rope_neox(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """Rotate-half RoPE over the whole head: x [T, H, D], pos [T]. Angles in fp32, as HF computes them."""
    d = x.shape[-1]
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    ang = pos.astype(np.float32)[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def visible(q_pos: np.ndarray, k_pos: np.ndarray, causal: bool, window: int | None) -> np.ndarray:
    """[Tq, Tk] mask by absolute positions, as the reference builds it (its key indices are positions)."""
    diff = q_pos[:, None] - k_pos[None, :]
    vis = np.ones(diff.shape, dtype=bool)
    if causal:
        vis &= diff >= 0
    if window is not None:
        vis &= diff < window
        if not causal:
            vis &= -diff < window
    return vis


def attention(q, k, v, mask, scale) -> np.ndarray:
    """q [T, H, D], k/v [S, Hkv, D], mask [T, S] → [T, H·D]; query head h reads kv head h // (H/Hkv)."""
    t, h, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(t, hkv, h // hkv, d)
    s = np.einsum("tgrd,sgd->grts", qg, k) * np.float32(scale)
    s = np.where(mask, s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    p = s / s.sum(axis=-1, keepdims=True)
    return np.einsum("grts,sgd->tgrd", p, v).reshape(t, h * d).astype(np.float32, copy=False)


@dataclass
class ContextCache:
    """Per draft layer: K (after k_norm and RoPE) and V of the fused context rows, grown in place."""

    n_layers: int
    n_kv: int
    head_dim: int
    n: int = 0
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)

    def _reserve(self, need: int) -> None:
        cap = self.pos.shape[0]
        if need <= cap:
            return
        # doubling keeps appends amortised O(rows) instead of a copy per step
        new_cap = max(need, 2 * cap, 64)
        shape = (new_cap, self.n_kv, self.head_dim)
        for buf in (self.k, self.v):
            for i in range(self.n_layers):
                grown = np.empty(shape, dtype=np.float32)
                if i < len(buf):
                    grown[: self.n] = buf[i][: self.n]
                    buf[i] = grown
                else:
                    buf.append(grown)
        pos = np.empty(new_cap, dtype=np.int64)
        pos[: self.n] = self.pos[: self.n]
        self.pos = pos

    def append(self, pos: np.ndarray, ks: list, vs: list) -> None:
        m = pos.shape[0]
        self._reserve(self.n + m)
        self.pos[self.n : self.n + m] = pos
        for i in range(self.n_layers):
            self.k[i][self.n : self.n + m] = ks[i]
            self.v[i][self.n : self.n + m] = vs[i]
        self.n += m


def top_k_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k best log-softmax values, descending; equal logits go to the lower token id."""
    logits = np.asarray(logits, dtype=np.float32)
    n_rows, vocab = logits.shape
    k = min(k, vocab)
    m = logits.max(axis=-1, keepdims=True)
    logprobs = logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))
    # the k-th largest value per row; every token tied with it competes for the last places by id
    kth = -np.partition(-logprobs, k - 1, axis=-1)[:, k - 1]
    ids = np.empty((n_rows, k), dtype=np.int64)
    for r in range(n_rows):
        cand = np.flatnonzero(logprobs[r] >= kth[r])
        ids[r] = cand[np.lexsort((cand, -logprobs[r, cand]))[:k]]
    return np.take_along_axis(logprobs, ids, axis=-1), ids
