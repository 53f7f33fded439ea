"""The Qwen3.5/3.6-27B target engine on the GPU (Q4_K_M and friends), through the C ABI.

    eng = DFlashTargetEngine("model.gguf", max_context=16384, budget=22, tap_layers=(1, 16, 31, 46, 61))
    logits = eng.prefill(ids); logits = eng.step(tok)
    res = eng.verify(tree); eng.commit(path)
    tok = eng.step_argmax(tok); res = eng.verify(tree, want_logits=False)  # greedy: ids only

Logits stay on the device unless the caller asks for them: step() / prefill() / verify() return host
logits as the Engine protocol says, while the greedy entry points (step_argmax, verify_argmax, or
verify(tree, want_logits=False); spec/loop.py and `bench speed` use them at T = 0 through
base.greedy_step / base.greedy_verify) run lb_df_topk on the device and copy back only int32 ids,
with VerifyResult.logits = None. Ties go to the lower id and NaN wins, exactly as np.argmax.

The memory plan (engines/memory_plan.py) is checked against the card before anything is allocated.
Weights are uploaded tensor by tensor from the memory-mapped GGUF into one arena (Q6_K / Q8_0 repacked
on the host, engines/dflash_upload.py); the embedding of an untied model stays on the host. The layer
sequence is engines/dflash_layers.py. The kernels run on the engine's own stream (lb_stream_create:
default flags, so it synchronises with the legacy default stream and the blocking lb_dev_* copies
still order themselves against the kernels). Programmatic dependent launch (cuda/common/lb_pdl.cuh: the next
kernel's blocks start, and issue their first weight loads, while the current one drains) is on in the captured
decode-step graph only (`step_pdl`, LUCEBOX_PDL: unset / "step" that, "0" never, "1" every launch — the C
library's own switch): there it took tg128 149.9 → 163.1 tok/s on the H200, while the verify measured 3% slower
and the prefill no different (docs/perf.md "PDL, third try").

CUDA graphs (use_graphs; LUCEBOX_GRAPHS=0 turns them off): a decode step (embedding on the device when
token_embd is there, the layers, the LM head, the device argmax and the greedy tail) and a verify of n
slots (layers and head) are captured once per shape (dflash_layers.Layers.capture) and replayed with one
launch. What differs between calls is data in device memory the kernels read: `gstate` = int32 {n_past,
token, steps} (the attention ops' _at forms read n_past there), the tree's parents / positions / masks, x
when the embedding is made on the host; the host writes it before a replay. Tap rows are copied into a
device buffer inside the graph and read back after it.

greedy_tokens(token, n, stop) is the device-resident greedy loop: the step graph's argmax becomes the next
step's token in gstate and lands in a ring of mapped host memory, so the host queues up to `ahead` steps
without waiting and reads each token after its event. Steps already queued when a stop token lands still
run: they are counted in n_past (the device state includes them), and only the tokens up to the stop are
returned (a generation ends there; the next one resets the engine).

Prefill GEMMs (prefill_gemm_path, decided once at creation; LUCEBOX_PREFILL_GEMM=auto|own|cublas, the 0.8B
prefill's knob too): "own" runs them 64 columns at a time through the small-N quantized GEMM, in passes of the
profile's run.prefill_rows; "cublas" runs products of at least memory_plan.CUBLAS_MIN_ROWS columns through
lb_gemm_q_cublas (weights dequantized to fp16, then cublasGemmEx) in passes of run.prefill_rows_cublas, with
its scratch in the memory plan; narrower passes (a prompt's tail), verifies and decode steps stay on small-N.
auto is cublas when the library's cuBLAS is loaded (_lib.cublas_ready), else own. On that path the FFN's gate + up
run as one fp16-output GEMM over both (LUCEBOX_PREFILL_GU=merged16, the default) or as two fp32-output GEMMs
(split; prefill_gu_mode, read at creation, info "prefill_gu"), and a mixer's back-to-back input
projections (DeltaNet attn_gate | ssm_beta | ssm_alpha, attention attn_q | attn_k (| attn_v)) as one GEMM read in
place (LUCEBOX_PREFILL_MERGE=on, the default) or one GEMM each (off; info "prefill_merge"). With
prefill_weights="f16" (the argument, else LUCEBOX_PREFILL_WEIGHTS; default "q") every layer matrix is also kept as
fp16 rows, dequantized once at load, and the cuBLAS passes read those (lb_gemm_q_cublas* with LB_QT_F16) instead of
dequantizing per pass: the same fp16 weights, so the same products, for 2 B a weight of device memory (48.7 GB on the
27B, a memory plan item; decode steps and verifies keep reading the quantized bytes). Info "prefill_weights".

What is not built yet, said rather than hidden: logits come back to
the host for every row a sampling (T > 0) caller needs, captured tap features are kept on the host (`features`,
`last_verify_features`, as engines/cpu.py keeps them), prefill and commit are not graphed.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.engines.base import EngineStats, Tree, VerifyResult, check_room, checked_path, checked_tokens
from lucebox_cli.engines.dflash_layers import AttnLayer, Buffers, GdnLayer, Layers, Mat, Pass
from lucebox_cli.engines.dflash_upload import QTYPE_IDS, EmbeddingRows, Entry, arena_bytes, device_bytes, upload_plan
from lucebox_cli.engines.gdn_tree_plan import save_plan
from lucebox_cli.errors import EngineUnavailable, LuceboxError, UsageError

if TYPE_CHECKING:
    from lucebox_cli.gguf_io import GGUFModel

CHUNK = mp.CHUNK
F32 = 4
RING = 64  # tokens of the greedy loop's mapped host ring (> any `ahead`)
AHEAD = 8  # greedy steps the host keeps queued


def graphs_default() -> bool:
    """use_graphs at engine creation: on unless LUCEBOX_GRAPHS=0."""
    return os.environ.get("LUCEBOX_GRAPHS", "1") != "0"


def step_pdl_default(env: Optional[dict] = None) -> bool:
    """Whether the decode-step graph is captured with programmatic dependent launch: LUCEBOX_PDL unset or "step"
    (the default) or "1" (the C library then also launches everything else with it); "0" or anything else: no."""
    v = (os.environ if env is None else env).get("LUCEBOX_PDL", "step")
    return v in ("step", "1")


def attn_decode_path(fused: bool, env: Optional[dict] = None) -> str:
    """How a decode step's attention runs, for the bench rows: 'fused' (lb_attn_decode_fused: one kernel),
    'split' (the same call under LUCEBOX_ATTN_DECODE=split, which the C library reads: prep, attention and
    combine kernels) or 'prep+decode' (a library without the fused entry point: two calls)."""
    if not fused:
        return "prep+decode"
    return "split" if (os.environ if env is None else env).get("LUCEBOX_ATTN_DECODE") == "split" else "fused"


def prefill_gemm_path(lib: Any, env: Optional[dict] = None) -> str:
    """'cublas' or 'own': the 27B prefill's wide GEMMs, from LUCEBOX_PREFILL_GEMM (engines/cublas.py's gemm_mode:
    auto, own or cublas; default auto = cublas when the library's cuBLAS is ready). cublas without a loaded cuBLAS
    is an error, not a fallback."""
    from lucebox_cli.engines import _lib
    from lucebox_cli.engines.cublas import GEMM_ENV, gemm_mode

    mode = gemm_mode(env)
    if mode == "own":
        return "own"
    ready = _lib.cublas_ready(lib)
    if mode == "cublas" and not ready:
        raise EngineUnavailable(f"{GEMM_ENV}=cublas but no cuBLAS is loaded in this library",
                                hint=f"unset {GEMM_ENV} (auto) or set it to own")
    return "cublas" if ready else "own"


PREFILL_GU_ENV = "LUCEBOX_PREFILL_GU"
PREFILL_GU_MODES = ("merged16", "split")
PREFILL_MERGE_ENV = "LUCEBOX_PREFILL_MERGE"
PREFILL_MERGE_MODES = ("on", "off")
PREFILL_WEIGHTS_ENV = "LUCEBOX_PREFILL_WEIGHTS"
PREFILL_WEIGHTS_MODES = ("q", "f16")
F16_QTYPE = 1  # LB_QT_F16: fp16 rows, which lb_gemm_q_cublas* read without dequantizing


def _choice(name: str, modes: tuple[str, ...], env: Optional[dict]) -> str:
    """The value of knob `name` among `modes` (unset or empty: the first); anything else is a UsageError."""
    v = (os.environ if env is None else env).get(name, modes[0]).strip().lower() or modes[0]
    if v not in modes:
        raise UsageError(f"{name}={v!r}: expected one of {', '.join(modes)}")
    return v


def prefill_gu_mode(env: Optional[dict] = None) -> str:
    """LUCEBOX_PREFILL_GU (read once, at engine creation): "merged16" (the default since session 13's measurement:
    Layers._gu_merged16) or "split" (the two fp32-output GEMMs and lb_df_swiglu_f16). Anything else is a
    UsageError."""
    return _choice(PREFILL_GU_ENV, PREFILL_GU_MODES, env)


def prefill_merge_mode(env: Optional[dict] = None) -> str:
    """LUCEBOX_PREFILL_MERGE (read once, at engine creation): "on" (the default: Layers.zab_plan and qkv_plan) or
    "off" (one GEMM per matrix, lb_gdn_prefill and lb_attn_prep on packed outputs). Anything else is a
    UsageError."""
    return _choice(PREFILL_MERGE_ENV, PREFILL_MERGE_MODES, env)


def prefill_weights_mode(value: Optional[str] = None, env: Optional[dict] = None) -> str:
    """What the cuBLAS prefill passes read: "q" (the default: each pass dequantizes every matrix to fp16 in its
    scratch) or "f16" (resident fp16 copies made once at load). `value` (the engine argument) wins over
    LUCEBOX_PREFILL_WEIGHTS; anything else is a UsageError."""
    given = {PREFILL_WEIGHTS_ENV: str(value)} if value is not None else env
    return _choice(PREFILL_WEIGHTS_ENV, PREFILL_WEIGHTS_MODES, given)


def open_gpu(profile: Optional[str] = None) -> tuple[Any, Any]:
    """(lib, profile) for GPU 0, or EngineUnavailable saying why not."""
    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    probe = _lib.probe_gpus()
    if not probe.gpus:
        raise EngineUnavailable(f"the CUDA 27B engine needs an NVIDIA GPU: {probe.reason or 'none found'}",
                                hint="use --engine cpu on this machine")
    prof = resolve_profile(profile, probe.gpus)
    return _lib.load(prof), prof


class _Arena:
    """One device allocation handed out in 256-byte aligned pieces."""

    def __init__(self, lib: Any, nbytes: int):
        self.lib, self.nbytes, self.used = lib, max(int(nbytes), 256), 0
        ptr = ctypes.c_void_p()
        lib.call("lb_dev_alloc", self.nbytes, ctypes.byref(ptr))
        self.base = int(ptr.value)

    def take(self, nbytes: int) -> int:
        at = self.base + self.used
        self.used += (int(nbytes) + 255) // 256 * 256
        if self.used > self.nbytes:
            raise LuceboxError(f"internal: arena overflow ({self.used} > {self.nbytes} bytes)")
        return at

    def free(self) -> None:
        if self.base:
            self.lib.call("lb_dev_free", self.base)
            self.base = 0


class DFlashTargetEngine:
    """Engine protocol (engines/base.py) for qwen35 GGUFs whose shapes the 27B ops take."""

    name = "cuda"

    def __init__(self, gguf: str | Path | GGUFModel, *, profile: Optional[str] = None, max_context: int = 4096,
                 budget: int = 22, tap_layers: Sequence[int] = (), lib: Any = None, prof: Any = None,
                 card_bytes: Optional[int] = None, prefill_rows: Optional[int] = None,
                 prefill_weights: Optional[str] = None):
        from lucebox_cli.gguf_io import GGUFModel
        from lucebox_cli.models.qwen35_gguf import read_model_config

        # a path, or an already open GGUFModel (api.load_model's): blocks are read from its memory map
        self.model = gguf if isinstance(gguf, GGUFModel) else GGUFModel(gguf)
        self.cfg = cfg = read_model_config(self.model)
        self.tap_layers = tuple(int(t) for t in tap_layers)
        if any(not 0 <= t < cfg.n_layers for t in self.tap_layers):
            raise UsageError(f"tap layers {list(self.tap_layers)} outside 0..{cfg.n_layers - 1}")
        self.max_context, self.budget = int(max_context), int(budget)
        entries = upload_plan(self.model, cfg)  # refuses unsupported shapes / types before any GPU work
        if lib is None:
            lib, prof = open_gpu(profile)
        self.lib, self.profile = lib, prof
        # rows of one prefill pass: the argument, else the profile's run.prefill_rows (run.prefill_rows_cublas
        # with the cuBLAS GEMMs, when it says), else 64
        run = getattr(prof, "run", None)
        cublas = prefill_gemm_path(lib) == "cublas"
        rows = getattr(run, "prefill_rows_cublas", None) if cublas else None
        self.prefill_rows = mp.check_prefill_rows(prefill_rows or rows or getattr(run, "prefill_rows",
                                                                                  mp.PREFILL_ROWS))
        # the path is on only where a pass can be wide enough for it (else it costs no scratch)
        self.prefill_gemm = "cublas" if mp.cublas_on(cublas, self.prefill_rows) else "own"
        self.prefill_weights = prefill_weights_mode(prefill_weights)
        if self.prefill_weights == "f16" and self.prefill_gemm != "cublas":
            # the copies would be read by nothing: only a cuBLAS pass (rows >= CUBLAS_MIN_ROWS) takes them
            raise UsageError(f"prefill weights f16 need the cuBLAS prefill path (this engine's is {self.prefill_gemm!r}: "
                             f"{'no cuBLAS loaded' if not cublas else f'passes of {self.prefill_rows} rows'})",
                             hint=f"unset {PREFILL_WEIGHTS_ENV}, or use a card whose profile runs cuBLAS prefill passes")
        self.plan = mp.plan(cfg, self.model, context=self.max_context, budget=self.budget,
                            prefill_rows=self.prefill_rows, cublas=self.prefill_gemm == "cublas",
                            prefill_f16=self.prefill_weights == "f16")
        card = card_bytes if card_bytes is not None else int(lib.device_props(0)["total_mem_bytes"])
        mp.fit(self.plan, card, getattr(prof, "name", "") or f"{card / 1e9:.0f} GB")
        self.stats = EngineStats()
        self._arenas: list[_Arena] = []
        self._stream: Optional[int] = None
        self._graphs: dict[tuple, int] = {}
        self._events: list[int] = []
        self._ring = 0
        self._emb_dev: Optional[Mat] = None
        self._use_graphs, self._graph_ready, self._card = False, False, card
        self.prefill_gu = prefill_gu_mode()  # before any upload: a bad value fails at once
        self.prefill_merge = prefill_merge_mode()
        self.step_pdl = step_pdl_default()  # read before the first capture (the step graph's)
        try:
            mats, vecs = self._upload(entries)
            mats16 = self._upload_f16(mats) if self.prefill_weights == "f16" else None
            self._bufs = self._carve(mats)
            self._stream = self._new_stream()
            self._layers = Layers(lib, cfg, mats, vecs, self._bufs, self.max_context, self._stream,
                                  prefill_gu=self.prefill_gu, prefill_merge=self.prefill_merge, mats16=mats16)
            self._tied_emb = mats.get("token_embd.weight")
            self.use_graphs = graphs_default() and self._graphs_supported()
        except BaseException:
            self.close()
            raise
        self._embed = EmbeddingRows(self.model, cfg)
        self.info = {"weight_bytes": arena_bytes(entries), "plan_bytes": self.plan.total, "budget": self.budget,
                     "max_context": self.max_context, "upload_s": round(self.load_s, 2),
                     "cuda_graphs": self.use_graphs, "prefill_gemm": self.prefill_gemm,
                     # the cuBLAS path's gate + up as run: "split" | "merged16" (merged16 asked for but some layer's
                     # gate / up not one tensor: "merged16-partial"; None: no cuBLAS pass)
                     "prefill_gu": self._gu_info() if self.prefill_gemm == "cublas" else None,
                     # the step graph asks for PDL (the library applies it on sm_90 and newer only)
                     "step_pdl": self.step_pdl and self.use_graphs,
                     "prefill_rows": self.prefill_rows,
                     # the cuBLAS path's mixer input GEMMs (Layers.zab_plan / qkv_plan; each also needs its
                     # library entry, and the DeltaNet's the tensor-core path); None: no cuBLAS pass
                     "prefill_merge": self.prefill_merge if self.prefill_gemm == "cublas" else None,
                     # what the cuBLAS passes read: "q" (dequantized per pass) or "f16" (resident copies)
                     "prefill_weights": self.prefill_weights if self.prefill_gemm == "cublas" else None,
                     # in every bench row: a run says how it was made
                     "attn_decode": attn_decode_path(self._layers.fused_decode),
                     "q4k_tile": any(e.tiled and e.ggml_type == "Q4_K" for e in entries),
                     "q6k_tile": any(e.tiled and e.ggml_type == "Q6_K" for e in entries)}
        self.last_verify_ms: Optional[float] = None
        self.reset()

    def _gu_info(self) -> str:
        """info["prefill_gu"]: the mode LUCEBOX_PREFILL_GU asked for, as the layers will run it."""
        if self.prefill_gu != "merged16":
            return self.prefill_gu
        L = self._layers
        merged = [L._gu_merged((f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"))
                  for i in range(self.cfg.n_layers)]
        return "merged16" if all(merged) else "merged16-partial" if any(merged) else "split"

    # -- setup --

    def _upload(self, entries) -> tuple[dict[str, Mat], dict[str, int]]:
        t0 = time.perf_counter()
        arena = _Arena(self.lib, arena_bytes(entries))
        self._arenas.append(arena)
        mats, vecs = {}, {}
        for e, data in _prepared(self.model, entries):
            ptr = arena.take(e.nbytes)
            assert ptr == arena.base + e.offset
            self.lib.call("lb_dev_h2d", ptr, data.ctypes.data, data.nbytes)
            if e.qtype:
                mats[e.name] = Mat(ptr, e.qtype, e.shape[0], e.shape[1])
            else:
                vecs[e.name] = ptr
        self.load_s = time.perf_counter() - t0
        return mats, vecs

    def _upload_f16(self, mats: dict[str, Mat]) -> dict[str, Mat]:
        """fp16 copies of every layer matrix (blk.*), dequantized on the device by lb_dequant_f16 (the function each
        cuBLAS pass runs otherwise, so the values are the same), laid out in the quantized arena's order with no gaps
        (2·rows·k bytes, a multiple of 512): tensors back to back there are back to back here, so the merged GEMMs
        (Layers._adjacent) read them as one. Their time counts in load_s."""
        t0 = time.perf_counter()
        names = sorted((n for n in mats if n.startswith("blk.")), key=lambda n: mats[n].ptr)
        total = sum(2 * mats[n].rows * mats[n].k for n in names)
        if total != self.plan.bytes_of("prefill f16 weights"):
            raise LuceboxError(f"internal: the plan's prefill f16 weights are {self.plan.bytes_of('prefill f16 weights')}"
                               f" bytes, the layer matrices need {total}")
        arena = _Arena(self.lib, total)
        self._arenas.append(arena)
        out = {}
        for n in names:
            m = mats[n]
            ptr = arena.take(2 * m.rows * m.k)
            self.lib.call("lb_dequant_f16", m.qtype, m.ptr, m.rows, m.k, 0, m.rows, ptr, None)
            out[n] = Mat(ptr, F16_QTYPE, m.rows, m.k)
        self.lib.call("lb_dev_sync")
        self.load_s += time.perf_counter() - t0
        return out

    def _carve(self, mats: dict[str, Mat]) -> Buffers:
        cfg = self.cfg
        blist = mp.buffer_list(cfg, context=self.max_context, budget=self.budget, prefill_rows=self.prefill_rows,
                               cublas=self.prefill_gemm == "cublas")
        self._check_scratch_sizes(blist, mats)
        arena = _Arena(self.lib, sum(b.nbytes for b in blist))
        self._arenas.append(arena)
        ptr = {b.name: arena.take(b.nbytes) for b in blist}
        self._scratch = [(ptr[b.name], b.nbytes) for b in blist if b.scratch]
        # zeroed by reset(): the recurrent states, and the fused decode attention's tickets (its kernel leaves them
        # zero; zeroing them again undoes a launch that failed half way)
        self._state = [(ptr[b.name], b.nbytes) for b in blist
                       if b.category in ("deltanet_state", "conv_state") or b.name == "attn_tickets"]
        bufs = Buffers(**{k: ptr[k] for k in ("x", "h", "proj", "act", "qf", "gdn_scratch", "tree_q", "tree_o",
                                              "saves", "partials", "logits", "topk_scratch", "topk_ids", "parents", "positions", "masks", "path")})
        if "gemm_scratch" in ptr:  # lb_gemm_q_cublas's scratch (the cuBLAS prefill GEMMs)
            sizes = {b.name: b.nbytes for b in blist}
            bufs.gemm_scratch, bufs.gemm_scratch_bytes = ptr["gemm_scratch"], sizes["gemm_scratch"]
        bufs.tickets = ptr["attn_tickets"]
        self._gstate, self._tokbuf = ptr["gstate"], ptr["tokens"]
        # parents .. tokens sit back to back (buffer_list's order): a verify uploads them in one copy
        index = [b for b in blist if b.category == "tree_index"]
        self._index_span = (ptr[index[0].name], sum(b.nbytes for b in index), {b.name: ptr[b.name] - ptr[index[0].name]
                                                                              for b in index})
        assert ptr[index[-1].name] + index[-1].nbytes - ptr[index[0].name] == self._index_span[1], "tree index not packed"
        for i in range(cfg.n_layers):
            if cfg.is_attention(i):
                bufs.attn[i] = AttnLayer(ptr[f"k_cache.{i}"], ptr[f"v_cache.{i}"])
            else:
                bufs.gdn[i] = GdnLayer(ptr[f"state.{i}"], ptr[f"conv.{i}"], *(ptr[f"tree_{n}.{i}"] for n in
                                                                              ("pre", "k", "v", "g", "beta")))
        return bufs

    def _new_stream(self) -> Optional[int]:
        """The engine's stream (None, the legacy stream, where the library has no lb_stream_create)."""
        if not hasattr(self.lib.fn, "lb_stream_create"):
            return None
        ptr = ctypes.c_void_p()
        self.lib.call("lb_stream_create", ctypes.byref(ptr))
        return ptr.value

    def _graphs_supported(self) -> bool:
        fn = getattr(self.lib, "fn", None)
        return self._stream is not None and fn is not None and hasattr(fn, "lb_graph_begin")

    @property
    def use_graphs(self) -> bool:
        """Decode steps and verifies replay CUDA graphs (default on; LUCEBOX_GRAPHS=0 at creation: off)."""
        return self._use_graphs

    @use_graphs.setter
    def use_graphs(self, on: bool) -> None:
        if on and not self._graphs_supported():
            raise EngineUnavailable("this library or engine has no CUDA graphs (lb_graph_begin, an own stream)")
        if on and not self._graph_ready:
            self._graph_setup()
        self._use_graphs = bool(on)
        if hasattr(self, "info"):
            self.info["cuda_graphs"] = self._use_graphs

    def _graph_setup(self) -> None:
        """What the captured passes need besides the plan's buffers (once): the state pointer, a device buffer
        for tap rows, the mapped ring, and token_embd on the device for the greedy loop (the tied LM head is
        it; an untied one is uploaded when the card has room past the plan, else the loop stays off)."""
        self._graph_ready = True
        L, cfg, card = self._layers, self.cfg, self._card
        L.state = self._gstate
        if self.tap_layers:
            taps = _Arena(self.lib, len(self.tap_layers) * CHUNK * cfg.hidden * F32)
            self._arenas.append(taps)
            self._scratch.append((taps.base, taps.nbytes))  # poisoned with the rest by the tests
            L.tap_buf = taps.base
        ring = ctypes.c_void_p()
        self.lib.call("lb_host_alloc", RING * 4, ctypes.byref(ring))
        self._ring = int(ring.value)
        self._ring_view = np.ctypeslib.as_array((ctypes.c_int32 * RING).from_address(self._ring))
        if cfg.tied:
            self._emb_dev = self._tied_emb
            return
        info = self.model.tensor_info("token_embd.weight")
        if info.ggml_type not in QTYPE_IDS or cfg.hidden % 256 or card - self.plan.total < int(info.nbytes):
            return
        e = Entry("token_embd.weight", info.ggml_type, tuple(info.shape), int(info.nbytes), 0)
        arena = _Arena(self.lib, e.nbytes)
        self._arenas.append(arena)
        self._h2d(arena.base, np.ascontiguousarray(device_bytes(e, self.model.raw(e.name))))
        self._emb_dev = Mat(arena.base, e.qtype, cfg.vocab, cfg.hidden)

    def _check_scratch_sizes(self, blist, mats: dict[str, Mat]) -> None:
        """The plan's copies of the ops' scratch formulas must cover what the library asks for."""
        fn = getattr(self.lib, "fn", None)
        if fn is None or not hasattr(fn, "lb_gdn_prefill_scratch_bytes"):
            return
        cfg, have = self.cfg, {b.name: b.nbytes for b in blist}
        rows = self.prefill_rows
        need = {"gdn_scratch": max(fn.lb_gdn_prefill_scratch_bytes(rows, cfg.hk, cfg.hv),
                                   fn.lb_gdn_step_scratch_bytes(1, cfg.hk, cfg.hv)),
                "partials": max(fn.lb_attn_partials_bytes(1, cfg.n_heads, mp.ATTN_SPLITS_ONE),
                                fn.lb_attn_partials_bytes(rows, cfg.n_heads, mp.ATTN_SPLITS_MANY))}
        if "gemm_scratch" in have and hasattr(fn, "lb_gemm_q_cublas_scratch_bytes"):
            # every layer matrix (not the LM head: its prefill product is one row) dequantized in one chunk
            need["gemm_scratch"] = max(fn.lb_gemm_q_cublas_scratch_bytes(rows, m.k, m.rows)
                                       for name, m in mats.items() if name.startswith("blk."))
        for name, n in need.items():
            if n > have[name]:
                raise LuceboxError(f"internal: the memory plan gives {name} {have[name]} bytes, the ops need {n}")

    # -- protocol --

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def features(self) -> np.ndarray:
        """[n_past, len(taps)·hidden] residual stream after the tap layers (host copy)."""
        width = len(self.tap_layers) * self.cfg.hidden
        if not self._feats:
            return np.zeros((0, width), np.float32)
        return np.concatenate(self._feats, axis=0)

    def reset(self) -> None:
        for ptr, nbytes in self._state:
            self.lib.call("lb_dev_memset", ptr, 0, nbytes)
        self._n_past = 0
        self._pending: Optional[Tree] = None
        self._feats: list[np.ndarray] = []
        self.last_verify_features: Optional[np.ndarray] = None

    def close(self) -> None:
        for exe in getattr(self, "_graphs", {}).values():
            self.lib.call("lb_graph_destroy", exe)
        self._graphs = {}
        for ev in getattr(self, "_events", []):
            self.lib.call("lb_event_destroy", ev)
        self._events = []
        if getattr(self, "_ring", 0):
            self.lib.call("lb_host_free", self._ring)
            self._ring = 0
        for a in getattr(self, "_arenas", []):
            a.free()  # cudaFree waits for the queued kernels that use the memory
        self._arenas = []
        if getattr(self, "_stream", None):
            self.lib.call("lb_stream_destroy", self._stream)
            self._stream = None
        self._closed = True

    def poison(self) -> None:
        """Fill every scratch buffer with NaN bytes (tests: results must not read stale scratch)."""
        for ptr, nbytes in self._scratch:
            self.lib.call("lb_dev_memset", ptr, 0xFF, nbytes)

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append tokens in passes of prefill_rows rows; float32 logits [V] of the last one."""
        tokens = self._tokens(token_ids)
        self._check_room(tokens.size)
        self._pending, self.last_verify_features = None, None
        for c0 in range(0, tokens.size, self.prefill_rows):
            chunk = tokens[c0 : c0 + self.prefill_rows]
            self._forward(chunk, Pass("prefill", chunk.size, self._n_past), keep=True)
            self._n_past += chunk.size
        self.stats.prefill_tokens += tokens.size
        self.stats.committed = self._n_past
        return self._logits(chunk.size - 1, 1)[0]

    def step(self, token_id: int) -> np.ndarray:
        """One decode step; float32 logits [V] for the next position."""
        if self.use_graphs:
            self._step_graph(token_id)  # the graph ran the LM head (and the argmax) already
            return self._d2h(self._bufs.logits, np.float32, (1, self.cfg.vocab))[0]
        self._decode_one(token_id)
        return self._logits(0, 1)[0]

    def step_argmax(self, token_id: int) -> int:
        """One decode step, greedy: the next token id (argmax on the device; no logits copied)."""
        if self.use_graphs:
            self._step_graph(token_id)
            return int(self._d2h(self._bufs.topk_ids, np.int32, (1,))[0])
        self._decode_one(token_id)
        return int(self._topk(0, 1, 1)[0, 0])

    def greedy_tokens(self, token_id: int, max_steps: int, stop_ids: Sequence[int] = (),
                      ahead: int = AHEAD) -> Iterator[int]:
        """Greedy decode from token_id: yields each step's argmax, up to max_steps of them, ending after the
        first one in stop_ids. The same tokens as step_argmax in a loop; with graphs, the device embedding
        and no tap layers, the device-resident loop (the module docstring): up to `ahead` steps queued,
        each token read after its event. Close the generator (or run it out) before using the engine
        again: that is when queued steps are waited for and counted in n_past."""
        tok = int(self._tokens([token_id])[0])
        n, stop = int(max_steps), frozenset(int(t) for t in stop_ids)
        if n <= 0:
            return
        self._check_room(n)
        if not (self.use_graphs and self._emb_dev is not None and not self.tap_layers):
            for _ in range(n):
                tok = self.step_argmax(tok)
                yield tok
                if tok in stop:
                    return
            return
        if not 1 <= ahead < RING:
            raise UsageError(f"ahead {ahead} outside 1..{RING - 1}")
        self._pending, self.last_verify_features = None, None
        exe = self._step_exec()
        events = self._event_pool(ahead)
        self._set_state(self._n_past, tok)
        queued = done = 0

        def launch() -> None:
            nonlocal queued
            self.lib.call("lb_graph_launch", exe, self._stream)
            self.lib.call("lb_event_record", events[queued % ahead], self._stream)
            queued += 1

        try:
            while queued < min(n, ahead):
                launch()
            while done < queued:
                self.lib.call("lb_event_sync", events[done % ahead])
                tok = int(self._ring_view[done % RING])
                done += 1
                if tok not in stop and queued < n:
                    launch()  # reuses the event of step `done - 1`, already waited for
                yield tok
                if tok in stop:
                    return
        finally:
            if queued > done:
                self.lib.call("lb_event_sync", events[(queued - 1) % ahead])
            self._n_past += queued
            self.stats.decode_steps += queued
            self.stats.committed = self._n_past

    def _decode_one(self, token_id: int) -> None:
        """Run one token through the model and commit it; its logits stay on the device."""
        tokens = self._tokens([token_id])
        self._check_room(1)
        self._pending, self.last_verify_features = None, None
        self._forward(tokens, Pass("step", 1, self._n_past), keep=True)
        self._n_past += 1
        self.stats.decode_steps += 1
        self.stats.committed = self._n_past

    def verify_argmax(self, tree: Tree) -> VerifyResult:
        """verify(tree, want_logits=False): argmax per slot computed on the device, logits None."""
        return self.verify(tree, want_logits=False)

    # -- graphs --

    def _set_state(self, n_past: int, token: int) -> None:
        """gstate = {n_past, token, 0} before a replay (a blocking copy: ordered after the queued work)."""
        self._h2d(self._gstate, np.asarray([n_past, token, 0, 0], np.int32))

    def _graph(self, key: tuple, issue: Any, pdl: bool = False) -> int:
        """The executable graph of `key`, captured on first use; pdl: its kernels carry the PDL attribute (the C
        library's switch is turned on for the capture only, so nothing else this process launches changes)."""
        exe = self._graphs.get(key)
        if exe is None:
            set_pdl = getattr(self.lib.fn, "lb_set_pdl", None) if pdl else None
            prev = set_pdl(1) if set_pdl is not None else None
            try:
                exe = self._graphs[key] = self._layers.capture(issue)
            finally:
                if prev is not None:
                    set_pdl(prev)
        return exe

    def _step_exec(self) -> int:
        """The decode step's graph: [embedding of gstate's token], layers, head, argmax, greedy tail."""
        L = self._layers

        def issue() -> None:
            if self._emb_dev is not None:
                L.issue_embed(self._emb_dev, self._gstate + 4, 1)
            L.issue_graph_pass(Pass("step", 1, 0, dev=True), self.tap_layers)
            L.issue_head(0, 1)
            L.issue_topk(1, 1)
            L.issue_advance(self._ring, RING)

        return self._graph(("step", self._emb_dev is not None), issue, pdl=self.step_pdl)

    def _tree_exec(self, n: int) -> int:
        """The verify of n slots: layers (DeltaNet saves bounded by the buffer's capacity) and the head."""
        L = self._layers

        def issue() -> None:
            L.issue_graph_pass(Pass("tree", n, 0, max(self.budget, 1), dev=True), self.tap_layers)
            L.issue_head(0, n)

        return self._graph(("tree", n), issue)

    def _event_pool(self, n: int) -> list[int]:
        while len(self._events) < n:
            ev = ctypes.c_void_p()
            self.lib.call("lb_event_create", ctypes.byref(ev))
            self._events.append(int(ev.value))
        return self._events[:n]

    def _tap_rows(self, t: int) -> Optional[np.ndarray]:
        """[t, len(taps) * hidden] tap rows a replay copied to the tap buffer (None without taps)."""
        if not self.tap_layers:
            return None
        taps, hid = self.tap_layers, self.cfg.hidden
        buf = self._d2h(self._layers.tap_buf, np.float32, (len(taps), CHUNK, hid))
        return np.concatenate([buf[taps.index(i), :t] for i in taps], axis=-1)

    def _step_graph(self, token_id: int) -> None:
        """One decode step by replay (head and top-1 included), committed like _decode_one."""
        tokens = self._tokens([token_id])
        self._check_room(1)
        self._pending, self.last_verify_features = None, None
        self._set_state(self._n_past, int(tokens[0]))
        if self._emb_dev is None:
            self._h2d(self._bufs.x, self._embed(tokens))
        self.lib.call("lb_graph_launch", self._step_exec(), self._stream)
        if self.tap_layers:
            self._feats.append(self._tap_rows(1))
        self._n_past += 1
        self.stats.decode_steps += 1
        self.stats.committed = self._n_past

    def verify(self, tree: Tree, *, want_logits: bool = True) -> VerifyResult:
        """All slots in one pass (small-N projections, DeltaNet along parents, attention under the mask).

        want_logits=False (greedy callers) leaves the [N, V] logits on the device and returns only the
        argmax ids (VerifyResult.logits None)."""
        tokens = self._tokens(tree.tokens)
        n = tree.size
        if n > self.budget + 1:
            raise UsageError(f"a tree of {n} slots exceeds this engine's budget {self.budget} (+ root)",
                             hint="open the engine with a larger budget (at most 63)")
        self._check_room(n)
        t0 = time.perf_counter()
        self._pending = None
        if self.use_graphs:
            self._upload_index(tree, tokens)  # the token ids included
            self._embed_x(tokens, ids_uploaded=True)
            self.lib.call("lb_graph_launch", self._tree_exec(n), self._stream)
            self.last_verify_features = self._tap_rows(n)
            if want_logits:
                logits = self._d2h(self._bufs.logits, np.float32, (n, self.cfg.vocab))
                argmax = np.argmax(logits, axis=-1).astype(np.int64)
            else:
                logits, argmax = None, self.device_topk(n, 1)[:, 0]
        else:
            max_saves = self._upload_tree(tree)
            self.last_verify_features = self._forward(tokens, Pass("tree", n, self._n_past, max_saves), keep=False)
            if want_logits:
                logits = self._logits(0, n)
                argmax = np.argmax(logits, axis=-1).astype(np.int64)
            else:
                logits, argmax = None, self._topk(0, n, 1)[:, 0]
        self._pending = tree
        self.last_verify_ms = (time.perf_counter() - t0) * 1e3
        self.stats.verify_calls += 1
        return VerifyResult(argmax=argmax, logits=logits)

    def commit(self, accepted_slots: Sequence[int]) -> None:
        path = self._check_path(accepted_slots)
        n = len(path)
        self._h2d(self._bufs.path, np.asarray(path, dtype=np.int32))
        self._layers.commit(n, self._n_past)
        if self.last_verify_features is not None:
            self._feats.append(self.last_verify_features[path].copy())
        self._n_past += n
        self.stats.committed = self._n_past
        self._pending = None

    # -- internals --

    def _tokens(self, token_ids: Sequence[int]) -> np.ndarray:
        if getattr(self, "_closed", False):
            raise EngineUnavailable("this CUDA engine was closed")
        return checked_tokens(token_ids, self.cfg.vocab)

    def _check_room(self, n: int) -> None:
        check_room(self._n_past, n, self.max_context)

    def _check_path(self, accepted_slots: Sequence[int]) -> list[int]:
        return checked_path(self._pending, accepted_slots)

    def _h2d(self, ptr: int, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        self.lib.call("lb_dev_h2d", ptr, a.ctypes.data, a.nbytes)

    def _d2h(self, ptr: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        self.lib.call("lb_dev_d2h", out.ctypes.data, ptr, out.nbytes)
        return out

    def _upload_tree(self, tree: Tree) -> int:
        """parents, positions (n_past + depth), ancestor bit masks to the device; returns the save count."""
        b = self._bufs
        self._h2d(b.parents, tree.parents.astype(np.int32))
        self._h2d(b.positions, (self._n_past + tree.depth).astype(np.int32))
        self._h2d(b.masks, tree_mask_bits(tree))
        return int((save_plan(tree.parents) >= 0).sum())

    def _upload_index(self, tree: Tree, tokens: np.ndarray) -> None:
        """A graph verify's inputs in one copy: parents, positions (n_past + depth), masks, gstate's n_past and
        the token ids (the packed tree-index buffers; path is overwritten, commit uploads it again)."""
        base, nbytes, off = self._index_span
        n = tree.size
        stage = np.zeros(nbytes, np.uint8)

        def put(name: str, a: np.ndarray) -> None:
            a = np.ascontiguousarray(a)
            stage[off[name] : off[name] + a.nbytes] = a.view(np.uint8).reshape(-1)

        put("parents", tree.parents.astype(np.int32))
        put("positions", (self._n_past + tree.depth).astype(np.int32))
        put("masks", tree_mask_bits(tree))
        put("gstate", np.asarray([self._n_past, 0, 0, 0], np.int32))
        put("tokens", tokens[:n].astype(np.int32))
        self._h2d(base, stage)

    def _embed_x(self, tokens: np.ndarray, ids_uploaded: bool = False) -> None:
        """x[0..t) = the tokens' embedding rows: lb_df_embed_q when token_embd is on the device (the host
        dequantizes ~1.4 ms per 23 Q4_K rows of the 27B), else rows dequantized on the host. ids_uploaded:
        the ids are in the token buffer already (a graph verify copies them with the tree's index)."""
        if self._emb_dev is not None:
            if not ids_uploaded:
                self._h2d(self._tokbuf, tokens.astype(np.int32))
            self._layers.issue_embed(self._emb_dev, self._tokbuf, tokens.size)
        else:
            self._h2d(self._bufs.x, self._embed(tokens))

    def _forward(self, tokens: np.ndarray, p: Pass, keep: bool) -> Optional[np.ndarray]:
        """Embed, run every layer; tap rows go to the committed features (keep) or are returned."""
        self._embed_x(tokens)
        taps: dict[int, np.ndarray] = {}

        def on_tap(i: int) -> None:
            taps[i] = self._d2h(self._bufs.x, np.float32, (p.t, self.cfg.hidden))

        self._layers.run(p, self.tap_layers, on_tap)
        if not self.tap_layers:
            return None
        feats = np.concatenate([taps[i] for i in self.tap_layers], axis=-1)
        if keep:
            self._feats.append(feats)
        return feats

    def _logits(self, row0: int, n: int) -> np.ndarray:
        self._layers.head(row0, n)
        return self._d2h(self._bufs.logits, np.float32, (n, self.cfg.vocab))

    def _topk(self, row0: int, n: int, k: int) -> np.ndarray:
        """[n, k] int64: the LM head of rows row0.. on the device, then its k best ids per row, best first."""
        self._layers.head(row0, n)
        return self.device_topk(n, k)

    def device_topk(self, n: int, k: int) -> np.ndarray:
        """[n, k] int64 top-k ids (k <= 8) of the first n rows already in the device logits buffer (the last
        call's; tests compare it with that call's host logits, the draft will read top-K from here)."""
        if not 1 <= n <= CHUNK or not 1 <= k <= mp.TOPK_MAX_K:
            raise UsageError(f"device top-k takes 1..{CHUNK} rows and k in 1..{mp.TOPK_MAX_K}")
        self._layers.topk(n, k)
        return self._d2h(self._bufs.topk_ids, np.int32, (n, k)).astype(np.int64)


def _prepared(model: Any, entries: list, workers: Optional[int] = None) -> Iterator[tuple[Any, np.ndarray]]:
    """(entry, device-layout bytes) in arena order, as dflash_upload.iter_device_tensors gives them, but
    read from the memory map and repacked (Q6_K / Q8_0) on worker threads a few tensors ahead, while the
    caller copies the current one to the device: numpy's copies and ctypes calls release the GIL, and the
    repack of the 4.45 GB of Q6_K in a 27B Q4_K_M takes ~75 s on one core of the dev box."""
    workers = workers or min(8, os.cpu_count() or 1)

    def prep(e: Any) -> np.ndarray:
        return np.ascontiguousarray(device_bytes(e, model.raw(e.name)))

    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        todo = iter(entries)
        ahead = deque((e, pool.submit(prep, e)) for e in itertools.islice(todo, 2 * workers))
        while ahead:
            e, fut = ahead.popleft()
            for nxt in itertools.islice(todo, 1):
                ahead.append((nxt, pool.submit(prep, nxt)))
            yield e, fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def tree_mask_bits(tree: Tree) -> np.ndarray:
    """[N] uint64: bit j of entry i set iff slot j is slot i or one of its ancestors (lb_attn_tree's masks)."""
    anc = tree.ancestor_mask()
    weights = np.left_shift(np.uint64(1), np.arange(tree.size, dtype=np.uint64))
    return np.bitwise_or.reduce(np.where(anc, weights[None, :], np.uint64(0)), axis=1).astype(np.uint64)
