"""A CPU emulation of the C API calls engines/dflash.py makes, for testing its sequencing without a GPU.

"Device" pointers are real host addresses of numpy buffers, so pointer arithmetic, offsets, leading
dimensions and row layouts are exercised exactly as the engine computes them; each op reads and writes
through views at those addresses and does the math of engines/cpu.py in fp32 (weights read back from
the device layout through dflash_upload.gguf_bytes and the gguf package's dequantizer, K/V stored in
the cache as f16 like the GPU). A wrong offset, ld, layout or call order shows as a mismatch with
the CPU engine; the kernels' own numerics are the gpu tests' business.

CUDA graphs are emulated as the C API defines them: between lb_graph_begin and lb_graph_end every op
call on the captured stream is recorded instead of run (its arguments as given, device pointers
included), and lb_graph_launch runs the record; ops that read a position from the device (the _at
forms) read it at replay, so a graph replayed with stale host-side values shows as a mismatch. Ops
issued during a capture on another stream, or a blocking copy, fail the capture like CUDA does.
"""

from __future__ import annotations

import ctypes

import numpy as np

from lucebox_cli.engines.cpu import (_attend, _l2_norm, _rms_norm, _sigmoid, _silu, gated_delta_chunked,
                                     gated_delta_recurrent, gated_delta_tree)
from lucebox_cli.engines.dflash_upload import gguf_bytes, qtype_entry

D = 128
F16_QTYPE = 1  # LB_QT_F16


