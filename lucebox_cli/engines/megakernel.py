"""The CUDA engine for Qwen3.5-0.8B: the persistent decode megakernel (cuda/megakernel/) over the C ABI.

One cooperative launch runs a batch of tokens with a device-side greedy loop (the argmax of one step is
the next step's input); tokens land in host-visible memory, so `decode_stream` can print them while the
launch runs. Prefill runs the tensor-core path (cuda/prefill/, `prefill_tc.TensorCorePrefill`) by
default; `prefill_mode="decode"` feeds the prompt through the decode kernel one token per step instead
(slow, but the simplest path that writes exactly the state decode reads: the tests' reference).
The tensor-core prefill's GEMMs run on cuBLAS when one loads at run time (engines/cublas.py; knobs
LUCEBOX_PREFILL_GEMM=auto|own|cublas and LUCEBOX_CUBLAS=off|path), else on our own kernel; `info`
records which ("prefill_gemm", "cublas"), and so does every bench row's engine_info. Its attention runs on
the tensor cores unless LUCEBOX_ATTN_PREFILL=fp32 (read once per process by the library): "prefill_attn".
Speculative verify/commit are not supported by the 0.8B megakernel (EngineUnavailable).

The kernel is specialised for the 0.8B widths; only the layer count and the vocabulary may differ
(tests run the real widths with few layers). Weights go up as bf16 (round to nearest even).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from lucebox_cli.engines.base import EngineStats, Tree, VerifyResult
from lucebox_cli.errors import EngineUnavailable, UnsupportedModel, UsageError
from lucebox_cli.models.qwen35 import Qwen35Config, check_weights

# lb_mk_* weight kinds (cuda/include/lucebox.h), keyed by the GGUF name suffix; True = bf16 matrix
_TOP_KINDS = {"token_embd.weight": (0, True), "output_norm.weight": (1, False)}
_LAYER_KINDS = {
    "attn_norm.weight": (2, False),
    "post_attention_norm.weight": (3, False),
    "ffn_gate.weight": (4, True),
    "ffn_up.weight": (5, True),
    "ffn_down.weight": (6, True),
    "attn_qkv.weight": (7, True),
    "attn_gate.weight": (8, True),
    "ssm_beta.weight": (9, True),
    "ssm_alpha.weight": (10, True),
    "ssm_out.weight": (11, True),
    "ssm_conv1d.weight": (12, False),
    "ssm_a": (13, False),
    "ssm_dt.bias": (14, False),
    "ssm_norm.weight": (15, False),
    "attn_q.weight": (16, True),
    "attn_k.weight": (17, True),
    "attn_v.weight": (18, True),
    "attn_output.weight": (19, True),
    "attn_q_norm.weight": (20, False),
    "attn_k_norm.weight": (21, False),
}
READ_STATE, READ_CONV, READ_KCACHE, READ_VCACHE, READ_HIDDEN, READ_LOGITS = range(6)

# The widths the kernel is compiled for (cuda/megakernel/mk_common.cuh).
_FIXED = dict(hidden=1024, n_heads=8, n_kv_heads=2, head_dim=256, hk=16, hv=16, dk=128, dv=128,
              conv_kernel=4, ffn=3584, rope_dims=64)


def unsupported_reason(cfg: Qwen35Config) -> Optional[str]:
    """None when the megakernel runs this model, else why not (one line)."""
    for key, want in _FIXED.items():
        if getattr(cfg, key) != want:
            return f"{key}={getattr(cfg, key)} (the 0.8B megakernel is built for {key}={want})"
    if not cfg.tied:
        return "an untied LM head (the 0.8B megakernel reads the tied embedding)"
    for i in range(cfg.n_layers):
        if cfg.is_attention(i) != ((i + 1) % 4 == 0):
            return "a layer pattern other than attention at every 4th layer"
    return None


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 bit patterns (uint16), round to nearest even, as the kernel's own rounding."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def open_gpu(profile: Optional[str] = None) -> tuple[Any, Any]:
    """(lib, profile) for GPU 0, or EngineUnavailable saying why not (no GPU, not built, wrong arch)."""
    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    probe = _lib.probe_gpus()
    if not probe.gpus:
        raise EngineUnavailable(
            f"the CUDA megakernel needs an NVIDIA GPU: {probe.reason or 'none found'}",
            hint="use --engine cpu on this machine",
        )
    prof = resolve_profile(profile, probe.gpus)
    return _lib.load(prof), prof


class MegakernelEngine:
    """Engine protocol over lb_mk_*; `decode(n)` is the fast path (one launch for n tokens)."""

    name = "cuda"

    def __init__(self, cfg: Qwen35Config, weights: Mapping[str, np.ndarray], *, profile: Optional[str] = None,
                 max_context: int = 4096, n_blocks: int = 0, lib: Any = None, prof: Any = None,
                 prefill_mode: str = "tensor-core", ring: Optional[tuple[int, int]] = None,
                 ring_hold: Optional[int] = None, prefill_gemm: Optional[str] = None):
        if prefill_mode not in ("tensor-core", "decode"):
            raise UsageError(f"unknown prefill mode {prefill_mode!r}", hint="use 'tensor-core' or 'decode'")
        reason = unsupported_reason(cfg)
        if reason:
            raise UnsupportedModel(f"the CUDA megakernel cannot run this model: {reason}",
                                   hint="use --engine cpu (the megakernel serves Qwen3.5-0.8B shapes)")
        check_weights(cfg, weights)
        if lib is None:
            lib, prof = open_gpu(profile)
        self.cfg, self.lib, self.profile = cfg, lib, prof
        self.max_context = int(max_context)
        self.stats = EngineStats()
        self._handle = ctypes.c_void_p()
        self._tc_prefill = None
        mk = prof.get("build.megakernel", {}) if prof is not None else {}
        from lucebox_cli.engines._lib import MkConfig

        # the per-warp weight ring (slots, bytes per slot) and when it refills (ring_hold): the argument, else the
        # profile's, else (0, 0) = the largest that fits, refilled as slots free up
        slots, slot_bytes = ring if ring is not None else (mk.get("ring_slots", 0), mk.get("ring_slot_bytes", 0))
        c = MkConfig(n_layers=cfg.n_layers, vocab=cfg.vocab, max_context=self.max_context, n_blocks=int(n_blocks),
                     blocks_per_sm=int(mk.get("blocks_per_sm", 0)), threads=int(mk.get("threads", 0)), device=0,
                     rms_eps=float(cfg.eps), rope_theta=float(cfg.rope_theta), ring_slots=int(slots),
                     ring_slot_bytes=int(slot_bytes),
                     ring_hold=int(mk.get("ring_hold", 0) if ring_hold is None else ring_hold))
        lib.call("lb_mk_create", ctypes.byref(c), ctypes.byref(self._handle))
        try:
            self._upload(weights)
            if prefill_mode == "tensor-core":
                from lucebox_cli.engines.prefill_tc import TensorCorePrefill

                self._tc_prefill = TensorCorePrefill(self, gemm=prefill_gemm)
        except BaseException:
            self.close()
            raise
        self.info = self._info()
        tc = self._tc_prefill
        self.info["prefill_gemm"] = tc.gemm if tc is not None else None
        self.info["prefill_attn"] = tc.attn if tc is not None else None
        self.info["cublas"] = (f"{tc.cublas.path} ({tc.cublas.version or 'version unknown'})"
                               if tc is not None and tc.cublas.loaded else None)
        if tc is not None and tc.note:
            self.info["prefill_gemm_note"] = tc.note

    # -- setup --

    def _upload(self, weights: Mapping[str, np.ndarray]) -> None:
        for name, array in weights.items():
            if name in _TOP_KINDS:
                (kind, is_mat), layer = _TOP_KINDS[name], -1
            else:
                parts = name.split(".", 2)
                if parts[0] != "blk" or parts[2] not in _LAYER_KINDS:
                    continue
                (kind, is_mat), layer = _LAYER_KINDS[parts[2]], int(parts[1])
            host = to_bf16_bits(array) if is_mat else np.ascontiguousarray(array, dtype=np.float32)
            self.lib.call("lb_mk_set_weight", self._handle, kind, layer, host.ctypes.data, host.nbytes)

    def _info(self) -> dict[str, Any]:
        from lucebox_cli.engines._lib import MkInfo

        info = MkInfo()
        self.lib.call("lb_mk_get_info", self._handle, ctypes.byref(info))
        return {name: int(getattr(info, name)) for name, _ in MkInfo._fields_}

    # -- protocol --

    @property
    def n_past(self) -> int:
        return self._position()[0]

    @property
    def pending(self) -> int:
        """The argmax of the last step (fed first by the next decode), -1 before any token."""
        return self._position()[1]

    def _position(self) -> tuple[int, int]:
        n, p = ctypes.c_int(0), ctypes.c_int(0)
        self.lib.call("lb_mk_position", self._handle, ctypes.byref(n), ctypes.byref(p))
        return n.value, p.value

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append the prompt (tensor-core prefill, or one token per decode-kernel step); logits [V] of the last."""
        tokens = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64).reshape(-1), dtype=np.int32)
        if tokens.size == 0:
            raise UsageError("prefill needs at least one token")
        if self._tc_prefill is not None:
            logits = self._tc_prefill.run(tokens)[1]
        else:
            logits = self._launch(tokens, tokens.size, want_logits=True)[1]
        self.stats.prefill_tokens += int(tokens.size)
        return logits

    def step(self, token_id: int) -> np.ndarray:
        logits = self._launch(np.asarray([token_id], dtype=np.int32), 1, want_logits=True)[1]
        self.stats.decode_steps += 1
        return logits

    def decode(self, n: int) -> np.ndarray:
        """Greedy: feed the pending token, then each argmax; return the n new tokens (int64)."""
        toks = self._launch(np.zeros(0, dtype=np.int32), int(n), want_logits=False)[0]
        self.stats.decode_steps += int(n)
        return toks

    def decode_stream(self, n: int, poll_s: float = 0.0005) -> Iterator[int]:
        """Like decode(n), yielding each token as soon as the running kernel has written it."""
        self.lib.call("lb_mk_decode_start", self._handle, None, 0, int(n), 0)
        out = (ctypes.c_int32 * int(n))()
        ready, seen = ctypes.c_int(0), 0
        try:
            while seen < n:
                self.lib.call("lb_mk_decode_poll", self._handle, out, ctypes.byref(ready))
                for i in range(seen, ready.value):
                    yield int(out[i])
                if ready.value == seen:
                    time.sleep(poll_s)
                seen = ready.value
        finally:
            self.lib.call("lb_mk_decode_finish", self._handle, out, None)
        self.stats.decode_steps += int(n)

    def verify(self, tree: Tree) -> VerifyResult:
        raise EngineUnavailable("tree verify is not supported by the 0.8B megakernel",
                                hint="speculative decoding runs on the 27B DFlash engine; use --spec none")

    def commit(self, accepted_slots: Sequence[int]) -> None:
        raise EngineUnavailable("commit is not supported by the 0.8B megakernel", hint="use --spec none")

    def reset(self) -> None:
        self.lib.call("lb_mk_reset", self._handle)

    def close(self) -> None:
        # The prefill context borrows the handle: free it first.
        if self._tc_prefill is not None:
            self._tc_prefill.close()
            self._tc_prefill = None
        if self._handle:
            self.lib.fn.lb_mk_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- launches, timing and state for tests --

    def _launch(self, forced: np.ndarray, n_steps: int, *, want_logits: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
        if n_steps < 1:
            raise UsageError("the number of steps must be at least 1")
        if self.n_past + n_steps > self.max_context:
            raise UsageError(f"{self.n_past} + {n_steps} tokens exceed max_context {self.max_context}",
                             hint="raise --max-context")
        out = np.empty(n_steps, dtype=np.int32)
        logits = np.empty(self.cfg.vocab, dtype=np.float32) if want_logits else None
        forced = np.ascontiguousarray(forced, dtype=np.int32)
        self.lib.call(
            "lb_mk_decode", self._handle,
            forced.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if forced.size else None, int(forced.size),
            int(n_steps), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if logits is not None else None,
        )
        return out.astype(np.int64), logits

    def last_kernel_ms(self) -> float:
        ms = ctypes.c_float(0.0)
        self.lib.call("lb_mk_last_time_ms", self._handle, ctypes.byref(ms))
        return float(ms.value)

    def poison(self) -> None:
        """Fill activations, partials and logits with NaN before the next launch (tests)."""
        self.lib.call("lb_mk_poison", self._handle)

    def read(self, what: int, layer: int = -1) -> np.ndarray:
        """Device state as numpy: READ_STATE [Hv, dk, dv] (transposed back to the CPU engine's layout),
        READ_CONV [4, C] (slot p % 4 = position p), READ_KCACHE/READ_VCACHE [max_ctx, kv_heads, hd] f32,
        READ_HIDDEN [hidden], READ_LOGITS [V]."""
        cfg = self.cfg
        shapes = {READ_STATE: ((cfg.hv, cfg.dv, cfg.dk), np.float32), READ_CONV: ((4, cfg.conv_channels), np.float32),
                  READ_KCACHE: ((cfg.n_kv_heads, self.max_context, cfg.head_dim), np.uint16),
                  READ_VCACHE: ((cfg.n_kv_heads, self.max_context, cfg.head_dim), np.uint16),
                  READ_HIDDEN: ((cfg.hidden,), np.float32), READ_LOGITS: ((cfg.vocab,), np.float32)}
        shape, dtype = shapes[what]
        buf = np.empty(shape, dtype=dtype)
        self.lib.call("lb_mk_read", self._handle, what, int(layer), buf.ctypes.data, buf.nbytes)
        if what == READ_STATE:
            return np.ascontiguousarray(buf.transpose(0, 2, 1))
        if what in (READ_KCACHE, READ_VCACHE):
            return np.ascontiguousarray(bf16_bits_to_f32(buf).transpose(1, 0, 2))
        return buf
