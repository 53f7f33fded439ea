"""CPU reference engine for Qwen3.5 / 3.6 in numpy float32: the ground truth GPU kernels are tested against.

Weights come in the internal layout (GGUF names and values, docs/internals.md): norms include +1
(except ssm_norm), ssm_a = -exp(A_log), DeltaNet value heads tiled (value head p uses key head
p % Hk), conv weight [C, K].

State of the committed sequence: per attention layer a K/V cache [max_context, kv_heads, head_dim]
(K after norm and RoPE); per DeltaNet layer the recurrent state [Hv, dk, dv] fp32 and the conv
state, the last K-1 pre-conv inputs [K-1, C]. Prefill runs DeltaNet in the chunked (UT transform)
form, step() in the per-token form; both are public (`gated_delta_chunked`, `gated_delta_recurrent`,
same signature) and `gated_delta_tree` runs the per-token form along parent links.

Speculative verification: verify(tree) computes every slot on top of the committed state (position
n_past + depth, attention over committed rows + ancestors, DeltaNet along parent links with the conv
window built from the ancestry) and keeps per-slot K/V, recurrent states, pre-conv inputs and
features until commit(path) folds the accepted root-to-node path into the committed state.

Feature capture (the DFlash draft reads it): with `tap_layers=(i, …)` the residual stream after
each tap layer (0-indexed, the output of layer i) is kept for every committed position:
`engine.features` is [n_past, len(taps)·hidden] (taps concatenated in the order given);
`engine.last_verify_features` is [N, len(taps)·hidden] for the slots of the last verified tree, and
commit() appends the accepted rows to `engine.features`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from lucebox_cli.engines.base import (
    EngineStats, Tree, VerifyResult, check_room, checked_path, checked_tokens, verify_without_logits,
)
from lucebox_cli.errors import EngineUnavailable, UsageError
from lucebox_cli.models.qwen35 import Qwen35Config, check_weights

CHUNK = 64


# ---- elementwise helpers (fp32, overflow-free) ----


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # tanh form: no exp overflow warnings for large |x|.
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _l2_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def _tile_heads(x: np.ndarray, hv: int) -> np.ndarray:
    """[..., Hk, d] -> [..., Hv, d] with value head p reading key head p % Hk (the tiled order)."""
    reps = [1] * x.ndim
    reps[-2] = hv // x.shape[-2]
    return np.tile(x, reps)


# ---- gated delta rule: three forms of the same recurrence ----
# Shared signature: q, k [T, Hk, dk] (q already L2-normalised and scaled by 1/sqrt(dk), k normalised),
# v [T, Hv, dv], g [T, Hv] log-decay (<= 0), beta [T, Hv], state [Hv, dk, dv] or None (zeros).
# Value head p uses key head p % Hk. Returns (o [T, Hv, dv], final state [Hv, dk, dv]) in float32.


def _delta_step(s: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray):
    """One token for all heads: q, k [Hv, dk]; v [Hv, dv]; g, beta [Hv]; s [Hv, dk, dv] (not modified)."""
    s = s * np.exp(g)[:, None, None]
    kv = (k[:, None, :] @ s)[:, 0, :]  # [Hv, dv] = Sᵀk
    u = beta[:, None] * (v - kv)
    s = s + k[:, :, None] * u[:, None, :]
    return (q[:, None, :] @ s)[:, 0, :], s


def _start_state(state: np.ndarray | None, hv: int, dk: int, dv: int) -> np.ndarray:
    if state is None:
        return np.zeros((hv, dk, dv), dtype=np.float32)
    return np.array(state, dtype=np.float32)


def gated_delta_recurrent(q, k, v, g, beta, state=None):
    """Per-token form (decode): S ← αS; u = β(v − Sᵀk); S ← S + k uᵀ; o = Sᵀq."""
    t_len, hv, dv = v.shape
    qt, kt = _tile_heads(q, hv), _tile_heads(k, hv)
    s = _start_state(state, hv, q.shape[-1], dv)
    out = np.empty((t_len, hv, dv), dtype=np.float32)
    for t in range(t_len):
        out[t], s = _delta_step(s, qt[t], kt[t], v[t], g[t], beta[t])
    return out, s


def gated_delta_tree(q, k, v, g, beta, state, parents):
    """Per-token form along parent links: slot i starts from the state after parents[i] (root: `state`).

    Returns (o [N, Hv, dv], states [N, Hv, dk, dv]) where states[i] is the state after slot i.
    """
    n, hv, dv = v.shape
    qt, kt = _tile_heads(q, hv), _tile_heads(k, hv)
    s0 = _start_state(state, hv, q.shape[-1], dv)
    out = np.empty((n, hv, dv), dtype=np.float32)
    states = np.empty((n, *s0.shape), dtype=np.float32)
    for i in range(n):
        prev = s0 if parents[i] < 0 else states[parents[i]]
        out[i], states[i] = _delta_step(prev, qt[i], kt[i], v[i], g[i], beta[i])
    return out, states


def gated_delta_chunked(q, k, v, g, beta, state=None, chunk: int = CHUNK):
    """Chunked form (prefill): within a chunk the delta rule is a unit lower-triangular system (the
    WY / UT transform); across chunks the state is carried. Same outputs and final state as the
    per-token form up to float rounding.
    """
    t_len, hv, dv = v.shape
    qh = _tile_heads(q, hv).transpose(1, 0, 2)  # [Hv, T, dk]
    kh = _tile_heads(k, hv).transpose(1, 0, 2)
    vh, gh, bh = v.transpose(1, 0, 2), g.T, beta.T  # [Hv, T, dv], [Hv, T], [Hv, T]
    s = _start_state(state, hv, q.shape[-1], dv)
    out = np.empty((hv, t_len, dv), dtype=np.float32)
    for c0 in range(0, t_len, chunk):
        c = slice(c0, min(c0 + chunk, t_len))
        out[:, c], s = _delta_chunk(qh[:, c], kh[:, c], vh[:, c], gh[:, c], bh[:, c], s)
    return out.transpose(1, 0, 2).copy(), s


def _delta_chunk(q, k, v, g, beta, s):
    """One chunk for all heads: q, k [H, L, dk]; v [H, L, dv]; g, beta [H, L]; s [H, dk, dv]."""
    n = g.shape[1]
    cum = np.cumsum(g, axis=1, dtype=np.float32)  # [H, L] log of the decay since the chunk start
    lower = np.tril(np.ones((n, n), dtype=bool))
    # decay[i, j] = exp(cum_i - cum_j) for j <= i; the exponent is never positive there.
    diff = np.where(lower, cum[:, :, None] - cum[:, None, :], -np.inf)
    decay = np.exp(diff).astype(np.float32)  # [H, L, L]
    kb = k * beta[..., None]
    # (I + strictly_lower(β k kᵀ ∘ decay)) [u | w] = [β v | β k e^cum]: the UT transform.
    system = np.tril((kb @ k.transpose(0, 2, 1)) * decay, -1) + np.eye(n, dtype=np.float32)
    rhs = np.concatenate([v * beta[..., None], kb * np.exp(cum)[..., None]], axis=-1)
    sol = np.linalg.solve(system, rhs).astype(np.float32)
    u, w = sol[..., : v.shape[-1]], sol[..., v.shape[-1] :]
    v_new = u - w @ s  # [H, L, dv] the part of each value the carried state does not predict
    attn = (q @ k.transpose(0, 2, 1)) * decay
    o = (q * np.exp(cum)[..., None]) @ s + attn @ v_new
    last = cum[:, -1]
    k_tail = k * np.exp(last[:, None] - cum)[..., None]
    s = s * np.exp(last)[:, None, None] + k_tail.transpose(0, 2, 1) @ v_new
    return o, s.astype(np.float32)


# ---- the engine ----


@dataclass
class _Batch:
    """How one forward pass treats its T new tokens."""

    mode: str  # "chunked" | "recurrent" (append to the committed state) | "tree" (verify, no commit)
    positions: np.ndarray  # [T]
    local_mask: np.ndarray  # [T, T] bool: which new tokens each new token attends to
    windows: np.ndarray | None = None  # [T, K] conv-window rows into concat(conv_state, pre), tree only
    parents: np.ndarray | None = None  # [T] tree only


@dataclass
class _Pending:
    """What verify() computed per slot, kept until commit()."""

    tree: Tree
    k: dict[int, np.ndarray]  # layer -> [N, kv_heads, head_dim]
    v: dict[int, np.ndarray]
    states: dict[int, np.ndarray]  # layer -> [N, Hv, dk, dv] state after each slot
    pre: dict[int, np.ndarray]  # layer -> [N, C] pre-conv inputs
    features: np.ndarray | None  # [N, taps·hidden]


class CPUEngine:
    """numpy float32 implementation of the Engine protocol (engines/base.py)."""

    name = "cpu"

    def __init__(
        self,
        cfg: Qwen35Config,
        weights: Mapping[str, np.ndarray],
        *,
        tap_layers: Sequence[int] = (),
        max_context: int = 4096,
    ):
        check_weights(cfg, weights)
        bad = [t for t in tap_layers if not 0 <= t < cfg.n_layers]
        if bad:
            raise UsageError(f"tap layers {bad} outside 0..{cfg.n_layers - 1}")
        self.cfg = cfg
        self.tap_layers = tuple(int(t) for t in tap_layers)
        self.max_context = int(max_context)
        self._w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
        self._head = self._w["token_embd.weight" if cfg.tied else "output.weight"]
        half = cfg.rope_dims // 2
        inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.rope_dims)
        angles = np.arange(self.max_context, dtype=np.float64)[:, None] * inv_freq[None, :]
        self._cos, self._sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        self.stats = EngineStats()
        self._closed = False
        self.reset()

    # -- protocol --

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def features(self) -> np.ndarray:
        """[n_past, len(taps)·hidden] captured residual stream after the tap layers (read-only view)."""
        view = self._features[: self._n_past]
        view.flags.writeable = False
        return view

    def reset(self) -> None:
        cfg = self.cfg
        self._n_past = 0
        self._pending: _Pending | None = None
        self.last_verify_features: np.ndarray | None = None
        self._k_cache, self._v_cache, self._state, self._conv = {}, {}, {}, {}
        for i in range(cfg.n_layers):
            if cfg.is_attention(i):
                shape = (self.max_context, cfg.n_kv_heads, cfg.head_dim)
                self._k_cache[i] = np.zeros(shape, np.float32)
                self._v_cache[i] = np.zeros(shape, np.float32)
            else:
                self._state[i] = np.zeros((cfg.hv, cfg.dk, cfg.dv), np.float32)
                self._conv[i] = np.zeros((cfg.conv_kernel - 1, cfg.conv_channels), np.float32)
        self._features = np.zeros((self.max_context, len(self.tap_layers) * cfg.hidden), np.float32)

    def close(self) -> None:
        self._closed = True
        self._w, self._k_cache, self._v_cache, self._state, self._conv = {}, {}, {}, {}, {}
        self._pending = None

    def prefill(self, token_ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Append tokens (chunked DeltaNet); logits [V] of the last one, or [T, V] with all_logits."""
        tokens = self._tokens(token_ids)
        t_len = tokens.size
        batch = _Batch("chunked", self._n_past + np.arange(t_len), np.tril(np.ones((t_len, t_len), dtype=bool)))
        x = self._append(tokens, batch)
        self.stats.prefill_tokens += t_len
        return self._logits(x) if all_logits else self._logits(x[-1:])[0]

    def step(self, token_id: int) -> np.ndarray:
        """Append one token (per-token DeltaNet); logits [V] for the next position."""
        tokens = self._tokens([token_id])
        x = self._append(tokens, _Batch("recurrent", np.array([self._n_past]), np.ones((1, 1), dtype=bool)))
        self.stats.decode_steps += 1
        return self._logits(x)[0]

    def step_argmax(self, token_id: int) -> int:
        """Greedy step (base.greedy_step): the argmax of step()'s logits."""
        return int(np.argmax(self.step(token_id)))

    def verify_argmax(self, tree: Tree) -> VerifyResult:
        """Greedy verify (base.greedy_verify): verify() without the logits."""
        return verify_without_logits(self.verify(tree))

    def verify(self, tree: Tree) -> VerifyResult:
        tokens = self._tokens(tree.tokens)
        self._check_room(tree.size)
        batch = _Batch(
            "tree",
            self._n_past + tree.depth,
            tree.ancestor_mask(),
            windows=self._tree_windows(tree),
            parents=tree.parents,
        )
        self._pending = _Pending(tree, {}, {}, {}, {}, None)
        x, feats = self._forward(tokens, batch)
        self._pending.features = feats
        self.last_verify_features = feats
        self.stats.verify_calls += 1
        logits = self._logits(x)
        return VerifyResult(argmax=np.argmax(logits, axis=-1).astype(np.int64), logits=logits)

    def commit(self, accepted_slots: Sequence[int]) -> None:
        path = self._check_path(accepted_slots)
        p, n0, n = self._pending, self._n_past, len(path)
        assert p is not None
        for i in self._k_cache:
            self._k_cache[i][n0 : n0 + n] = p.k[i][path]
            self._v_cache[i][n0 : n0 + n] = p.v[i][path]
        for i in self._state:
            self._state[i] = p.states[i][path[-1]].copy()
            history = np.concatenate([self._conv[i], p.pre[i][path]], axis=0)
            self._conv[i] = history[-(self.cfg.conv_kernel - 1) :].copy()
        if p.features is not None:
            self._features[n0 : n0 + n] = p.features[path]
        self._n_past += n
        self.stats.committed = self._n_past
        self._pending = None

    # -- internals: bookkeeping --

    def _tokens(self, token_ids: Sequence[int]) -> np.ndarray:
        if self._closed:
            raise EngineUnavailable("this CPU engine was closed")
        return checked_tokens(token_ids, self.cfg.vocab)

    def _check_room(self, n: int) -> None:
        check_room(self._n_past, n, self.max_context)

    def _check_path(self, accepted_slots: Sequence[int]) -> list[int]:
        return checked_path(self._pending.tree if self._pending is not None else None, accepted_slots)

    def _tree_windows(self, tree: Tree) -> np.ndarray:
        """[N, K] rows of concat(conv_state (K-1 rows), pre (N rows)) forming each slot's conv window."""
        k = self.cfg.conv_kernel
        rows = np.empty((tree.size, k), dtype=np.int64)
        for i in range(tree.size):
            chain = list(range(k - 1)) + [k - 1 + s for s in tree.path_to(i)]
            rows[i] = chain[-k:]
        return rows

    def _append(self, tokens: np.ndarray, batch: _Batch) -> np.ndarray:
        self._check_room(tokens.size)
        self._pending = None
        self.last_verify_features = None
        x, feats = self._forward(tokens, batch)
        n0 = self._n_past
        if feats is not None:
            self._features[n0 : n0 + tokens.size] = feats
        self._n_past += tokens.size
        self.stats.committed = self._n_past
        return x

    # -- internals: the model --

    def _forward(self, tokens: np.ndarray, batch: _Batch) -> tuple[np.ndarray, np.ndarray | None]:
        """Residual stream after the last layer [T, hidden], and the tap features [T, taps·hidden]."""
        cfg, w = self.cfg, self._w
        x = w["token_embd.weight"][tokens]
        taps: dict[int, np.ndarray] = {}
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            h = _rms_norm(x, w[b + "attn_norm.weight"], cfg.eps)
            x = x + (self._attention(i, h, batch) if cfg.is_attention(i) else self._deltanet(i, h, batch))
            h = _rms_norm(x, w[b + "post_attention_norm.weight"], cfg.eps)
            x = x + (_silu(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
            if i in self.tap_layers:
                taps[i] = x
        feats = np.concatenate([taps[t] for t in self.tap_layers], axis=-1) if self.tap_layers else None
        return x, feats

    def _logits(self, x: np.ndarray) -> np.ndarray:
        return _rms_norm(x, self._w["output_norm.weight"], self.cfg.eps) @ self._head.T

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate-half RoPE on dims [0, rope_dims) of x [T, heads, head_dim]; dim i pairs with i + rope_dims/2."""
        half = self.cfg.rope_dims // 2
        cos, sin = self._cos[positions][:, None, :], self._sin[positions][:, None, :]
        a, b = x[..., :half], x[..., half : 2 * half]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half :]], axis=-1)

    def _attention(self, i: int, h: np.ndarray, batch: _Batch) -> np.ndarray:
        cfg, w, b = self.cfg, self._w, f"blk.{i}."
        t_len, hd = h.shape[0], cfg.head_dim
        # attn_q rows are interleaved per head: [q_h (head_dim) | gate_h (head_dim)].
        qg = (h @ w[b + "attn_q.weight"].T).reshape(t_len, cfg.n_heads, 2 * hd)
        q = _rms_norm(qg[..., :hd], w[b + "attn_q_norm.weight"], cfg.eps)
        gate = qg[..., hd:].reshape(t_len, cfg.n_heads * hd)
        k = _rms_norm((h @ w[b + "attn_k.weight"].T).reshape(t_len, cfg.n_kv_heads, hd), w[b + "attn_k_norm.weight"], cfg.eps)
        v = (h @ w[b + "attn_v.weight"].T).reshape(t_len, cfg.n_kv_heads, hd)
        q, k = self._rope(q, batch.positions), self._rope(k, batch.positions)
        n0 = self._n_past
        if batch.mode == "tree":
            assert self._pending is not None
            self._pending.k[i], self._pending.v[i] = k, v
            keys = np.concatenate([self._k_cache[i][:n0], k])
            values = np.concatenate([self._v_cache[i][:n0], v])
        else:
            self._k_cache[i][n0 : n0 + t_len], self._v_cache[i][n0 : n0 + t_len] = k, v
            keys, values = self._k_cache[i][: n0 + t_len], self._v_cache[i][: n0 + t_len]
        mask = np.concatenate([np.ones((t_len, n0), dtype=bool), batch.local_mask], axis=1)
        o = _attend(q, keys, values, mask).reshape(t_len, cfg.n_heads * hd)
        return (o * _sigmoid(gate)) @ w[b + "attn_output.weight"].T

    def _deltanet(self, i: int, h: np.ndarray, batch: _Batch) -> np.ndarray:
        cfg, w, b = self.cfg, self._w, f"blk.{i}."
        t_len, kk = h.shape[0], cfg.conv_kernel
        pre = h @ w[b + "attn_qkv.weight"].T  # [T, C] pre-conv q|k|v
        history = np.concatenate([self._conv[i], pre], axis=0)  # [K-1+T, C]
        conv_w = w[b + "ssm_conv1d.weight"]  # [C, K]; column K-1 multiplies the current token
        if batch.mode == "tree":
            mixed = np.einsum("tkc,ck->tc", history[batch.windows], conv_w)
        else:
            mixed = sum(history[j : j + t_len] * conv_w[:, j] for j in range(kk))
        mixed = _silu(mixed)
        qk = cfg.hk * cfg.dk
        q = _l2_norm(mixed[:, :qk].reshape(t_len, cfg.hk, cfg.dk)) / np.float32(np.sqrt(cfg.dk))
        k = _l2_norm(mixed[:, qk : 2 * qk].reshape(t_len, cfg.hk, cfg.dk))
        v = mixed[:, 2 * qk :].reshape(t_len, cfg.hv, cfg.dv)
        beta = _sigmoid(h @ w[b + "ssm_beta.weight"].T)
        g = w[b + "ssm_a"] * np.logaddexp(0.0, h @ w[b + "ssm_alpha.weight"].T + w[b + "ssm_dt.bias"])
        g, beta = g.astype(np.float32), beta.astype(np.float32)
        if batch.mode == "tree":
            assert self._pending is not None
            o, states = gated_delta_tree(q, k, v, g, beta, self._state[i], batch.parents)
            self._pending.states[i], self._pending.pre[i] = states, pre
        else:
            delta = gated_delta_chunked if batch.mode == "chunked" else gated_delta_recurrent
            o, self._state[i] = delta(q, k, v, g, beta, self._state[i])
            self._conv[i] = history[-(kk - 1) :].copy()
        z = (h @ w[b + "attn_gate.weight"].T).reshape(t_len, cfg.hv, cfg.dv)
        y = _rms_norm(o, w[b + "ssm_norm.weight"], cfg.eps) * _silu(z)
        return y.reshape(t_len, cfg.hv * cfg.dv) @ w[b + "ssm_out.weight"].T


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray, block: int = 256) -> np.ndarray:
    """Masked softmax attention with GQA: q [T, H, hd]; keys/values [S, Hkv, hd]; mask [T, S] -> [T, H, hd].

    Queries go in blocks so a long prefill never holds all [H, T, S] scores at once.
    """
    t_len, n_heads, hd = q.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv  # head h reads kv head h // group
    k_t = keys.transpose(1, 2, 0)[:, None]  # [Hkv, 1, hd, S]
    v_h = values.transpose(1, 0, 2)[:, None]  # [Hkv, 1, S, hd]
    out = np.empty((t_len, n_heads, hd), dtype=np.float32)
    for t0 in range(0, t_len, block):
        rows = slice(t0, min(t0 + block, t_len))
        n = rows.stop - rows.start
        qg = q[rows].reshape(n, n_kv, group, hd).transpose(1, 2, 0, 3)  # [Hkv, g, n, hd]
        scores = np.where(mask[rows], qg @ k_t / np.float32(np.sqrt(hd)), -np.inf)  # [Hkv, g, n, S]
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        o = (scores / scores.sum(axis=-1, keepdims=True)) @ v_h  # [Hkv, g, n, hd]
        out[rows] = o.transpose(2, 0, 1, 3).reshape(n, n_heads, hd)
    return out