def view(ptr, dtype, count: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    buf = (ctypes.c_char * (int(count) * dtype.itemsize)).from_address(int(ptr))
    return np.frombuffer(buf, dtype=dtype, count=int(count))


class _Fns:
    """`lib.fn.<name>` of the fake: the op as a function returning LB_OK (0) like the C one, recorded
    in calls (and in log when that is a list); size queries return their value. Only ops the fake
    implements exist (hasattr is how the engine asks)."""

    def __init__(self, lib: "FakeLib"):
        self._lib = lib

    def __getattr__(self, name: str):
        if not name.startswith("lb_") or (name in _GRAPH_API and not self._lib.graphs) or (
                name in _BLAS_API and not self._lib.blas) or (name in _FUSED_API and not self._lib.fused):
            raise AttributeError(name)
        op = getattr(self._lib, name)
        lib = self._lib

        def fn(*args):
            lib.calls.append(name)
            if lib.log is not None:
                lib.log.append((name, args))
            if lib._capture is not None and name not in _OUTSIDE_CAPTURE:
                if name in _UNSAFE_IN_CAPTURE or not args or args[-1] != lib._capture_stream:
                    lib._capture_broken = f"{name} during a capture"
                    return 4  # LB_ERR_CUDA
                lib._capture.append((op, args))
                return 0
            out = op(*args)
            return 0 if out is None else out

        self.__dict__[name] = fn
        return fn


# what a FakeLib(graphs=False) (the default, a library from before the graph API) lacks
_GRAPH_API = frozenset({"lb_graph_begin", "lb_graph_end", "lb_graph_launch", "lb_graph_destroy", "lb_event_create",
                        "lb_event_record", "lb_event_query", "lb_event_sync", "lb_event_destroy", "lb_host_alloc",
                        "lb_host_free", "lb_attn_prep_at", "lb_attn_decode_at", "lb_attn_tree_at", "lb_df_embed_q",
                        "lb_df_greedy_advance", "lb_attn_decode_fused_at"})
# what a FakeLib(fused=False) lacks: the one-kernel decode attention (the engine then issues prep + decode)
_FUSED_API = frozenset({"lb_attn_decode_fused", "lb_attn_decode_fused_at"})
# what a FakeLib(blas=False) lacks: the cuBLAS prefill GEMM (a library whose lb::blas is ready offers all three)
_BLAS_API = frozenset({"lb_blas_ready", "lb_gemm_q_cublas", "lb_gemm_q_cublas_scratch_bytes", "lb_f32_to_f16",
                       "lb_gemm_q_cublas_x16", "lb_gemm_q_cublas_x16_h"})
# not recorded into a capture: graph control, events, host memory and size queries run at once
_OUTSIDE_CAPTURE = frozenset({"lb_graph_begin", "lb_graph_end", "lb_graph_launch", "lb_graph_destroy", "lb_event_create",
                              "lb_event_record", "lb_event_query", "lb_event_sync", "lb_event_destroy", "lb_host_alloc",
                              "lb_host_free", "lb_df_topk_scratch_bytes", "lb_stream_create", "lb_stream_destroy",
                              "lb_blas_ready", "lb_gemm_q_cublas_scratch_bytes", "lb_set_pdl"})
# what CUDA refuses inside a capture (synchronous, legacy stream or allocating)
_UNSAFE_IN_CAPTURE = frozenset({"lb_dev_alloc", "lb_dev_free", "lb_dev_h2d", "lb_dev_d2h", "lb_dev_memset",
                                "lb_dev_sync"})


class FakeLib:
    """`call(name, *args)` and `check(status, what)` like _lib.Lib; `fn.<name>` like its ctypes functions."""

    def __init__(self, graphs: bool = False, blas: bool = False, fused: bool = True):
        self.graphs = graphs  # offer the graph API (engines then replay CUDA graphs by default)
        self.blas = blas  # a loaded cuBLAS: lb_blas_ready() = 1 and lb_gemm_q_cublas
        self.fused = fused  # offer lb_attn_decode_fused (its _at form with the graph API)
        self._mem: dict[int, np.ndarray] = {}
        self._wcache: dict[tuple, np.ndarray] = {}
        self.calls: list[str] = []
        self.log: list | None = None  # set to [] to record (name, args) of every call
        self.fn = _Fns(self)
        self._capture: list | None = None  # the calls being captured, if any
        self._capture_stream = None
        self._capture_broken: str | None = None
        self._graphs: dict[int, list] = {}
        self._host: dict[int, np.ndarray] = {}
        self.launches = 0  # lb_graph_launch calls
        self.pdl = 0  # lb_set_pdl's switch
        self.graph_pdl: dict[int, int] = {}  # graph handle -> the switch while it was captured

    def device_props(self, dev: int) -> dict:
        return {"total_mem_bytes": 8 << 30, "name": "emulated"}

    def call(self, name: str, *args) -> None:
        self.check(getattr(self.fn, name)(*args), name)

    def check(self, status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"{what}: status {status}")

    # -- memory --
    def lb_dev_alloc(self, nbytes, out):
        a = np.full(int(nbytes), 0xFF, dtype=np.uint8)  # fresh memory is NaN bytes: unwritten reads show
        self._mem[a.ctypes.data] = a
        out._obj.value = a.ctypes.data

    def lb_dev_free(self, ptr):
        self._mem.pop(int(ptr))

    def lb_dev_h2d(self, dst, src, n):
        ctypes.memmove(int(dst), int(src), int(n))

    lb_dev_d2h = lb_dev_h2d

    def lb_dev_memset(self, dst, byte, n):
        ctypes.memset(int(dst), int(byte), int(n))

    def lb_dev_sync(self):
        pass

    # every op runs at once here, so a stream is only a handle to hand out and take back
    def lb_stream_create(self, out):
        self._streams = getattr(self, "_streams", 0) + 1
        out._obj.value = 0x5700 + self._streams

    def lb_stream_destroy(self, stream):
        assert stream, "destroying a stream that was never created"

    # -- graphs, events, mapped host memory --
    def lb_set_pdl(self, on):
        prev, self.pdl = self.pdl, 1 if on else 0
        return prev

    def lb_graph_begin(self, stream):
        assert stream, "the legacy stream can not be captured"
        assert self._capture is None, "nested capture"
        self._capture, self._capture_stream, self._capture_broken = [], stream, None
        self._capture_pdl = self.pdl

    def lb_graph_end(self, stream, exe):
        assert stream == self._capture_stream
        rec, broken = self._capture, self._capture_broken
        self._capture = self._capture_stream = None
        if broken is not None:
            out_value(exe, None)
            return 4
        handle = 0x6A00 + len(self._graphs) + 1
        self._graphs[handle] = rec
        self.graph_pdl[handle] = self._capture_pdl if self.pdl == self._capture_pdl else -1  # -1: changed mid-capture
        out_value(exe, handle)

    def lb_graph_launch(self, exe, stream):
        self.launches += 1
        for op, args in self._graphs[int(exe)]:
            op(*args)

    def lb_graph_destroy(self, exe):
        del self._graphs[int(exe)]

    def lb_event_create(self, out):
        self._events = getattr(self, "_events", 0) + 1
        out_value(out, 0xE700 + self._events)

    def lb_event_record(self, ev, stream):
        pass

    def lb_event_query(self, ev, done):
        out_value(done, 1)

    def lb_event_sync(self, ev):
        pass

    lb_event_destroy = lb_event_sync

    def lb_host_alloc(self, nbytes, out):
        a = np.full(int(nbytes), 0xFF, dtype=np.uint8)
        self._host[a.ctypes.data] = a
        out_value(out, a.ctypes.data)

    def lb_host_free(self, ptr):
        self._host.pop(int(ptr))

    # -- the device-resident greedy loop --
    def lb_df_embed_q(self, qtype, w, rows, k, ids, t, out, stream):
        i = view(ids, np.int32, t).astype(np.int64)
        assert ((0 <= i) & (i < rows)).all(), f"token ids {i} outside the embedding"
        view(out, np.float32, t * k)[:] = self._w(qtype, w, rows, k)[i].reshape(-1)

    def lb_df_greedy_advance(self, state, ids, ring, ring_n, stream):
        st = view(state, np.int32, 3)
        tok = view(ids, np.int32, 1)[0]
        st[1] = tok
        view(ring, np.int32, ring_n)[st[2] % ring_n] = tok
        st[2] += 1
        st[0] += 1

    # -- matrices --
    def _w(self, qtype, ptr, rows, k) -> np.ndarray:
        key = (int(ptr), qtype, rows, k)
        if qtype == F16_QTYPE:  # LB_QT_F16: fp16 rows (lb_dequant_f16's output), read as they are now
            return view(ptr, np.float16, rows * k).astype(np.float32).reshape(rows, k)
        if key not in self._wcache:
            import gguf

            e = qtype_entry("w", qtype, rows, k)  # (the tiled Q4_K, 268, read back through its inverse too)
            raw = gguf_bytes(e, view(ptr, np.uint8, e.nbytes).copy())
            w = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[e.ggml_type])
            self._wcache[key] = np.asarray(w, np.float32).reshape(rows, k)
        return self._wcache[key]

    def lb_dequant_f16(self, qtype, w, n_rows, k, row0, rows, out, stream):
        """Rows [row0, row0 + rows) of W as fp16 (RN) at out: ggml's dequantization, as the C op."""
        assert qtype != F16_QTYPE and 0 <= row0 < row0 + rows <= n_rows and not int(out) % 16
        view(out, np.float16, rows * k)[:] = self._w(qtype, w, n_rows, k)[row0 : row0 + rows].reshape(-1)

    def lb_gemm_q_smalln(self, qtype, w, rows, k, x, n, y, acc, stream):
        assert qtype != F16_QTYPE, "the small-N kernels take quantized weights only"
        assert 1 <= n <= 64 and k % 256 == 0
        W = self._w(qtype, w, rows, k)
        xs = view(x, np.float32, n * k).reshape(n, k)
        out = view(y, np.float32, n * rows).reshape(n, rows)
        res = xs @ W.T
        out[:] = out + res if acc else res

    def lb_gemm_q_smalln_seg(self, qtype, w, rows, k, x, n, nseg, seg_rows, ys, acc, stream):
        """One product over the back-to-back matrices (one tensor of `rows` rows), segment i's rows to ys[i]."""
        assert 2 <= n <= 64 and 1 <= nseg <= 4
        counts = [int(v) for v in (ctypes.c_int32 * nseg).from_address(seg_rows)]
        outs = [int(v) for v in (ctypes.c_void_p * nseg).from_address(ys)]
        assert sum(counts) == rows
        W = self._w(qtype, w, rows, k)
        res = view(x, np.float32, n * k).reshape(n, k) @ W.T
        r0 = 0
        for r, y in zip(counts, outs):
            out = view(y, np.float32, n * r).reshape(n, r)
            out[:] = out + res[:, r0 : r0 + r] if acc else res[:, r0 : r0 + r]
            r0 += r

    def lb_blas_ready(self):
        return 1

    @staticmethod
    def lb_gemm_q_cublas_scratch_bytes(n, k, chunk_rows):
        al = lambda v: (v + 255) // 256 * 256  # noqa: E731
        return al(2 * n * k) + al(2 * chunk_rows * k)

    def lb_gemm_q_cublas(self, qtype, w, rows, k, x, n, y, acc, scratch, scratch_bytes, stream):
        """lb_gemm_q_smalln's product for any n; the scratch must hold x in fp16 and at least one fp16 row, and is
        overwritten (NaN here) as the C op overwrites it."""
        assert n >= 1 and k % 256 == 0 and scratch_bytes >= self.lb_gemm_q_cublas_scratch_bytes(n, k, 1)
        assert int(scratch) in self._mem or any(b <= int(scratch) < b + a.size for b, a in self._mem.items())
        self._product(qtype, w, rows, k, x, n, y, acc)
        ctypes.memset(int(scratch), 0xFF, int(scratch_bytes))

    @staticmethod
    def lb_f32_to_f16(x, count, out, stream):
        assert count >= 8 and count % 8 == 0 and not int(x) % 16 and not int(out) % 16
        view(out, np.float16, int(count))[:] = view(x, np.float32, int(count)).astype(np.float16)

    def lb_gemm_q_cublas_x16(self, qtype, w, rows, k, x16, n, y, acc, scratch, scratch_bytes, stream):
        """lb_gemm_q_cublas on an fp16 x (lb_f32_to_f16's); the scratch holds only weight chunks (overwritten)."""
        assert n >= 1 and k % 256 == 0 and scratch_bytes >= 2 * k
        x = view(x16, np.float16, n * k).astype(np.float32)
        self._product(qtype, w, rows, k, x.ctypes.data, n, y, acc)
        ctypes.memset(int(scratch), 0xFF, int(scratch_bytes))

    def lb_gemm_q_cublas_x16_h(self, qtype, w, rows, k, x16, n, y16, acc, scratch, scratch_bytes, stream):
        """lb_gemm_q_cublas_x16 with an fp16 y16 [n, rows]: the fp32 product rounded to fp16 (RN, as cuBLAS's epilogue
        rounds its fp32 accumulator); accumulate must be 0, y16 16-byte aligned (the C op's checks)."""
        assert acc == 0 and not int(y16) % 16 and n >= 1 and k % 256 == 0 and scratch_bytes >= 2 * k
        x = view(x16, np.float16, n * k).astype(np.float32).reshape(n, k)
        res = x @ self._w(qtype, w, rows, k).T
        view(y16, np.float16, n * rows)[:] = res.astype(np.float32).reshape(-1).astype(np.float16)
        ctypes.memset(int(scratch), 0xFF, int(scratch_bytes))

    def _product(self, qtype, w, rows, k, x, n, y, acc):
        W = self._w(qtype, w, rows, k)
        out = view(y, np.float32, n * rows).reshape(n, rows)
        res = view(x, np.float32, n * k).reshape(n, k) @ W.T
        out[:] = out + res if acc else res

    def lb_gemv_q(self, qtype, w, rows, k, x, y, acc, stream):
        self.lb_gemm_q_smalln(qtype, w, rows, k, x, 1, y, acc, stream)

    def lb_gemv_q_pair(self, qa, wa, rows_a, ya, qb, wb, rows_b, yb, k, x, acc, stream):
        self.lb_gemv_q(qa, wa, rows_a, k, x, ya, acc, stream)
        self.lb_gemv_q(qb, wb, rows_b, k, x, yb, acc, stream)

    # -- small kernels --
    def lb_df_rmsnorm(self, x, w, y, t, n, eps, z0, z0_bytes, z1, z1_bytes, stream):
        xs = view(x, np.float32, t * n).reshape(t, n).copy()
        view(y, np.float32, t * n)[:] = _rms_norm(xs, view(w, np.float32, n), eps).reshape(-1)
        for ptr, nbytes in ((z0, z0_bytes), (z1, z1_bytes)):  # the C API's checks, then the clear
            assert (ptr is None) == (int(nbytes) == 0) and (ptr is None or (int(ptr) % 16 == 0 and nbytes % 4 == 0))
            if ptr is not None:
                ctypes.memset(int(ptr), 0, int(nbytes))

    def lb_df_swiglu(self, g, u, y, count, stream):
        view(y, np.float32, count)[:] = _silu(view(g, np.float32, count)) * view(u, np.float32, count)

    def lb_df_rmsnorm_f16(self, x, w, y16, t, n, eps, stream):
        xs = view(x, np.float32, t * n).reshape(t, n).copy()
        view(y16, np.float16, t * n)[:] = _rms_norm(xs, view(w, np.float32, n), eps).reshape(-1).astype(np.float16)

    def lb_df_swiglu_f16(self, g, u, y16, count, stream):
        y = _silu(view(g, np.float32, count)) * view(u, np.float32, count)
        view(y16, np.float16, count)[:] = y.astype(np.float32).astype(np.float16)

    def lb_df_swiglu_f16_rows(self, gu16, y16, t, ffn, stream):
        """lb_df_swiglu_f16 on rows of [gate | up] fp16 (lb_gemm_q_cublas_x16_h's output): the same math on the fp16
        values taken to fp32, so the same bits as lb_df_swiglu_f16 on those values."""
        gu = view(gu16, np.float16, t * 2 * ffn).reshape(t, 2 * ffn).astype(np.float32)
        y = _silu(gu[:, :ffn]) * gu[:, ffn:]
        view(y16, np.float16, t * ffn)[:] = y.astype(np.float32).reshape(-1).astype(np.float16)

    def lb_df_copy(self, dst, src, n, stream):
        ctypes.memmove(int(dst), int(src), int(n))

    def lb_df_kv_compact(self, cache, path, n, n_past, heads, max_ctx, row, stream):
        c = view(cache, np.uint16, heads * max_ctx * row).reshape(heads, max_ctx, row)
        p = view(path, np.int32, n)
        for j in range(n):
            c[:, n_past + j] = c[:, n_past + p[j]]

    def lb_df_topk_scratch_bytes(self, rows, cols, k):
        from lucebox_cli.engines.memory_plan import topk_scratch

        return topk_scratch(rows, cols, k)

    def lb_df_topk(self, x, rows, cols, ld, k, scratch, ids, vals, stream):
        assert 1 <= k <= 8 and k <= cols and ld >= cols
        xs = view(x, np.float32, (rows - 1) * ld + cols)
        rowsx = np.stack([xs[r * ld : r * ld + cols] for r in range(rows)])
        top = reference_topk(rowsx, k)
        view(ids, np.int32, rows * k)[:] = top.reshape(-1)
        if vals:
            view(vals, np.float32, rows * k)[:] = np.take_along_axis(rowsx, top, axis=1).reshape(-1)
        view(scratch, np.uint8, 8)[:] = 0xFF  # scratch is clobbered, as on the device

    # -- DeltaNet --
    def _prep(self, pre, a, b, conv_w, ssm_a, dt, conv, t, hk, hv, parents=None):
        c = (2 * hk + hv) * D
        P = view(pre, np.float32, t * c).reshape(t, c).copy()
        hist = np.concatenate([view(conv, np.float32, 3 * c).reshape(3, c).copy(), P])
        cw = view(conv_w, np.float32, c * 4).reshape(c, 4)
        if parents is None:
            mixed = sum(hist[j : j + t] * cw[:, j] for j in range(4))
        else:
            par = view(parents, np.int32, t)
            wins = []
            for i in range(t):
                chain, s = [], i
                while s >= 0:
                    chain.append(3 + s)
                    s = int(par[s])
                wins.append(([0, 1, 2] + chain[::-1])[-4:])
            mixed = np.einsum("tkc,ck->tc", hist[np.asarray(wins)], cw)
        mixed = _silu(mixed)
        q = _l2_norm(mixed[:, : hk * D].reshape(t, hk, D)) / np.float32(np.sqrt(D))
        k = _l2_norm(mixed[:, hk * D : 2 * hk * D].reshape(t, hk, D))
        v = mixed[:, 2 * hk * D :].reshape(t, hv, D)
        bt = _sigmoid(view(b, np.float32, t * hv).reshape(t, hv))
        av = view(a, np.float32, t * hv).reshape(t, hv)
        g = view(ssm_a, np.float32, hv) * np.logaddexp(0.0, av + view(dt, np.float32, hv))
        return q, k, v, g.astype(np.float32), bt.astype(np.float32), hist

    def _out(self, o, z, norm_w, y, t, hv, eps):
        zz = view(z, np.float32, t * hv * D).reshape(t, hv, D)
        yy = _rms_norm(o, view(norm_w, np.float32, D), eps) * _silu(zz)
        view(y, np.float32, t * hv * D)[:] = yy.reshape(-1)

    def _sequence(self, delta, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, y, t, hk, hv, eps):
        c = (2 * hk + hv) * D
        q, k, v, g, bt, hist = self._prep(pre, a, b, conv_w, ssm_a, dt, conv, t, hk, hv)
        st = view(state, np.float32, hv * D * D).reshape(hv, D, D)
        o, new = delta(q, k, v, g, bt, st.copy())
        st[:] = new
        view(conv, np.float32, 3 * c)[:] = hist[-3:].reshape(-1)
        self._out(o, z, norm_w, y, t, hv, eps)

    def lb_gdn_decode_step(self, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, y, scratch, t, hk, hv, eps, s):
        self._sequence(gated_delta_recurrent, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, y, t, hk, hv, eps)

    def lb_gdn_decode_path(self, t, hk, hv):
        return 0  # the numpy step above is the three-op path's math; there is no fused kernel here

    def lb_gdn_prefill(self, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, y, scratch, t, hk, hv, eps, s):
        self._sequence(gated_delta_chunked, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, y, t, hk, hv, eps)

    def lb_gdn_prefill_ld(self, pre, a, b, z, ld_z, ld_ab, conv_w, ssm_a, dt, norm_w, conv, state, y, scratch, t, hk,
                          hv, eps, s):
        """lb_gdn_prefill on z rows of stride ld_z and a / b rows of stride ld_ab (the C checks: the tensor-core path,
        which this fake is, ld_z >= hv*128 and % 4 == 0, z 16-byte aligned, ld_ab >= hv), through packed copies."""
        assert ld_z >= hv * D and ld_z % 4 == 0 and int(z) % 16 == 0 and ld_ab >= hv
        zz, aa, bb = (np.ascontiguousarray(np.stack([view(p, np.float32, (t - 1) * ld + w)[i * ld: i * ld + w]
                                                     for i in range(t)]))
                      for p, ld, w in ((z, ld_z, hv * D), (a, ld_ab, hv), (b, ld_ab, hv)))
        self.lb_gdn_prefill(pre, aa.ctypes.data, bb.ctypes.data, zz.ctypes.data, conv_w, ssm_a, dt, norm_w, conv, state,
                            y, scratch, t, hk, hv, eps, s)

    def lb_deltanet_chunked_path(self):
        return 1  # the tensor-core path (what lb_gdn_prefill_ld needs)

    def lb_gdn_tree_verify(self, pre, a, b, z, conv_w, ssm_a, dt, norm_w, conv, state, parents, q, k, v, g, beta, o,
                           saves, max_saves, y, n, hk, hv, eps, s):
        qq, kk, vv, gg, bb, _ = self._prep(pre, a, b, conv_w, ssm_a, dt, conv, n, hk, hv, parents)
        st = view(state, np.float32, hv * D * D).reshape(hv, D, D).copy()
        out, _ = gated_delta_tree(qq, kk, vv, gg, bb, st, view(parents, np.int32, n).astype(np.int64))
        for ptr, arr in ((q, qq), (k, kk), (v, vv), (g, gg), (beta, bb), (o, out)):
            view(ptr, np.float32, arr.size)[:] = arr.reshape(-1)
        self._out(out, z, norm_w, y, n, hv, eps)

    def lb_gdn_commit(self, k, v, g, beta, pre, ld_pre, state, conv, path, n, hk, hv, s):
        p = view(path, np.int32, n).astype(np.int64)
        kk = view(k, np.float32, (p.max() + 1) * hk * D).reshape(-1, hk, D)[p]
        vv = view(v, np.float32, (p.max() + 1) * hv * D).reshape(-1, hv, D)[p]
        gg = view(g, np.float32, (p.max() + 1) * hv).reshape(-1, hv)[p]
        bb = view(beta, np.float32, (p.max() + 1) * hv).reshape(-1, hv)[p]
        st = view(state, np.float32, hv * D * D).reshape(hv, D, D)
        _, new = gated_delta_recurrent(np.zeros_like(kk), kk, vv, gg, bb, st.copy())
        st[:] = new
        c = (2 * hk + hv) * D
        P = view(pre, np.float32, (p.max() + 1) * ld_pre).reshape(-1, ld_pre)[p, :c]
        cv = view(conv, np.float32, 3 * c).reshape(3, c)
        cv[:] = np.concatenate([cv.copy(), P])[-3:]

    # -- attention --
    def lb_attn_prep(self, qg, ld_q, k, v, ld_kv, qn, kn, positions, pos0, qf, kc, vc, kvd, t, nh, nkv, max_ctx,
                     rope_dims, eps, theta, s):
        self.lb_attn_prep_ld(qg, ld_q, k, ld_kv, v, ld_kv, qn, kn, positions, pos0, qf, kc, vc, kvd, t, nh, nkv,
                             max_ctx, rope_dims, eps, theta, s)

    def lb_attn_prep_ld(self, qg, ld_q, k, ld_k, v, ld_v, qn, kn, positions, pos0, qf, kc, vc, kvd, t, nh, nkv,
                        max_ctx, rope_dims, eps, theta, s):
        assert kvd == 0
        hd = 256
        assert ld_q >= nh * 2 * hd and ld_k >= nkv * hd and ld_v >= nkv * hd

        def rows(ptr, ld, w):  # t rows of w floats, stride ld (nothing read past the last row's w)
            a = view(ptr, np.float32, (t - 1) * ld + w)
            return np.stack([a[i * ld: i * ld + w] for i in range(t)])

        Q = rows(qg, ld_q, nh * 2 * hd).reshape(t, nh, 2 * hd)[..., :hd]
        K = rows(k, ld_k, nkv * hd).reshape(t, nkv, hd)
        V = rows(v, ld_v, nkv * hd).reshape(t, nkv, hd)
        pos = view(positions, np.int32, t).astype(np.int64) if positions else pos0 + np.arange(t)
        q = _rope(_rms_norm(Q, view(qn, np.float32, hd), eps), pos, rope_dims, theta)
        kr = _rope(_rms_norm(K, view(kn, np.float32, hd), eps), pos, rope_dims, theta)
        view(qf, np.float32, t * nh * hd)[:] = q.reshape(-1)
        kcache = view(kc, np.uint16, nkv * max_ctx * hd).reshape(nkv, max_ctx, hd)
        vcache = view(vc, np.uint16, nkv * max_ctx * hd).reshape(nkv, max_ctx, hd)
        kcache[:, pos0 : pos0 + t] = kr.astype(np.float16).view(np.uint16).transpose(1, 0, 2)
        vcache[:, pos0 : pos0 + t] = V.astype(np.float16).view(np.uint16).transpose(1, 0, 2)

    def lb_attn_prep_at(self, qg, ld_q, k, v, ld_kv, qn, kn, positions, pos0_dev, qf, kc, vc, kvd, t, nh, nkv, max_ctx,
                        rope_dims, eps, theta, s):
        pos0 = int(view(pos0_dev, np.int32, 1)[0])
        self.lb_attn_prep(qg, ld_q, k, v, ld_kv, qn, kn, positions, pos0, qf, kc, vc, kvd, t, nh, nkv, max_ctx,
                          rope_dims, eps, theta, s)

    def lb_attn_decode_at(self, qf, kc, vc, kvd, gate, gl, gh, out, part, ms, n_past_dev, nh, nkv, max_ctx, s):
        n_ctx = int(view(n_past_dev, np.int32, 1)[0]) + 1
        self.lb_attn_decode(qf, kc, vc, kvd, gate, gl, gh, out, part, ms, n_ctx, nh, nkv, max_ctx, s)

    def lb_attn_tree_at(self, qf, kc, vc, kvd, gate, gl, gh, out, part, ms, masks, n, n_past_dev, nh, nkv, max_ctx, s):
        n_past = int(view(n_past_dev, np.int32, 1)[0])
        self.lb_attn_tree(qf, kc, vc, kvd, gate, gl, gh, out, part, ms, masks, n, n_past, nh, nkv, max_ctx, s)

    def lb_attn_decode_fused(self, qg, k, v, qn, kn, n_past, qf, kc, vc, kvd, out, part, ms, tickets, nh, nkv,
                             max_ctx, rope_dims, eps, theta, s):
        """prep + decode of one token (the fused kernel's math). The tickets must be zero at every call (the
        kernel leaves them so; the engine zeroes them once): fresh fake memory is 0xFF, so a missing zeroing shows."""
        if part and ms > 1:
            assert tickets and not view(tickets, np.uint32, nkv).any(), "lb_attn_decode_fused: tickets not zero"
        self.lb_attn_prep(qg, 2 * nh * 256, k, v, nkv * 256, qn, kn, None, n_past, qf, kc, vc, kvd, 1, nh, nkv, max_ctx,
                          rope_dims, eps, theta, s)
        self.lb_attn_decode(qf, kc, vc, kvd, qg + 256 * 4, 2 * nh * 256, 2 * 256, out, part, ms, n_past + 1, nh, nkv,
                            max_ctx, s)

    def lb_attn_decode_fused_at(self, qg, k, v, qn, kn, n_past_dev, qf, kc, vc, kvd, out, part, ms, tickets, nh, nkv,
                                max_ctx, rope_dims, eps, theta, s):
        n_past = int(view(n_past_dev, np.int32, 1)[0])
        self.lb_attn_decode_fused(qg, k, v, qn, kn, n_past, qf, kc, vc, kvd, out, part, ms, tickets, nh, nkv, max_ctx,
                                  rope_dims, eps, theta, s)

    def _attn(self, qf, kc, vc, gate, gate_ld, gate_hs, out, t, rows, mask, nh, nkv, max_ctx):
        hd = 256
        q = view(qf, np.float32, t * nh * hd).reshape(t, nh, hd).copy()
        keys = view(kc, np.uint16, nkv * max_ctx * hd).reshape(nkv, max_ctx, hd)[:, :rows]
        vals = view(vc, np.uint16, nkv * max_ctx * hd).reshape(nkv, max_ctx, hd)[:, :rows]
        keys = keys.view(np.float16).astype(np.float32).transpose(1, 0, 2)
        vals = vals.view(np.float16).astype(np.float32).transpose(1, 0, 2)
        o = _attend(q, keys, vals, mask)
        gbase = view(gate, np.float32, (t - 1) * gate_ld + (nh - 1) * gate_hs + hd)
        gidx = np.arange(t)[:, None, None] * gate_ld + np.arange(nh)[None, :, None] * gate_hs + np.arange(hd)
        view(out, np.float32, t * nh * hd)[:] = (o * _sigmoid(gbase[gidx])).reshape(-1)

    def lb_attn_decode(self, qf, kc, vc, kvd, gate, gl, gh, out, part, ms, n_ctx, nh, nkv, max_ctx, s):
        self._attn(qf, kc, vc, gate, gl, gh, out, 1, n_ctx, np.ones((1, n_ctx), bool), nh, nkv, max_ctx)

    def lb_attn_causal(self, qf, kc, vc, kvd, gate, gl, gh, out, part, ms, t, pos0, nh, nkv, max_ctx, s):
        mask = np.arange(pos0 + t)[None, :] <= (pos0 + np.arange(t))[:, None]
        self._attn(qf, kc, vc, gate, gl, gh, out, t, pos0 + t, mask, nh, nkv, max_ctx)

    def lb_attn_tree(self, qf, kc, vc, kvd, gate, gl, gh, out, part, ms, masks, n, n_past, nh, nkv, max_ctx, s):
        bits = view(masks, np.uint64, n)
        local = ((bits[:, None] >> np.arange(n, dtype=np.uint64)[None, :]) & np.uint64(1)).astype(bool)
        mask = np.concatenate([np.ones((n, n_past), bool), local], axis=1)
        self._attn(qf, kc, vc, gate, gl, gh, out, n, n_past + n, mask, nh, nkv, max_ctx)


