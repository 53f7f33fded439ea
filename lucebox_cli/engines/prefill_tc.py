"""The tensor-core prefill (cuda/prefill/prefill_08b.cu) over a MegakernelEngine's handle.

`TensorCorePrefill(engine)` owns a prefill context (scratch for `max_chunk` tokens; longer prompts run
in segments) that borrows the engine's megakernel handle: close it before the engine. `run(tokens)`
appends the tokens at the engine's position and writes the K/V cache, conv ring, recurrent state and
pending token exactly as the decode kernel reads them, so `engine.decode(n)` continues from it.

Its GEMMs run on our own kernel or on a cuBLAS loaded at run time (engines/cublas.py), chosen once here:
`gemm` ("auto", "own", "cublas"; default LUCEBOX_PREFILL_GEMM, else auto = cuBLAS when one loads).
`.gemm` says which path runs, `.cublas` what was found, `.note` why auto fell back to our kernel.
`.attn` says where its attention runs: "tc" (tensor cores) or "fp32" (LUCEBOX_ATTN_PREFILL=fp32, which the
library reads once per process).
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence

import numpy as np

from lucebox_cli.engines import cublas
from lucebox_cli.errors import EngineUnavailable, UsageError


class TensorCorePrefill:
    def __init__(self, engine: Any, max_chunk: int = 0, gemm: Optional[str] = None):
        self.lib = engine.lib
        self.vocab = int(engine.cfg.vocab)
        self._ctx = ctypes.c_void_p()
        want = cublas.gemm_mode({cublas.GEMM_ENV: gemm} if gemm is not None else None)
        self.cublas = cublas.load(self.lib) if want != "own" else cublas.CublasStatus(False, reason="not asked")
        if want == "cublas" and not self.cublas.loaded:
            raise EngineUnavailable(f"{cublas.GEMM_ENV}=cublas but no cuBLAS loaded: {self.cublas.reason}",
                                    hint=f"set {cublas.CUBLAS_ENV}=/path/to/libcublas.so.N, or use auto / own")
        mode = cublas.GEMM_MODES[want] if self.cublas.loaded else cublas.GEMM_MODES["own"]
        self.lib.call("lb_mk_prefill_create_ex", engine._handle, int(max_chunk), mode, ctypes.byref(self._ctx))
        self.gemm = cublas.GEMM_NAMES[int(self.lib.fn.lb_mk_prefill_gemm(self._ctx))]
        self.attn = "tc" if int(self.lib.fn.lb_mk_prefill_attn(self._ctx)) == 1 else "fp32"
        self.note: Optional[str] = None
        if self.cublas.loaded and self.gemm == "own":
            # auto with a cuBLAS that would not start here (lb_last_error says why)
            self.note = f"cuBLAS loaded but not used: {self.lib.last_error()}"
        elif want == "auto" and not self.cublas.loaded:
            self.note = f"no cuBLAS: {self.cublas.reason}"

    def run(self, token_ids: Sequence[int], *, want_logits: bool = True) -> tuple[int, Optional[np.ndarray]]:
        """(argmax of the last position, its logits [vocab] or None)."""
        if not self._ctx:
            raise UsageError("this prefill context was closed")
        tokens = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64).reshape(-1), dtype=np.int32)
        if tokens.size == 0:
            raise UsageError("prefill needs at least one token")
        logits = np.empty(self.vocab, dtype=np.float32) if want_logits else None
        am = ctypes.c_int32(-1)
        self.lib.call(
            "lb_mk_prefill", self._ctx, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), int(tokens.size),
            logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if logits is not None else None, ctypes.byref(am),
        )
        return int(am.value), logits

    def close(self) -> None:
        if self._ctx:
            self.lib.fn.lb_mk_prefill_free(self._ctx)
            self._ctx = ctypes.c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
