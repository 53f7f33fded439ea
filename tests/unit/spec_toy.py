"""A tiny deterministic engine for the speculative-decoding tests (test helper, not a test module).

It has the state a Qwen3.5 engine has, in the layouts the GPU engines and the state/ kernels use:
a conv window [1, W=3, C] and a DeltaNet-like recurrent state [1, Hv, dk, dv] (layer 0), a KV cache
[1, H, S, Dh] (layer 1, tree rows written at committed + slot), and a feature ring [R, F] of the tapped
hidden states. verify() follows parent links exactly as the Engine protocol says, and commit() uses the
numpy twins of the state kernels (state_select, conv_gather, kv_compact, feature_compact), so the spec
loop tests also prove the twins do the bookkeeping a sequential decode would.

Every token goes through one function (`_token`) whether it comes from step() or verify(), with the
same operands in the same order, so tree and sequential paths agree bitwise.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lucebox_cli.engines.base import EngineStats, Tree, VerifyResult
from lucebox_cli.state.conv_gather import conv_gather_ref
from lucebox_cli.state.feature_compact import feature_compact_ref
from lucebox_cli.state.kv_compact import kv_compact_ref
from lucebox_cli.state.state_select import state_select_ref

D, HV, DK, H, DH, W, RING, MAX_TREE = 8, 2, 4, 2, 4, 3, 24, 64


class ToyEngine:
    name = "toy"

    def __init__(self, vocab: int = 64, seed: int = 0, max_context: int = 256, logit_scale: float = 4.0):
        rng = np.random.default_rng(seed)

        def mat(*shape, scale=1.0):
            return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

        self.vocab, self.max_context = vocab, max_context
        self.embd = mat(vocab, D, scale=2.0)
        self.conv_w = (rng.standard_normal((W + 1, D)) * 0.6).astype(np.float32)
        self.wv, self.wo0 = mat(D, D), mat(D, D)
        self.wq, self.wk, self.wv1, self.wo1 = mat(D, D), mat(D, D), mat(D, D), mat(D, D)
        self.freq = (rng.uniform(0.05, 1.0, size=H * DH)).astype(np.float32)
        self.out = mat(vocab, D, scale=logit_scale)
        self.stats = EngineStats()
        self.reset()

    # -- protocol --

    @property
    def n_past(self) -> int:
        return self._n

    def reset(self) -> None:
        self._n = 0
        self.state = np.zeros((1, HV, DK, D // HV), np.float32)
        self.conv = np.zeros((1, W, D), np.float32)
        self.k_cache = np.zeros((1, H, self.max_context + MAX_TREE, DH), np.float32)
        self.v_cache = np.zeros_like(self.k_cache)
        self.ring = np.zeros((RING, 2 * D), np.float32)
        self._tree = None

    def close(self) -> None:
        self._tree = None

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        logits = None
        for t in token_ids:
            logits = self.step(int(t))
        return logits

    def step(self, token_id: int) -> np.ndarray:
        n = self._n
        window = np.concatenate([self.conv[0], self.embd[token_id][None]], axis=0)
        logits, state, k, v, feats = self._token(token_id, n, window, self.state[0], self._rows(n, []))
        self.state[0] = state
        self.conv[0] = window[1:]
        self.k_cache[0, :, n], self.v_cache[0, :, n] = k, v
        self.ring[n % RING] = feats
        self._n += 1
        return logits

    def verify(self, tree: Tree) -> VerifyResult:
        n, size = self._n, tree.size
        assert n + tree.depth.max() < self.max_context and size <= MAX_TREE
        node_states = np.zeros((size, 1, HV, DK, D // HV), np.float32)
        node_inputs = np.zeros((size, 1, D), np.float32)
        feats = np.zeros((size, 2 * D), np.float32)
        logits = np.zeros((size, self.vocab), np.float32)
        for i in range(size):
            path = tree.path_to(i)
            tok = int(tree.tokens[i])
            node_inputs[i, 0] = self.embd[tok]
            # the conv window walks the ancestry, falling back into the committed window
            hist = np.concatenate([self.conv[0], node_inputs[path, 0]], axis=0)
            parent = int(tree.parents[i])
            s_in = self.state[0] if parent < 0 else node_states[parent, 0]
            logits[i], node_states[i, 0], k, v, feats[i] = self._token(
                tok, n + len(path) - 1, hist[-(W + 1):], s_in, self._rows(n, path[:-1])
            )
            self.k_cache[0, :, n + i], self.v_cache[0, :, n + i] = k, v
        self._tree = (tree, node_states, node_inputs, feats)
        self.stats.verify_calls += 1
        return VerifyResult(argmax=np.argmax(logits, axis=-1).astype(np.int64), logits=logits)

    def commit(self, accepted_slots: Sequence[int]) -> None:
        tree, node_states, node_inputs, feats = self._tree
        path = np.asarray(accepted_slots, dtype=np.int64)
        assert path[0] == 0 and all(tree.parents[b] == a for a, b in zip(path, path[1:]))
        n = self._n
        kv_compact_ref(self.k_cache, self.v_cache, path, n)
        state_select_ref(self.state, node_states, int(path[-1]))
        conv_gather_ref(self.conv, node_inputs, tree.parents, int(path[-1]))
        feature_compact_ref(self.ring, feats, path, n)
        self._n += len(path)
        self._tree = None

    # -- model --

    def _rows(self, n: int, ancestors: list[int]) -> np.ndarray:
        """Cache rows a token at the tree position sees before itself: committed, then its ancestors."""
        return np.concatenate([np.arange(n), n + np.asarray(ancestors, dtype=np.int64)]).astype(np.int64)

    def _token(self, tok: int, pos: int, window: np.ndarray, s_in: np.ndarray, rows: np.ndarray):
        """One token: logits, new recurrent state, its K/V row, its tapped features."""
        x = self.embd[tok]
        c = (window * self.conv_w).sum(axis=0)
        c = c / (np.float32(1.0) + np.exp(-c))
        kh = c.reshape(HV, DK)
        kh = kh / np.sqrt((kh * kh).sum(axis=-1, keepdims=True) + np.float32(1e-6))
        vh = (self.wv @ c).reshape(HV, D // HV)
        state = np.float32(0.9) * s_in + kh[:, :, None] * vh[:, None, :]
        r = np.einsum("hk,hkv->hv", kh, state).reshape(D)
        y0 = x + self.wo0 @ r
        rot = np.sin(np.float32(pos) * self.freq).astype(np.float32)
        q = (self.wq @ y0 + rot).reshape(H, DH)
        k = (self.wk @ y0 + rot).reshape(H, DH)
        v = (self.wv1 @ y0).reshape(H, DH)
        keys = np.concatenate([self.k_cache[0][:, rows], k[:, None]], axis=1)  # [H, T, DH]
        vals = np.concatenate([self.v_cache[0][:, rows], v[:, None]], axis=1)
        scores = np.einsum("hd,htd->ht", q, keys) / np.float32(np.sqrt(DH))
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        y1 = y0 + self.wo1 @ np.einsum("ht,htd->hd", p, vals).reshape(D)
        logits = self.out @ np.tanh(y1)
        return logits.astype(np.float32), state, k, v, np.concatenate([y0, y1])

    def snapshot(self) -> dict[str, np.ndarray]:
        """The state in use: KV rows 0..n−1, recurrent and conv state, ring rows of the last positions."""
        n = self._n
        live = [p % RING for p in range(max(0, n - RING), n)]
        return {
            "k": self.k_cache[:, :, :n].copy(),
            "v": self.v_cache[:, :, :n].copy(),
            "state": self.state.copy(),
            "conv": self.conv.copy(),
            "ring": self.ring[live].copy(),
        }