def out_value(ref, value) -> None:
    """*out = value for an output argument passed as ctypes.byref(c_xxx()) (or a ctypes pointer)."""
    obj = getattr(ref, "_obj", None)
    if obj is None:
        obj = ref.contents
    obj.value = value


def reference_topk(x: np.ndarray, k: int) -> np.ndarray:
    """[rows, k] ids in lb_df_topk's order: NaN first, then larger value, ties to the lower column
    (k = 1 equals np.argmax)."""
    x = np.asarray(x, np.float32)
    cols = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    nan = np.isnan(x)
    neg = np.where(nan, 0.0, -x.astype(np.float64))
    order = np.stack([np.lexsort((cols[r], neg[r], ~nan[r])) for r in range(x.shape[0])])
    return order[:, :k].astype(np.int64)


def _rope(x, pos, rope_dims, theta):
    half = rope_dims // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dims)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
    a, b = x[..., :half], x[..., half : 2 * half]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half :]], axis=-1)


# -- host-overhead measurement: the real ctypes path with kernels that do nothing ----------------------

# by ctypes class name (c_uint64 is c_ulong and c_int32 is c_int on Linux x86-64)
_C_TYPES = {"c_int": "int", "c_uint": "unsigned int", "c_long": "long", "c_ulong": "unsigned long",
            "c_ulonglong": "unsigned long long", "c_float": "float", "c_void_p": "void *",
            "c_char_p": "const char *"}


