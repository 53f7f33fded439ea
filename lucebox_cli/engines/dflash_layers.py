"""The 27B target's forward pass as a sequence of C API calls (engines/dflash.py drives it).

One pass runs t rows through every layer: a prefill pass of up to prefill_rows rows (chunked DeltaNet,
causal attention; the profile's run.prefill_rows, 64 by default),
one decode step (recurrent DeltaNet, split-KV attention) or the slots of a tree (DeltaNet along parent
links keeping per-slot inputs for commit, attention under the ancestor mask). Per layer, as
engines/cpu.py computes it:

    h = RMSNorm1p(x, attn_norm); x += Mixer(h); h = RMSNorm1p(x, post_attention_norm);
    x += down(SiLU(gate h) * up h)

Projections read quantized weights (lb_gemv_q for one row, lb_gemm_q_smalln for 2..64 rows, 64 columns at
a time above that; with the cuBLAS prefill GEMM on (`Buffers.gemm_scratch`), lb_gemm_q_cublas for passes of
at least memory_plan.CUBLAS_MIN_ROWS rows, one call per matrix; outputs [t, rows] token-major) and every one of
them accumulates (accumulate = 1): the output projections of
the mixer and the MLP add straight into x, which is the residual add, and the projections that write a
fresh output (the mixer's and the MLP's inputs, the LM head) add onto zeros that the RMSNorm before
them cleared in its own launch (lb_df_rmsnorm's zero ranges), so no cudaMemsetAsync and its launch
gap sits between the norm and the matmuls. For that the outputs of one group sit back to back: the
regions of the projection buffer are packed for the pass's t rows (`_regions`, each start 256-byte
aligned), so one range covers them; a verify's DeltaNet qkv goes to the layer's kept inputs (t_pre),
the second range. Buffers are carved once by engines/dflash.py from memory_plan.target_buffers (proj
holds prefill_rows rows of the widest group, which bounds the packed regions of every pass; the logits and
the tree index hold CHUNK rows: a prefill needs the last row's logits only, a verify at most CHUNK slots).

Every call takes the engine's stream (`stream`, from lb_stream_create; None: the legacy stream), so
that kernels launched with programmatic dependent launch overlap their boundaries (lb_pdl.cuh).

Host overhead: a decode step of the 27B is ~770 C calls. The methods below are the reference issue
order; they run once per (mode, t) in a recording pass with the position-dependent values (n_past, a
tree's save count) as `Sym` placeholders, and the record becomes a `Program`: per layer, the ctypes
function objects with their argument tuples prebuilt, only the placeholder slots patched per call, and
the status tested inline (lib.check only on failure). That removed the per-call getattr, f-string names,
dict lookups and method frames: host time per 64-layer step 1.25 → 0.60 ms over the stub C API of
tests/unit/dflash_fake_lib.py (docs/perf.md, "27B target engine").
`use_programs = False` issues the same calls one by one (tests compare the two call streams).

CUDA graphs (`capture`): a decode step and a verify of t slots are also captured once and replayed with
one launch. A captured pass is issued with `Pass.dev` set: the attention ops then read n_past from the
device (`state`, int32 {n_past, token, steps} that the engine keeps; lb_attn_*_at), the verify's
DeltaNet takes the saves buffer's capacity as max_saves (the kernel plans the saves from the parents on
the device; a larger bound only sizes its shared memory), and tap layers copy x into `tap_buf` in the
stream instead of calling back to the host. Everything else in the call list is already the same at
every call of the same (mode, t).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Optional

from lucebox_cli.engines.dflash_upload import Q4K_TILED, Q6K_TILED
from lucebox_cli.engines.memory_plan import ATTN_SPLITS_MANY, ATTN_SPLITS_ONE, CHUNK, CUBLAS_MIN_ROWS
from lucebox_cli.models.qwen35 import Qwen35Config

F32 = 4
KV_F16 = 0
# bytes per 256 weights of the types whose device layout is one block stream per tensor, so that back-to-back
# tensors are one tensor of their summed rows: Q4_K, Q5_K (the GGUF bytes), tiled Q4_K (268: whole 16-row tiles)
_ROW_BYTES_PER_256 = {12: 144, 13: 176, 268: 144}


@dataclass(frozen=True)
class Mat:
    """A device matrix [rows, k] in the device layout of its qtype."""

    ptr: int
    qtype: int
    rows: int
    k: int


@dataclass
class GdnLayer:
    state: int  # [Hv, 128, 128] fp32
    conv: int  # [3, C] fp32
    # a verify's per-slot inputs, kept until commit: pre [S, C], k [S, Hk*128], v [S, Hv*128], g, beta [S, Hv]
    t_pre: int = 0
    t_k: int = 0
    t_v: int = 0
    t_g: int = 0
    t_beta: int = 0


@dataclass
class AttnLayer:
    kc: int  # [n_kv, max_ctx, 256] f16
    vc: int


@dataclass
class Buffers:
    """Device pointers (ints) of the scratch every pass shares."""

    x: int  # residual stream [prefill_rows, hidden]
    h: int  # normed input [prefill_rows, hidden]
    proj: int  # projections: a group's outputs packed for t rows (_regions), room for prefill_rows rows
    act: int  # mixer / MLP output before its out-projection [prefill_rows, width]
    qf: int  # attention queries after norm + RoPE [prefill_rows, nh, 256]
    gdn_scratch: int
    tree_q: int  # [S, Hk*128]
    tree_o: int  # [S, Hv*128]
    saves: int
    partials: int
    logits: int  # [CHUNK, vocab]
    topk_scratch: int  # lb_df_topk scratch for CHUNK rows, k <= 8
    topk_ids: int  # int32 [CHUNK, 8]
    parents: int  # int32 [CHUNK]
    positions: int  # int32 [CHUNK]
    masks: int  # uint64 [CHUNK]
    path: int  # int32 [CHUNK]
    gdn: dict[int, GdnLayer] = field(default_factory=dict)
    attn: dict[int, AttnLayer] = field(default_factory=dict)
    # lb_gemm_q_cublas's scratch (0: the cuBLAS prefill GEMM is off)
    gemm_scratch: int = 0
    gemm_scratch_bytes: int = 0
    # uint32 [n_kv] tickets of lb_attn_decode_fused (0: none; decode steps then issue prep + decode)
    tickets: int = 0


@dataclass(frozen=True)
class Pass:
    """How this pass treats its t rows: mode "prefill" | "step" | "tree"; pos0 = n_past."""

    mode: str
    t: int
    pos0: int
    max_saves: int = 0
    dev: bool = False  # positions from the device state (a captured pass; pos0 unused)


class Sym:
    """A call argument known only when the pass runs (`key` looked up then, plus `add`)."""

    __slots__ = ("key", "add")

    def __init__(self, key: str, add: int = 0):
        self.key, self.add = key, add

    def __add__(self, k: int) -> "Sym":
        return Sym(self.key, self.add + int(k))

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"Sym({self.key!r}{f' + {self.add}' if self.add else ''})"


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _regions(base: int, t: int, widths: tuple[int, ...], align: int = 256) -> tuple[list[int], int]:
    """Start addresses of regions of t rows of each width (floats) packed from base, each start `align`-byte
    aligned, and the bytes from base to the end of the last one (the range one zeroing clears)."""
    starts, at = [], 0
    for w in widths:
        at = (at + align - 1) // align * align
        starts.append(base + at)
        at += t * w * F32
    return starts, at


def _host_array(ctype: Any, values: list[int], keep: list[Any]) -> int:
    """The address of a new host array of `values` (appended to keep, which holds it alive)."""
    arr = (ctype * len(values))(*values)
    keep.append(arr)
    return ctypes.addressof(arr)


# one prebuilt call: (function, arguments, C name, ((slot, Sym, converter), ...) or None)
Step = tuple[Any, tuple, str, Optional[tuple[tuple[int, Sym, Any], ...]]]


def _same(x: Any) -> Any:
    return x


class Program:
    """Recorded calls, one list per layer (taps fire between layers); `run(values)` issues them.

    Arguments of a ctypes function are converted to its argtypes' instances once, here: ctypes passes
    an instance of the declared type without converting it (0.50 vs 0.83 µs for lb_gemv_q's 8 arguments,
    1.14 vs 2.05 µs for lb_attn_prep's 21, measured on the stub library of tests/unit/dflash_fake_lib.py)."""

    def __init__(self, lib: Any, layers: list[list[tuple[str, tuple]]]):
        fns = lib.fn
        self.check = lib.check
        self.layers: list[list[Step]] = []
        for calls in layers:
            steps = []
            for name, args in calls:
                fn = getattr(fns, name)
                types = getattr(fn, "argtypes", None) or [_same] * len(args)
                if len(types) != len(args):
                    raise TypeError(f"{name} takes {len(types)} arguments, the pass gives {len(args)}")
                conv = tuple(a if a is None or isinstance(a, Sym) else types[j](a) for j, a in enumerate(args))
                dyn = tuple((j, a, types[j]) for j, a in enumerate(args) if isinstance(a, Sym))
                steps.append((fn, conv, name, dyn or None))
            self.layers.append(steps)

    def run(self, values: dict[str, int], taps: tuple[int, ...] = (), on_tap: Optional[Any] = None) -> None:
        check = self.check
        for i, steps in enumerate(self.layers):
            for fn, args, name, dyn in steps:
                if dyn is None:
                    status = fn(*args)
                else:
                    a = list(args)
                    for j, sym, conv in dyn:
                        a[j] = conv(values[sym.key] + sym.add)
                    status = fn(*a)
                if status:
                    check(status, name)
            if on_tap is not None and i in taps:
                on_tap(i)


class Layers:
    """Issues one pass's calls. `lib` is an _lib.Lib (or the CPU emulation in the unit tests)."""

    def __init__(self, lib: Any, cfg: Qwen35Config, mats: dict[str, Mat], vecs: dict[str, int], bufs: Buffers,
                 max_ctx: int, stream: Optional[int] = None, prefill_gu: str = "merged16", prefill_merge: str = "on",
                 mats16: Optional[dict[str, Mat]] = None):
        self.lib, self.cfg, self.m, self.v, self.b, self.max_ctx = lib, cfg, mats, vecs, bufs, max_ctx
        # resident fp16 copies of the layer matrices (engines/dflash.py's _upload_f16, LUCEBOX_PREFILL_WEIGHTS=f16):
        # what the cuBLAS passes read where present (_wide); decode steps and verifies read self.m
        self.m16 = dict(mats16 or {})
        # how a cuBLAS pass runs the FFN's gate + up (engines/dflash.py's prefill_gu_mode, LUCEBOX_PREFILL_GU):
        # "merged16", where _gu_merged allows, one fp16-output GEMM over both (lb_gemm_q_cublas_x16_h) and
        # lb_df_swiglu_f16_rows; "split", one fp32-output GEMM per matrix and lb_df_swiglu_f16 over the two
        self.prefill_gu = prefill_gu
        # how a cuBLAS pass runs a mixer's input projections (prefill_merge_mode, LUCEBOX_PREFILL_MERGE): "on", where
        # zab_plan / qkv_plan allow, back-to-back tensors as one GEMM whose rows the mixer reads in place with their
        # strides; "off", one GEMM per matrix
        self.prefill_merge = prefill_merge
        self.stream = stream  # every call's last argument
        self.state: Optional[int] = None  # device int32 {n_past, token, steps}: what captured passes read
        self.tap_buf: Optional[int] = None  # [taps, CHUNK, hidden] fp32: captured passes copy tap rows here
        self.use_programs = True
        self._programs: dict[tuple, Program] = {}
        self._rec: Optional[list[tuple[str, tuple]]] = None  # the call list being recorded, if any
        self._host_arrays: list[Any] = []  # segment tables of recorded lb_gemm_q_smalln_seg calls (see matmuls)
        # inside capture(): the C library copies the tables into the graph's kernel arguments at capture, but a
        # CPU emulation of graphs may replay the calls later, so captured tables are kept like recorded ones
        self._capturing = False
        # products of at least this many columns go through lb_gemm_q_cublas when its scratch is there; above CHUNK,
        # so verifies and decode steps (the captured passes) never call cuBLAS
        self.cublas_min_rows = max(CUBLAS_MIN_ROWS, CHUNK + 1)
        # a decode step's attention as one C call (lb_attn_decode_fused: prep, split-KV attention and combine in one
        # kernel) where the library has it and the engine carved its tickets; else lb_attn_prep + lb_attn_decode
        fn = getattr(lib, "fn", None)
        self.fused_decode = bufs.tickets != 0 and fn is not None and hasattr(fn, "lb_attn_decode_fused")
        # a one-row group of one Q6_K_T and one Q4_K_T product of the same x (a DeltaNet layer's qkv + z/beta/alpha,
        # an attention layer's v + q/k) as one lb_gemv_q_pair call where the library has it (q6_q4_pair; one launch
        # unless LUCEBOX_QKV_ZBA=0, which the library reads: two launches then)
        self.gemv_pair = fn is not None and hasattr(fn, "lb_gemv_q_pair")
        # a cuBLAS prefill's attn_gate | ssm_beta | ssm_alpha as one GEMM whose [t, rows] output lb_gdn_prefill_ld
        # reads in place (zab_plan): the library has it and the DeltaNet prefill runs on the tensor cores (the fp32
        # path reads packed rows only)
        self.gdn_ld = (fn is not None and hasattr(fn, "lb_gdn_prefill_ld") and hasattr(fn, "lb_deltanet_chunked_path")
                       and fn.lb_deltanet_chunked_path() == 1)
        # the other entry points those prefill forms need (qkv_plan, _gu_merged)
        self.attn_prep_ld = fn is not None and hasattr(fn, "lb_attn_prep_ld")
        self.gu16 = fn is not None and hasattr(fn, "lb_gemm_q_cublas_x16_h") and hasattr(fn, "lb_df_swiglu_f16_rows")

    def _cublas(self, t: int) -> bool:
        return self.b.gemm_scratch != 0 and t >= self.cublas_min_rows

    def _wide(self, name: str) -> Mat:
        """The matrix a cuBLAS pass reads: its resident fp16 copy when the engine made one (lb_gemm_q_cublas* take
        LB_QT_F16 rows without dequantizing), else the quantized device bytes."""
        return self.m16.get(name) or self.m[name]

    def _call(self, name: str, *args: Any) -> None:
        if self._rec is not None:
            self._rec.append((name, args))
        else:
            self.lib.call(name, *args)

    def _program(self, key: tuple, issue: Any) -> Program:
        """The Program of `key`, recorded on first use by issue(new_layer) (which calls new_layer() at
        every layer boundary)."""
        prog = self._programs.get(key)
        if prog is None:
            layers: list[list[tuple[str, tuple]]] = [[]]

            def new_layer() -> None:
                layers.append([])
                self._rec = layers[-1]

            self._rec = layers[0]
            try:
                issue(new_layer)
            finally:
                self._rec = None
            prog = self._programs[key] = Program(self.lib, layers)
        return prog

    def _dispatch(self, key: tuple, issue: Any, **values: int) -> None:
        """issue(**values) through the program recorded for `key` (values become symbols patched per call),
        or call by call when use_programs is off. (run() records per layer and takes taps: it does its own.)"""
        if self.use_programs:
            self._program(key, lambda _: issue(**{k: Sym(k) for k in values})).run(values)
        else:
            issue(**values)

    # -- primitives --

    def matmul(self, name: str, x: int, y: int, t: int) -> None:
        """y[t, rows] += W x: y is the residual stream or a region the norm before it cleared. A prefill pass of
        more than CHUNK rows runs CHUNK columns at a time (the small-N kernels' limit; each call reads the
        weights once, as the 64-row passes did)."""
        w = self.m[name]
        if t == 1:
            self._call("lb_gemv_q", w.qtype, w.ptr, w.rows, w.k, x, y, 1, self.stream)
            return
        if self._cublas(t):
            w = self._wide(name)
            self._call("lb_gemm_q_cublas", w.qtype, w.ptr, w.rows, w.k, x, t, y, 1, self.b.gemm_scratch,
                       self.b.gemm_scratch_bytes, self.stream)
            return
        for c0 in range(0, t, CHUNK):
            n = min(CHUNK, t - c0)
            self._call("lb_gemm_q_smalln", w.qtype, w.ptr, w.rows, w.k, x + c0 * w.k * F32, n, y + c0 * w.rows * F32,
                       1, self.stream)

    def matmuls(self, names: tuple[str, ...], x: int, ys: list[int], t: int) -> None:
        """matmul(names[i], x, ys[i], t) for each i, with one launch where that is the same product: consecutive
        Q4_K/Q5_K matrices that sit back to back in the arena (upload order = expected_tensors order, and their
        byte sizes are multiples of the arena's 256-byte alignment) are one tensor of their summed rows. At t = 1
        the run is one lb_gemv_q where the outputs are back to back too (_regions packs a single row without
        gaps); at t > 1 (token-major [t, rows] outputs, one region per matrix) one lb_gemm_q_smalln_seg per 64
        columns, which sends each matrix's rows to its own output. Why: each launch pays a fixed cost before its
        bytes (~4.7 µs at t = 1 on the 27B's FFN matrices, ~9 µs at t = 23; H200 fits, docs/perf.md). Q6_K/Q8_0
        keep one launch each: their device layout puts the fp16 scales after each tensor's blocks; except that at
        t = 1 one Q6_K_T matrix and one Q4_K_T run share a launch (q6_q4_pair). On the cuBLAS path
        (wide passes) each matrix is its own call: one GEMM per matrix, whose outputs are separate regions."""
        if self._cublas(t):
            # every group reads the norm's output, which pass_norm wrote in fp16 to the scratch: each matrix runs on
            # that copy and writes its region with beta = 0, so the norm cleared nothing (clearing ~106 MB a layer at
            # pp520, reading it back as C and one fp32 -> fp16 conversion per matrix cost ~5 ms of the 27B's prefill)
            assert x == self.b.h, "a cuBLAS pass's grouped projections read the norm's output"
            for name, y in zip(names, ys):
                self._x16_gemm(name, y, t, 0)
            return
        pair = self.q6_q4_pair(names, ys, t)
        if pair is not None:
            six, rest = pair
            w6, w4 = self.m[names[six]], self.m[names[rest[0]]]
            rows4 = sum(self.m[names[i]].rows for i in rest)
            self._call("lb_gemv_q_pair", w6.qtype, w6.ptr, w6.rows, ys[six], w4.qtype, w4.ptr, rows4, ys[rest[0]],
                       w6.k, x, 1, self.stream)
            return
        groups: list[list[int]] = []
        for i, name in enumerate(names):
            prev = groups[-1][-1] if groups else None
            if prev is not None and len(groups[-1]) < 4 and self._adjacent(names[prev], name) and (
                    t > 1 or ys[i] == ys[prev] + self.m[names[prev]].rows * F32):
                groups[-1].append(i)
            else:
                groups.append([i])
        for g in groups:
            w = self.m[names[g[0]]]
            if len(g) == 1:
                self.matmul(names[g[0]], x, ys[g[0]], t)
                continue
            rows = [self.m[names[i]].rows for i in g]
            if t == 1:
                self._call("lb_gemv_q", w.qtype, w.ptr, sum(rows), w.k, x, ys[g[0]], 1, self.stream)
                continue
            keep: list[Any] = []  # the host tables, alive until the calls return (or with a recorded Program)
            seg_rows = _host_array(ctypes.c_int32, rows, keep)
            for c0 in range(0, t, CHUNK):
                n = min(CHUNK, t - c0)
                outs = _host_array(ctypes.c_void_p, [ys[i] + c0 * r * F32 for i, r in zip(g, rows)], keep)
                self._call("lb_gemm_q_smalln_seg", w.qtype, w.ptr, sum(rows), w.k, x + c0 * w.k * F32, n, len(g),
                           seg_rows, outs, 1, self.stream)
            if self._rec is not None or self._capturing:
                self._host_arrays.extend(keep)

    def q6_q4_pair(self, names: tuple[str, ...], ys: list[int], t: int) -> Optional[tuple[int, list[int]]]:
        """(i6, rest) where matmuls(names, x, ys, t) is one lb_gemv_q_pair: one row, the library has it, exactly one
        matrix Q6_K_T (270: names[i6]) and the others (rest, in order) one Q4_K_T (268) tensor (back to back in the
        arena, as matmuls groups them) with back-to-back outputs, all of the same K; else None. Two groups take it:
        a DeltaNet layer's attn_qkv (Q6) + attn_gate/ssm_beta/ssm_alpha, and an attention layer's attn_q + attn_k +
        attn_v where Q4_K_M gave attn_v Q6_K (8 of the 27B's 16 attention layers; the others' q, k, v are one Q4_K
        tensor, one lb_gemv_q already)."""
        if t != 1 or not self.gemv_pair or len(names) < 2:
            return None
        six = [i for i, n in enumerate(names) if self.m[n].qtype == Q6K_TILED]
        if len(six) != 1:
            return None
        rest = [i for i in range(len(names)) if i != six[0]]
        k = self.m[names[six[0]]].k
        if any(self.m[names[i]].qtype != Q4K_TILED or self.m[names[i]].k != k for i in rest):
            return None
        if not all(self._adjacent(names[a], names[b]) and ys[b] == ys[a] + self.m[names[a]].rows * F32
                   for a, b in zip(rest, rest[1:])):
            return None
        return six[0], rest

    def _adjacent(self, prev: str, name: str) -> bool:
        """name's weights start where prev's end, same Q4_K/Q5_K type and K: the two are one tensor. With fp16 copies
        (m16) theirs must be back to back too, since a cuBLAS pass reads those (_upload_f16 lays them out so)."""
        a, b = self.m[prev], self.m[name]
        row_bytes = _ROW_BYTES_PER_256.get(a.qtype, 0) * (a.k // 256)
        if not (row_bytes > 0 and a.qtype == b.qtype and a.k == b.k and a.k % 256 == 0
                and b.ptr == a.ptr + a.rows * row_bytes):
            return False
        if not self.m16:
            return True
        a16, b16 = self.m16.get(prev), self.m16.get(name)
        return a16 is not None and b16 is not None and b16.ptr == a16.ptr + 2 * a16.rows * a16.k

    def rmsnorm(self, x: int, weight: str, y: int, t: int, zero: tuple[tuple[int, int], ...] = ()) -> None:
        """y = RMSNorm1p(x) over t rows; the (pointer, bytes) ranges in `zero` (at most two) cleared in the
        same launch: the outputs of the projections that follow."""
        z = [a for ptr, nbytes in zero for a in (ptr, nbytes)] + [None, 0] * (2 - len(zero))
        self._call("lb_df_rmsnorm", x, self.v[weight], y, t, self.cfg.hidden, self.cfg.eps, *z, self.stream)

    def pass_norm(self, weight: str, t: int, zero: tuple[tuple[int, int], ...]) -> None:
        """The norm before a group of projections. On a cuBLAS pass it writes the group's input in fp16 where
        lb_gemm_q_cublas_x16 reads it (the scratch's start: `x16`) and clears nothing, since those GEMMs write
        with beta = 0 (matmuls); otherwise h in fp32, clearing the group's outputs."""
        if self._cublas(t):
            self._call("lb_df_rmsnorm_f16", self.b.x, self.v[weight], self.b.gemm_scratch, t, self.cfg.hidden,
                       self.cfg.eps, self.stream)
        else:
            self.rmsnorm(self.b.x, weight, self.b.h, t, zero)

    def _x16_gemm(self, name: str, y: int, t: int, accumulate: int, rows: int = 0) -> None:
        """y (+)= W · x16 on the cuBLAS path: x16 (fp16 [t, K], at the scratch's start) written by the op before,
        the weight chunks in the scratch after it (lb_gemm_q_cublas's own layout). rows: W's rows, more than the
        matrix's own for a run of back-to-back tensors taken as one (0: the matrix's)."""
        w = self._wide(name)
        xb = _align(2 * t * w.k, 256)
        self._call("lb_gemm_q_cublas_x16", w.qtype, w.ptr, rows or w.rows, w.k, self.b.gemm_scratch, t, y, accumulate,
                   self.b.gemm_scratch + xb, self.b.gemm_scratch_bytes - xb, self.stream)

    # -- where each group's projections land (and what its norm clears) --

    def mlp_regions(self, t: int) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        (gate, up), end = _regions(self.b.proj, t, (self.cfg.ffn, self.cfg.ffn))
        return [gate, up], ((self.b.proj, end),)

    def deltanet_regions(self, i: int, p: Pass) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        """[qkv, z, a, beta_in]: a verify projects qkv straight into the layer's kept inputs (commit replays
        them), the rest packed in proj; otherwise all four packed in proj."""
        cfg, b = self.cfg, self.b
        c, vd = cfg.conv_channels, cfg.hv * cfg.dv
        if p.mode == "tree":
            t_pre = b.gdn[i].t_pre
            rest, end = _regions(b.proj, p.t, (vd, cfg.hv, cfg.hv))
            return [t_pre, *rest], ((t_pre, p.t * c * F32), (b.proj, end))
        if p.t == 1:
            # one row: [qkv | z | beta | alpha] without gaps, the arena's order of the four matrices, so that
            # matmuls() runs the Q4_K/Q5_K ones as one GEMV (the two 48-row ones alone cost a ~4.7 µs launch
            # each); 16-byte starts keep the float4 reads of the ops after them
            (qkv, z, beta_in, a), end = _regions(b.proj, 1, (c, vd, cfg.hv, cfg.hv), align=16)
            return [qkv, z, a, beta_in], ((b.proj, end),)
        regs, end = _regions(b.proj, p.t, (c, vd, cfg.hv, cfg.hv))
        return regs, ((b.proj, end),)

    def attention_regions(self, t: int) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        """[qg, k, v]: qg [t, nh * 512] holds per head [q | gate]."""
        cfg = self.cfg
        regs, end = _regions(self.b.proj, t, (2 * cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim,
                                              cfg.n_kv_heads * cfg.head_dim))
        return regs, ((self.b.proj, end),)

    # -- the pass --

    def run(self, p: Pass, taps: tuple[int, ...] = (), on_tap: Optional[Any] = None) -> None:
        """All layers over rows 0..t-1 of x (already holding the embeddings); on_tap(i) after tap layers."""
        if not self.use_programs:
            self.issue_pass(p, taps, on_tap)
            return
        sym = Pass(p.mode, p.t, Sym("pos0"), Sym("max_saves"))  # type: ignore[arg-type]
        prog = self._program(("pass", p.mode, p.t),
                             lambda new_layer: self.issue_pass(sym, (), None, new_layer))
        prog.run({"pos0": p.pos0, "max_saves": p.max_saves}, taps, on_tap)

    def issue_pass(self, p: Pass, taps: tuple[int, ...] = (), on_tap: Optional[Any] = None,
                   new_layer: Optional[Any] = None) -> None:
        """The reference: every call of the pass, one at a time (new_layer() between layers when recording)."""
        cfg, b = self.cfg, self.b
        for i in range(cfg.n_layers):
            if new_layer is not None and i > 0:
                new_layer()
            pre = f"blk.{i}."
            regs, zero = self.attention_regions(p.t) if cfg.is_attention(i) else self.deltanet_regions(i, p)
            self.pass_norm(pre + "attn_norm.weight", p.t, zero)
            if cfg.is_attention(i):
                self.attention(i, p, regs)
            else:
                self.deltanet(i, p, regs)
            regs, zero = self.mlp_regions(p.t)
            self.pass_norm(pre + "post_attention_norm.weight", p.t, zero)
            self.mlp(i, p.t, regs)
            if i in taps and on_tap is not None:
                on_tap(i)

    def mlp(self, i: int, t: int, regs: list[int]) -> None:
        """regs = mlp_regions(t)[0], cleared by the norm before."""
        b, pre, ffn = self.b, f"blk.{i}.", self.cfg.ffn
        gate, up = regs
        names = (pre + "ffn_gate.weight", pre + "ffn_up.weight")
        if self._cublas(t):  # the down GEMM's input straight in fp16 (no fp32 act round trip, no conversion)
            if self._gu_merged(names):
                self._gu_merged16(names, gate, t)
            else:
                self.matmuls(names, b.h, [gate, up], t)
                self._call("lb_df_swiglu_f16", gate, up, b.gemm_scratch, t * ffn, self.stream)
            self._x16_gemm(pre + "ffn_down.weight", b.x, t, 1)
            return
        self.matmuls(names, b.h, [gate, up], t)
        self._call("lb_df_swiglu", gate, up, b.act, t * ffn, self.stream)
        self.matmul(pre + "ffn_down.weight", b.act, b.x, t)

    def _gu_merged(self, names: tuple[str, str]) -> bool:
        """Whether a cuBLAS pass's gate + up run as one fp16-output GEMM: the knob says merged16, the library has both
        entry points, and the two matrices are one tensor of 2·ffn rows (back to back, same Q4_K/Q5_K type and K:
        _adjacent) of ffn rows each."""
        if self.prefill_gu != "merged16" or not self.gu16:
            return False
        g, u = self.m[names[0]], self.m[names[1]]
        return g.rows == u.rows == self.cfg.ffn and self._adjacent(*names)

    def _gu_merged16(self, names: tuple[str, str], out: int, t: int) -> None:
        """gate + up as one GEMM with an fp16 output [t, 2·ffn] (rows of [gate | up]) at `out` (the gate region's
        start: its t·ffn fp32 hold the t·2·ffn fp16), then SwiGLU from it to the down GEMM's fp16 input at the
        scratch's start. Why: the split path writes both outputs in fp32 and the SwiGLU reads them back (2 x 36 MB
        each way per layer at pp520), in two GEMMs of ffn rows where one of 2·ffn runs at a higher rate."""
        g, b, ffn = self._wide(names[0]), self.b, self.cfg.ffn
        xb = _align(2 * t * g.k, 256)  # x16 (the norm's fp16 output) at the scratch's start, weight chunks after it
        self._call("lb_gemm_q_cublas_x16_h", g.qtype, g.ptr, 2 * ffn, g.k, b.gemm_scratch, t, out, 0,
                   b.gemm_scratch + xb, b.gemm_scratch_bytes - xb, self.stream)
        # x16 is dead once the GEMM has read it (stream order): h16 overwrites it, where _x16_gemm reads its input
        self._call("lb_df_swiglu_f16_rows", out, b.gemm_scratch, t, ffn, self.stream)

    def deltanet(self, i: int, p: Pass, regs: list[int]) -> None:
        """regs = deltanet_regions(i, p)[0], cleared by the norm before."""
        cfg, b, pre, L = self.cfg, self.b, f"blk.{i}.", self.b.gdn[i]
        qkv, z, a, beta_in = regs
        names = (pre + "attn_qkv.weight", pre + "attn_gate.weight", pre + "ssm_beta.weight", pre + "ssm_alpha.weight")
        w = [self.v[pre + n] for n in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight")]
        ld = self.zab_plan(names[1:], p)
        if ld is not None:
            # one GEMM of the three back-to-back tensors into [t, ld] rows of [z | beta | alpha] from z's region (it
            # holds them: the packed regions of the three span at least t * ld floats), read in place
            rz, rb = self.m[names[1]].rows, self.m[names[2]].rows
            self._x16_gemm(names[0], qkv, p.t, 0)
            self._x16_gemm(names[1], z, p.t, 0, rows=ld)
            self._call("lb_gdn_prefill_ld", qkv, z + (rz + rb) * F32, z + rz * F32, z, ld, ld, *w, L.conv, L.state,
                       b.act, b.gdn_scratch, p.t, cfg.hk, cfg.hv, cfg.eps, self.stream)
            self.matmul(pre + "ssm_out.weight", b.act, b.x, p.t)
            return
        self.matmuls(names, b.h, [qkv, z, beta_in, a], p.t)
        if p.mode == "tree":
            self._call("lb_gdn_tree_verify", qkv, a, beta_in, z, *w, L.conv, L.state, b.parents, b.tree_q, L.t_k,
                          L.t_v, L.t_g, L.t_beta, b.tree_o, b.saves, p.max_saves, b.act, p.t, cfg.hk, cfg.hv,
                          cfg.eps, self.stream)
        else:
            fn = "lb_gdn_decode_step" if p.mode == "step" else "lb_gdn_prefill"
            self._call(fn, qkv, a, beta_in, z, *w, L.conv, L.state, b.act, b.gdn_scratch, p.t, cfg.hk, cfg.hv,
                          cfg.eps, self.stream)
        self.matmul(pre + "ssm_out.weight", b.act, b.x, p.t)

    def zab_plan(self, names: tuple[str, ...], p: Pass) -> Optional[int]:
        """ld, their summed rows, where a prefill pass on the cuBLAS path runs (attn_gate, ssm_beta, ssm_alpha) as one
        GEMM and lb_gdn_prefill_ld reads its [t, ld] rows in place (z, beta and alpha at stride ld); else None (three
        GEMMs). Why: the two 48-row products cost a dequantization, a narrow GEMM and two launch gaps each (~1.1 ms of
        the 27B's pp520 in all, docs/perf.md). Needs the three back to back in the arena (one tensor) and a stride %
        4 == 0 (the output norm's float4 rows)."""
        if p.mode != "prefill" or not self._cublas(p.t) or not self.gdn_ld or self.prefill_merge != "on":
            return None
        if not (self._adjacent(names[0], names[1]) and self._adjacent(names[1], names[2])):
            return None
        ld = sum(self.m[n].rows for n in names)
        return ld if ld % 4 == 0 else None

    def qkv_plan(self, names: tuple[str, ...], p: Pass) -> Optional[tuple[int, int]]:
        """(ld, n) where a prefill pass on the cuBLAS path runs the first n of (attn_q, attn_k, attn_v) as one GEMM of
        ld = their summed rows (n = 3 where attn_v is back to back with attn_k, as Q4_K_M's Q4_K attn_v is; n = 2
        where attn_v is another type: Q6_K in half the 27B's attention layers) and lb_attn_prep_ld / lb_attn_causal
        read the rows in place; else None. Why: attn_k and attn_v (1,024 rows each) are narrow GEMMs with a
        dequantization and two launch gaps each (~20 µs a layer at pp520, docs/perf.md)."""
        if p.mode != "prefill" or not self._cublas(p.t) or self.prefill_merge != "on" or not self.attn_prep_ld:
            return None
        if not self._adjacent(names[0], names[1]):
            return None
        n = 3 if self._adjacent(names[1], names[2]) else 2
        return sum(self.m[nm].rows for nm in names[:n]), n

    def attention(self, i: int, p: Pass, regs: list[int]) -> None:
        """regs = attention_regions(t)[0], cleared by the norm before."""
        cfg, b, pre, L = self.cfg, self.b, f"blk.{i}.", self.b.attn[i]
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qg, k, v = regs  # qg [t, nh * 512]: per head [q | gate]
        names = (pre + "attn_q.weight", pre + "attn_k.weight", pre + "attn_v.weight")
        plan = self.qkv_plan(names, p)
        if plan is not None:
            # q | k (| v) as one GEMM of [t, ld] rows from qg's region (it holds them: the packed regions after it
            # span at least as much), read in place; v from its own GEMM unless it is in the run
            ld, n_run = plan
            rq, rk = self.m[names[0]].rows, self.m[names[1]].rows
            self._x16_gemm(names[0], qg, p.t, 0, rows=ld)
            k, ld_k = qg + rq * F32, ld
            if n_run == 3:
                v, ld_v = qg + (rq + rk) * F32, ld
            else:
                self._x16_gemm(names[2], v, p.t, 0)
                ld_v = nkv * hd
            self._call("lb_attn_prep_ld", qg, ld, k, ld_k, v, ld_v, self.v[pre + "attn_q_norm.weight"],
                       self.v[pre + "attn_k_norm.weight"], None, p.pos0, b.qf, L.kc, L.vc, KV_F16, p.t, nh, nkv,
                       self.max_ctx, cfg.rope_dims, cfg.eps, cfg.rope_theta, self.stream)
            self._call("lb_attn_causal", b.qf, L.kc, L.vc, KV_F16, qg + hd * F32, ld, 2 * hd, b.act, b.partials,
                       ATTN_SPLITS_MANY, p.t, p.pos0, nh, nkv, self.max_ctx, self.stream)
            self.matmul(pre + "attn_output.weight", b.act, b.x, p.t)
            return
        self.matmuls(names, b.h, [qg, k, v], p.t)
        if p.mode == "step" and self.fused_decode:
            # one kernel for what prep + decode launch as three: norms, RoPE, the cache row, split-KV attention, merge
            fn, pos = ("lb_attn_decode_fused_at", self.state) if p.dev else ("lb_attn_decode_fused", p.pos0)
            self._call(fn, qg, k, v, self.v[pre + "attn_q_norm.weight"], self.v[pre + "attn_k_norm.weight"], pos, b.qf,
                       L.kc, L.vc, KV_F16, b.act, b.partials, ATTN_SPLITS_ONE, b.tickets, nh, nkv, self.max_ctx,
                       cfg.rope_dims, cfg.eps, cfg.rope_theta, self.stream)
            self.matmul(pre + "attn_output.weight", b.act, b.x, p.t)
            return
        # tree slots sit at positions n_past + depth but in cache rows n_past + slot
        positions = b.positions if p.mode == "tree" else None
        prep = ("lb_attn_prep_at", self.state) if p.dev else ("lb_attn_prep", p.pos0)
        self._call(prep[0], qg, 2 * nh * hd, k, v, nkv * hd, self.v[pre + "attn_q_norm.weight"],
                   self.v[pre + "attn_k_norm.weight"], positions, prep[1], b.qf, L.kc, L.vc, KV_F16, p.t, nh, nkv,
                   self.max_ctx, cfg.rope_dims, cfg.eps, cfg.rope_theta, self.stream)
        common = (b.qf, L.kc, L.vc, KV_F16, qg + hd * F32, 2 * nh * hd, 2 * hd, b.act, b.partials)
        if p.dev and p.mode == "step":
            self._call("lb_attn_decode_at", *common, ATTN_SPLITS_ONE, self.state, nh, nkv, self.max_ctx, self.stream)
        elif p.dev and p.mode == "tree":
            self._call("lb_attn_tree_at", *common, ATTN_SPLITS_MANY, b.masks, p.t, self.state, nh, nkv, self.max_ctx,
                       self.stream)
        elif p.dev:
            raise ValueError(f"no device-position form of a {p.mode} pass")
        elif p.mode == "step":
            self._call("lb_attn_decode", *common, ATTN_SPLITS_ONE, p.pos0 + 1, nh, nkv, self.max_ctx, self.stream)
        elif p.mode == "prefill":
            self._call("lb_attn_causal", *common, ATTN_SPLITS_MANY, p.t, p.pos0, nh, nkv, self.max_ctx, self.stream)
        else:
            self._call("lb_attn_tree", *common, ATTN_SPLITS_MANY, b.masks, p.t, p.pos0, nh, nkv, self.max_ctx,
                          self.stream)
        self.matmul(pre + "attn_output.weight", b.act, b.x, p.t)

    def head(self, row0: int, n: int) -> None:
        """logits[0..n) = LM head of RMSNorm1p(x[row0 .. row0 + n))."""
        self._dispatch(("head", row0, n), lambda: self.issue_head(row0, n))

    def issue_head(self, row0: int, n: int) -> None:
        b = self.b
        head = "token_embd.weight" if self.cfg.tied else "output.weight"
        self.rmsnorm(b.x + row0 * self.cfg.hidden * F32, "output_norm.weight", b.h, n,
                     ((b.logits, n * self.cfg.vocab * F32),))
        self.matmul(head, b.h, b.logits, n)

    def topk(self, n: int, k: int) -> None:
        """topk_ids[0..n, 0..k) = the k best columns of logits rows 0..n (lb_df_topk; k = 1: argmax)."""
        self._dispatch(("topk", n, k), lambda: self.issue_topk(n, k))

    def issue_topk(self, n: int, k: int) -> None:
        b, v = self.b, self.cfg.vocab
        self._call("lb_df_topk", b.logits, n, v, v, k, b.topk_scratch, b.topk_ids, None, self.stream)

    # -- CUDA graphs --

    def capture(self, issue: Any) -> int:
        """issue()'s calls captured from the stream into an executable graph (lb_graph_end's handle); nothing
        runs until lb_graph_launch. A failing call inside ends the capture (the graph is dropped) and raises."""
        self.lib.call("lb_graph_begin", self.stream)
        self._capturing = True
        try:
            issue()
        except BaseException:
            dead = ctypes.c_void_p()
            self.lib.fn.lb_graph_end(self.stream, ctypes.byref(dead))  # leaves capture mode; issue's error wins
            if dead.value:
                self.lib.fn.lb_graph_destroy(dead.value)
            raise
        finally:
            self._capturing = False
        exe = ctypes.c_void_p()
        self.lib.call("lb_graph_end", self.stream, ctypes.byref(exe))
        return int(exe.value)

    def issue_graph_pass(self, p: Pass, taps: tuple[int, ...]) -> None:
        """A pass as a graph issues it (p.dev set): tap layer taps[j]'s t rows are copied to tap_buf slot j."""
        if not p.dev:
            raise ValueError("a captured pass reads its positions from the device (Pass.dev)")
        row = self.cfg.hidden * F32

        def on_tap(i: int) -> None:
            self._call("lb_df_copy", self.tap_buf + taps.index(i) * CHUNK * row, self.b.x, p.t * row, self.stream)

        self.issue_pass(p, taps, on_tap if taps else None)

    def issue_embed(self, emb: Mat, ids: int, t: int) -> None:
        """x[0..t) = rows ids[0..t) (device int32) of the quantized embedding emb."""
        self._call("lb_df_embed_q", emb.qtype, emb.ptr, emb.rows, emb.k, ids, t, self.b.x, self.stream)

    def issue_advance(self, ring: int, ring_n: int) -> None:
        """The greedy step's tail: topk_ids[0] becomes state's token and ring[steps % ring_n]; n_past += 1."""
        self._call("lb_df_greedy_advance", self.state, self.b.topk_ids, ring, ring_n, self.stream)

    def commit(self, n: int, n_past: int) -> None:
        """Fold the accepted path (already in b.path, n slots) into states, conv windows and KV rows."""
        self._dispatch(("commit", n), lambda n_past: self.issue_commit(n, n_past), n_past=n_past)

    def issue_commit(self, n: int, n_past: Any) -> None:
        cfg, b = self.cfg, self.b
        for L in b.gdn.values():
            self._call("lb_gdn_commit", L.t_k, L.t_v, L.t_g, L.t_beta, L.t_pre, cfg.conv_channels, L.state, L.conv,
                       b.path, n, cfg.hk, cfg.hv, self.stream)
        for L in b.attn.values():
            for cache in (L.kc, L.vc):
                self._call("lb_df_kv_compact", cache, b.path, n, n_past, cfg.n_kv_heads, self.max_ctx,
                           cfg.head_dim, self.stream)