def _c_type(t) -> str:
    name = getattr(t, "__name__", "")
    if name in _C_TYPES:
        return _C_TYPES[name]
    if name.startswith("LP_"):  # POINTER(...): host pointers are opaque here
        return "void *"
    raise TypeError(f"no C spelling for ctypes type {t!r}")


def stub_source() -> str:
    """C source with every function of _lib.DECLS taking the declared arguments and doing nothing: LB_OK,
    0 bytes, NULL strings; lb_dev_alloc hands out distinct fake addresses (never dereferenced) and
    lb_dev_d2h zero-fills the host destination."""
    from lucebox_cli.engines._lib import ABI_VERSION, DECLS

    lines = ["#include <stdlib.h>", "static unsigned long long next_addr = 1ull << 40;"]
    for name, (restype, argtypes) in DECLS.items():
        params = ", ".join(f"{_c_type(t)} a{i}" for i, t in enumerate(argtypes)) or "void"
        ret = "const char *" if restype is ctypes.c_char_p else _c_type(restype)
        if name == "lb_dev_alloc":
            body = ("*(unsigned long long *)a1 = next_addr; next_addr += (a0 + 4095) / 4096 * 4096 + 4096; "
                    "return 0;")
        elif name == "lb_dev_d2h":  # host destination: zeros (token id 0, logits 0), never garbage
            body = "for (unsigned long a = 0; a < a2; ++a) ((unsigned char *)a0)[a] = 0; return 0;"
        elif name in ("lb_graph_end", "lb_event_create"):  # a distinct non-NULL handle in the last argument
            out = f"a{len(argtypes) - 1}"
            body = f"*(unsigned long long *){out} = next_addr; next_addr += 4096; return 0;"
        elif name == "lb_host_alloc":  # real host memory: the engine reads the ring (zeros: token 0)
            body = "*(void **)a1 = calloc(1, a0); return *(void **)a1 ? 0 : 5;"
        elif name == "lb_host_free":
            body = "free(a0); return 0;"
        elif name == "lb_abi_version":
            body = f"return {ABI_VERSION};"
        elif ret == "const char *":
            body = "return 0;"
        else:
            body = "(void)0; return 0;"
        lines.append(f"__attribute__((visibility(\"default\"))) {ret} {name}({params}) {{ {body} }}")
    return "\n".join(lines) + "\n"


def stub_lib(workdir):
    """An _lib.Lib over a compiled stub of the whole C API (needs a C compiler): the engine's host side runs
    exactly as on a GPU machine, argument conversion and status checks included, with no device work."""
    import subprocess
    from pathlib import Path

    from lucebox_cli.engines import _lib

    workdir = Path(workdir)
    src, so = workdir / "lb_stub.c", workdir / "liblb_stub.so"
    src.write_text(stub_source())
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return _lib.Lib(path=so, cdll=_lib._open(str(so), so.stat().st_mtime_ns))


def host_times(gguf, lib, *, steps: int = 200, verifies: int = 50, tree_n: int = 23) -> dict:
    """Host milliseconds per greedy decode step and per greedy tree verify of the engine over `lib` (the
    stub: no device time at all), after one untimed warm-up of each. Every call feeds token 1 (the stub's
    device argmax reads back as 0)."""
    import time

    from lucebox_cli.bench.runner import verify_tree
    from lucebox_cli.engines.dflash import DFlashTargetEngine

    eng = DFlashTargetEngine(gguf, max_context=steps + 4 * tree_n + 64, budget=tree_n - 1, lib=lib,
                             card_bytes=1 << 40)
    try:
        eng.prefill([1, 2, 3])
        eng.step_argmax(1)
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step_argmax(1)
        step_ms = (time.perf_counter() - t0) / steps * 1e3
        tree = verify_tree(tree_n, eng.cfg.vocab)
        eng.verify_argmax(tree)
        t0 = time.perf_counter()
        for _ in range(verifies):
            eng.verify_argmax(tree)
        verify_ms = (time.perf_counter() - t0) / verifies * 1e3
        return {"layers": eng.cfg.n_layers, "step_ms": step_ms, "verify_ms": verify_ms}
    finally:
        eng.close()


if __name__ == "__main__":
    # python tests/unit/dflash_fake_lib.py MODEL.gguf: host time per step / verify over the stub library
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(host_times(sys.argv[1], stub_lib(d))))
