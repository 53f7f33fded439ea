"""The only ctypes user: loads build/<profile>/liblucebox.so and mirrors cuda/include/lucebox.h.

One declaration table (`DECLS`: name → (restype, argtypes)) is applied when the library is opened;
tests/unit/test_lib.py parses lucebox.h and checks every LB_API prototype against it, so a function
added to the header without a row here (or with a different argument count) fails the tests.

`load(profile)` checks the ABI version and that the library was compiled for the profile's arch, and
raises ProfileMismatch with `make build PROFILE=…` otherwise. GPU detection (`probe_gpus`, `gpu_count`,
`gpu_info`) never raises: with no GPU, no driver or no built library it reports zero GPUs and why.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from ctypes import POINTER, c_char, c_char_p, c_int, c_int32, c_uint64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lucebox_cli.errors import EngineUnavailable, LuceboxError, OutOfMemory, ProfileMismatch, UsageError

# Must equal LB_ABI_VERSION in cuda/include/lucebox.h.
ABI_VERSION = 1
LIB_NAME = "liblucebox.so"
BUILD_DIR_ENV = "LUCEBOX_BUILD_DIR"
FORCE_NO_GPU_ENV = "LUCEBOX_FORCE_NO_GPU"

# lb_status
LB_OK = 0
LB_ERR_INVALID_ARG = 1
LB_ERR_NO_DRIVER = 2
LB_ERR_NO_DEVICE = 3
LB_ERR_CUDA = 4
LB_ERR_OUT_OF_MEMORY = 5
LB_ERR_UNSUPPORTED = 6
LB_ERR_INTERNAL = 7
LB_ERR_NOT_FOUND = 8
STATUS_NAMES = {
    LB_OK: "LB_OK",
    LB_ERR_INVALID_ARG: "LB_ERR_INVALID_ARG",
    LB_ERR_NO_DRIVER: "LB_ERR_NO_DRIVER",
    LB_ERR_NO_DEVICE: "LB_ERR_NO_DEVICE",
    LB_ERR_CUDA: "LB_ERR_CUDA",
    LB_ERR_OUT_OF_MEMORY: "LB_ERR_OUT_OF_MEMORY",
    LB_ERR_UNSUPPORTED: "LB_ERR_UNSUPPORTED",
    LB_ERR_INTERNAL: "LB_ERR_INTERNAL",
    LB_ERR_NOT_FOUND: "LB_ERR_NOT_FOUND",
}


class DeviceProps(ctypes.Structure):
    """lb_device_props_t."""

    c_name = "lb_device_props_t"  # tests compare sizeof/offsetof against the C compiler's
    _fields_ = [
        ("name", c_char * 256),
        ("cc_major", c_int32),
        ("cc_minor", c_int32),
        ("sm_count", c_int32),
        ("max_threads_per_sm", c_int32),
        ("total_mem_bytes", c_uint64),
        ("smem_per_block_optin", c_int32),
        ("smem_per_sm", c_int32),
        ("l2_bytes", c_int32),
        ("mem_clock_khz", c_int32),
        ("mem_bus_width_bits", c_int32),
        ("pci_bus_id", c_int32),
    ]


class MkConfig(ctypes.Structure):
    """lb_mk_config_t (megakernel)."""

    c_name = "lb_mk_config_t"
    _fields_ = [
        ("n_layers", c_int32),
        ("vocab", c_int32),
        ("max_context", c_int32),
        ("n_blocks", c_int32),
        ("blocks_per_sm", c_int32),
        ("threads", c_int32),
        ("device", c_int32),
        ("rms_eps", ctypes.c_float),
        ("rope_theta", ctypes.c_float),
        ("ring_slots", c_int32),
        ("ring_slot_bytes", c_int32),
        ("ring_hold", c_int32),
    ]


class MkInfo(ctypes.Structure):
    """lb_mk_info_t (megakernel)."""

    c_name = "lb_mk_info_t"
    _fields_ = [
        ("n_blocks", c_int32),
        ("threads", c_int32),
        ("nslots", c_int32),
        ("max_blocks_per_sm", c_int32),
        ("sm_count", c_int32),
        ("max_splits", c_int32),
        ("smem_bytes", c_uint64),
        ("weight_bytes", c_uint64),
        ("state_bytes", c_uint64),
    ]


# ---- THE declaration table: one row per LB_API function in lucebox.h, in the header's order --------
# Later sections (ops, megakernel, dflash) append their rows under a comment naming the section.
# Pointer parameters: POINTER(<ctypes type>) for host outputs, c_void_p for device pointers, streams and
# opaque handles; a POD struct gets a ctypes.Structure here with `c_name = "<its C typedef>"`.
DECLS: dict[str, tuple[Any, list[Any]]] = {
    # core
    "lb_abi_version": (c_int, []),
    "lb_build_info": (c_char_p, []),
    "lb_last_error": (c_char_p, []),
    "lb_device_count": (c_int, [POINTER(c_int)]),
    "lb_device_props": (c_int, [c_int, POINTER(DeviceProps)]),
    "lb_cuda_versions": (c_int, [POINTER(c_int), POINTER(c_int)]),
    "lb_set_pdl": (c_int, [c_int]),
    # ops
    "lb_gemm_bf16": (c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, c_int, c_int, c_int, c_int, ctypes.c_void_p]),
    "lb_gemm_bf16_cublas": (c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, c_int, c_int, c_int, c_int,
                                    ctypes.c_void_p]),
    "lb_gemm_bf16_cublas_resid_norm": (c_int, [ctypes.c_void_p] * 5 + [c_int, c_int, c_int, ctypes.c_float,
                                                                       ctypes.c_void_p]),
    "lb_pf_rmsnorm_bf16": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_float, ctypes.c_void_p]),
    "lb_deltanet_chunked_scratch_bytes": (c_uint64, [c_int, c_int]),
    "lb_deltanet_chunked": (c_int, [ctypes.c_void_p] * 8 + [c_int, c_int, ctypes.c_void_p]),
    "lb_deltanet_chunked_path": (c_int, []),
    "lb_attn_prefill": (c_int, [ctypes.c_void_p] * 4 + [c_int, c_int, ctypes.c_void_p] + [c_int] * 5 + [ctypes.c_void_p]),
    "lb_attn_prefill_tc": (c_int, [ctypes.c_void_p] * 4 + [c_int, c_int] + [ctypes.c_void_p] * 2 + [c_int] * 6
                           + [ctypes.c_void_p]),
    # quantized matrix ops (cuda/ops/gemv_q.cu, gemm_q_smalln.cu, quant_repack.cu)
    "lb_quant_bytes": (c_uint64, [c_int, c_int, c_int]),
    "lb_quant_repack": (c_int, [c_int, ctypes.c_void_p, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p]),
    "lb_quant_fill_random": (c_int, [c_int, ctypes.c_void_p, c_int, c_int, c_uint64, ctypes.c_void_p]),
    "lb_gemv_q": (c_int, [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, ctypes.c_void_p, c_int, ctypes.c_void_p]),
    "lb_gemm_q_smalln": (c_int, [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p, c_int,
                                 ctypes.c_void_p]),
    "lb_gemv_q_pair": (c_int, [c_int, ctypes.c_void_p, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p, c_int,
                               ctypes.c_void_p, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p]),
    "lb_gemv_q_pair_merged": (c_int, [c_int, c_int]),
    # seg_rows (int32 [nseg]) and ys (float* [nseg]) are host arrays passed by address (c_void_p): the recorded
    # Programs of engines/dflash_layers.py keep them alive and pass the same addresses every replay
    "lb_gemm_q_smalln_seg": (c_int, [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, c_int, c_int,
                                     ctypes.c_void_p, ctypes.c_void_p, c_int, ctypes.c_void_p]),
    "lb_bench_qmm": (c_int, [c_int, c_int, c_int, c_int, c_int, POINTER(ctypes.c_float)]),
    "lb_qmm_smalln_select": (c_int, [c_int]),
    # cuBLAS at run time (cuda/core/cublas_rt.cu); the path buffer of lb_cublas_loaded is a create_string_buffer
    "lb_cublas_load": (c_int, [c_char_p]),
    "lb_cublas_loaded": (c_int, [c_char_p, c_int, POINTER(c_int)]),
    # fp16 dequantization and the cuBLAS quantized GEMM (cuda/ops/dequant_f16.cu, gemm_q_cublas.cu)
    "lb_dequant_f16": (c_int, [c_int, ctypes.c_void_p, ctypes.c_int64, c_int, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_void_p, ctypes.c_void_p]),
    "lb_blas_ready": (c_int, []),
    "lb_gemm_q_cublas_scratch_bytes": (c_uint64, [c_int, c_int, ctypes.c_int64]),
    "lb_gemm_q_cublas": (c_int, [c_int, ctypes.c_void_p, ctypes.c_int64, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p,
                                 c_int, ctypes.c_void_p, c_uint64, ctypes.c_void_p]),
    "lb_f32_to_f16": (c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]),
    "lb_gemm_q_cublas_x16": (c_int, [c_int, ctypes.c_void_p, ctypes.c_int64, c_int, ctypes.c_void_p, c_int,
                                     ctypes.c_void_p, c_int, ctypes.c_void_p, c_uint64, ctypes.c_void_p]),
    "lb_gemm_q_cublas_x16_h": (c_int, [c_int, ctypes.c_void_p, ctypes.c_int64, c_int, ctypes.c_void_p, c_int,
                                       ctypes.c_void_p, c_int, ctypes.c_void_p, c_uint64, ctypes.c_void_p]),
    "lb_gemm_f16w_cublas": (c_int, [ctypes.c_void_p, ctypes.c_int64, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p,
                                    c_int, ctypes.c_void_p]),
    "lb_cublas_set_sm_target": (c_int, [c_int]),
    # device buffers (cuda/ops/dev_buffers.cu)
    "lb_dev_alloc": (c_int, [c_uint64, POINTER(ctypes.c_void_p)]),
    "lb_dev_free": (c_int, [ctypes.c_void_p]),
    "lb_dev_h2d": (c_int, [ctypes.c_void_p, ctypes.c_void_p, c_uint64]),
    "lb_dev_d2h": (c_int, [ctypes.c_void_p, ctypes.c_void_p, c_uint64]),
    "lb_dev_memset": (c_int, [ctypes.c_void_p, c_int, c_uint64]),
    "lb_dev_sync": (c_int, []),
    "lb_stream_create": (c_int, [POINTER(ctypes.c_void_p)]),
    "lb_stream_destroy": (c_int, [ctypes.c_void_p]),
    # CUDA graphs, events, mapped host memory (cuda/core/graph.cu)
    "lb_graph_begin": (c_int, [ctypes.c_void_p]),
    "lb_graph_end": (c_int, [ctypes.c_void_p, POINTER(ctypes.c_void_p)]),
    "lb_graph_launch": (c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "lb_graph_destroy": (c_int, [ctypes.c_void_p]),
    "lb_event_create": (c_int, [POINTER(ctypes.c_void_p)]),
    "lb_event_record": (c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "lb_event_query": (c_int, [ctypes.c_void_p, POINTER(c_int)]),
    "lb_event_sync": (c_int, [ctypes.c_void_p]),
    "lb_event_destroy": (c_int, [ctypes.c_void_p]),
    "lb_host_alloc": (c_int, [c_uint64, POINTER(ctypes.c_void_p)]),
    "lb_host_free": (c_int, [ctypes.c_void_p]),
    # 27B DeltaNet (cuda/ops/gdn_*.cu)
    "lb_gdn_conv_prep": (c_int, [ctypes.c_void_p, c_int] + [ctypes.c_void_p] * 12 + [c_int] * 4 + [ctypes.c_void_p]),
    "lb_gdn_out_norm": (c_int, [ctypes.c_void_p, ctypes.c_void_p, c_int, ctypes.c_void_p, ctypes.c_void_p, c_int, c_int,
                                ctypes.c_float, ctypes.c_void_p]),
    "lb_gdn_tree_plan": (c_int, [POINTER(c_int32), c_int, POINTER(c_int32), POINTER(c_int)]),
    "lb_gdn_delta": (c_int, [ctypes.c_void_p] * 9 + [c_int] * 5 + [ctypes.c_void_p]),
    "lb_gdn_commit": (c_int, [ctypes.c_void_p] * 5 + [c_int] + [ctypes.c_void_p] * 3 + [c_int] * 3 + [ctypes.c_void_p]),
    "lb_gdn_step_scratch_bytes": (c_uint64, [c_int, c_int, c_int]),
    "lb_gdn_decode_step": (c_int, [ctypes.c_void_p] * 12 + [c_int] * 3 + [ctypes.c_float, ctypes.c_void_p]),
    "lb_gdn_decode_path": (c_int, [c_int] * 3),
    "lb_gdn_tree_verify": (c_int, [ctypes.c_void_p] * 18 + [c_int, ctypes.c_void_p] + [c_int] * 3
                           + [ctypes.c_float, ctypes.c_void_p]),
    "lb_gdn_chunked_scratch_bytes": (c_uint64, [c_int, c_int]),
    "lb_gdn_chunked": (c_int, [ctypes.c_void_p] * 8 + [c_int] * 3 + [ctypes.c_void_p]),
    "lb_gdn_prefill_scratch_bytes": (c_uint64, [c_int, c_int, c_int]),
    "lb_gdn_prefill": (c_int, [ctypes.c_void_p] * 12 + [c_int] * 3 + [ctypes.c_float, ctypes.c_void_p]),
    "lb_gdn_prefill_ld": (c_int, [ctypes.c_void_p] * 4 + [c_int] * 2 + [ctypes.c_void_p] * 8 + [c_int] * 3
                          + [ctypes.c_float, ctypes.c_void_p]),
    # 27B gated attention (cuda/ops/attn_rope.cu, attn_decode.cu, attn_tree.cu)
    "lb_attn_prep": (c_int, [ctypes.c_void_p, c_int, ctypes.c_void_p, ctypes.c_void_p, c_int] + [ctypes.c_void_p] * 3
                     + [c_int] + [ctypes.c_void_p] * 3 + [c_int] * 6 + [ctypes.c_float, ctypes.c_float, ctypes.c_void_p]),
    "lb_attn_prep_ld": (c_int, [ctypes.c_void_p, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p, c_int]
                        + [ctypes.c_void_p] * 3 + [c_int] + [ctypes.c_void_p] * 3 + [c_int] * 6
                        + [ctypes.c_float, ctypes.c_float, ctypes.c_void_p]),
    "lb_attn_partials_bytes": (c_uint64, [c_int, c_int, c_int]),
    "lb_attn_decode": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p,
                               ctypes.c_void_p] + [c_int] * 5 + [ctypes.c_void_p]),
    "lb_attn_tree": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p,
                             ctypes.c_void_p, c_int, ctypes.c_void_p] + [c_int] * 5 + [ctypes.c_void_p]),
    "lb_attn_causal": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p,
                               ctypes.c_void_p] + [c_int] * 6 + [ctypes.c_void_p]),
    "lb_attn_prep_at": (c_int, [ctypes.c_void_p, c_int, ctypes.c_void_p, ctypes.c_void_p, c_int] + [ctypes.c_void_p] * 7
                        + [c_int] * 6 + [ctypes.c_float, ctypes.c_float, ctypes.c_void_p]),
    "lb_attn_decode_at": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p,
                                  ctypes.c_void_p, c_int, ctypes.c_void_p] + [c_int] * 3 + [ctypes.c_void_p]),
    "lb_attn_tree_at": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p,
                                ctypes.c_void_p, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p] + [c_int] * 3
                        + [ctypes.c_void_p]),
    # one kernel per decode step and layer (cuda/ops/attn_decode_fused.cu): n_past on the host / on the device
    "lb_attn_decode_fused": (c_int, [ctypes.c_void_p] * 5 + [c_int] + [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p,
                                     ctypes.c_void_p, c_int, ctypes.c_void_p] + [c_int] * 4
                             + [ctypes.c_float, ctypes.c_float, ctypes.c_void_p]),
    "lb_attn_decode_fused_at": (c_int, [ctypes.c_void_p] * 9 + [c_int, ctypes.c_void_p, ctypes.c_void_p, c_int,
                                                                ctypes.c_void_p] + [c_int] * 4
                                + [ctypes.c_float, ctypes.c_float, ctypes.c_void_p]),
    # megakernel
    "lb_mk_create": (c_int, [POINTER(MkConfig), POINTER(ctypes.c_void_p)]),
    "lb_mk_free": (c_int, [ctypes.c_void_p]),
    "lb_mk_get_info": (c_int, [ctypes.c_void_p, POINTER(MkInfo)]),
    "lb_mk_set_weight": (c_int, [ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, c_uint64]),
    "lb_mk_reset": (c_int, [ctypes.c_void_p]),
    "lb_mk_poison": (c_int, [ctypes.c_void_p]),
    "lb_mk_decode": (c_int, [ctypes.c_void_p, POINTER(c_int32), c_int, c_int, POINTER(c_int32), POINTER(ctypes.c_float)]),
    "lb_mk_decode_start": (c_int, [ctypes.c_void_p, POINTER(c_int32), c_int, c_int, c_int]),
    "lb_mk_decode_poll": (c_int, [ctypes.c_void_p, POINTER(c_int32), POINTER(c_int)]),
    "lb_mk_decode_finish": (c_int, [ctypes.c_void_p, POINTER(c_int32), POINTER(ctypes.c_float)]),
    "lb_mk_position": (c_int, [ctypes.c_void_p, POINTER(c_int), POINTER(c_int)]),
    "lb_mk_last_time_ms": (c_int, [ctypes.c_void_p, POINTER(ctypes.c_float)]),
    "lb_mk_read": (c_int, [ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, c_uint64]),
    # tensor-core prefill (cuda/prefill/)
    "lb_mk_prefill_create": (c_int, [ctypes.c_void_p, c_int, POINTER(ctypes.c_void_p)]),
    "lb_mk_prefill_create_ex": (c_int, [ctypes.c_void_p, c_int, c_int, POINTER(ctypes.c_void_p)]),
    "lb_mk_prefill_gemm": (c_int, [ctypes.c_void_p]),
    "lb_mk_prefill_attn": (c_int, [ctypes.c_void_p]),
    "lb_mk_prefill_free": (c_int, [ctypes.c_void_p]),
    "lb_mk_prefill": (c_int, [ctypes.c_void_p, POINTER(c_int32), c_int, POINTER(ctypes.c_float), POINTER(c_int32)]),
    # dflash
    "lb_df_rmsnorm": (c_int, [ctypes.c_void_p] * 3 + [c_int, c_int, ctypes.c_float, ctypes.c_void_p, c_uint64,
                                                       ctypes.c_void_p, c_uint64, ctypes.c_void_p]),
    "lb_df_swiglu": (c_int, [ctypes.c_void_p] * 3 + [c_uint64, ctypes.c_void_p]),
    "lb_df_swiglu_f16": (c_int, [ctypes.c_void_p] * 3 + [c_uint64, ctypes.c_void_p]),
    "lb_df_swiglu_f16_rows": (c_int, [ctypes.c_void_p, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p]),
    "lb_df_rmsnorm_f16": (c_int, [ctypes.c_void_p] * 3 + [c_int, c_int, ctypes.c_float, ctypes.c_void_p]),
    "lb_df_copy": (c_int, [ctypes.c_void_p, ctypes.c_void_p, c_uint64, ctypes.c_void_p]),
    "lb_df_kv_compact": (c_int, [ctypes.c_void_p, ctypes.c_void_p] + [c_int] * 5 + [ctypes.c_void_p]),
    "lb_df_topk_scratch_bytes": (c_uint64, [c_int, c_int, c_int]),
    "lb_df_topk": (c_int, [ctypes.c_void_p, c_int, c_int, c_int, c_int] + [ctypes.c_void_p] * 4),
    # device-resident greedy loop (cuda/dflash/df_embed.cu)
    "lb_df_embed_q": (c_int, [c_int, ctypes.c_void_p, c_int, c_int, ctypes.c_void_p, c_int, ctypes.c_void_p,
                              ctypes.c_void_p]),
    "lb_df_greedy_advance": (c_int, [ctypes.c_void_p] * 3 + [c_int, ctypes.c_void_p]),
}


def repo_build_dir() -> Path:
    """$LUCEBOX_BUILD_DIR, else <checkout>/build (the Makefile's BUILD_DIR), else ./build."""
    env = os.environ.get(BUILD_DIR_ENV)
    if env:
        return Path(env)
    from lucebox_cli.config import repo_root

    root = repo_root()
    return (root if root is not None else Path.cwd()) / "build"


def lib_path(profile_name: str, build_dir: Optional[Path] = None) -> Path:
    return (build_dir or repo_build_dir()) / profile_name / LIB_NAME


def built_libs(build_dir: Optional[Path] = None) -> dict[str, Path]:
    """Profile name → library path for every build/<profile>/liblucebox.so present."""
    folder = build_dir or repo_build_dir()
    if not folder.is_dir():
        return {}
    return {p.parent.name: p for p in sorted(folder.glob(f"*/{LIB_NAME}"))}


@functools.lru_cache(maxsize=None)
def _open(path: str, mtime_ns: int) -> ctypes.CDLL:
    """dlopen once per (path, mtime) and apply DECLS; a missing symbol is reported by name."""
    try:
        cdll = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as err:
        raise EngineUnavailable(f"cannot load {path}: {err}", hint="rebuild it with `make build PROFILE=…`") from None
    for name, (restype, argtypes) in DECLS.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            raise ProfileMismatch(
                f"{path} has no {name}: it was built from an older source tree",
                hint=f"make build PROFILE={Path(path).parent.name}",
            ) from None
        fn.restype = restype
        fn.argtypes = argtypes
    return cdll


def _status_error(status: int, message: str) -> LuceboxError:
    if status == LB_ERR_OUT_OF_MEMORY:
        return OutOfMemory(message, hint="lower --max-context or the budget, or free GPU memory")
    if status in (LB_ERR_NO_DRIVER, LB_ERR_NO_DEVICE):
        return EngineUnavailable(message, hint="use --engine cpu on a machine without a usable GPU")
    if status == LB_ERR_INVALID_ARG:
        return UsageError(message)
    if status == LB_ERR_UNSUPPORTED:
        return ProfileMismatch(message, hint="rebuild for this GPU: make build PROFILE=…")
    if status == LB_ERR_NOT_FOUND:
        return EngineUnavailable(message, hint="set LUCEBOX_CUBLAS=/path/to/libcublas.so.N, or LUCEBOX_PREFILL_GEMM=own")
    return LuceboxError(message, hint="rerun with LUCEBOX_DEBUG=1 and report it")


@dataclass
class Lib:
    """An opened liblucebox.so. `fn.<name>` are the raw ctypes functions; `check()` turns a status
    into a LuceboxError carrying lb_last_error()."""

    path: Path
    cdll: ctypes.CDLL = field(repr=False)
    profile: Optional[str] = None

    @property
    def fn(self) -> ctypes.CDLL:
        return self.cdll

    def last_error(self) -> str:
        return (self.cdll.lb_last_error() or b"").decode("utf-8", "replace")

    def check(self, status: int, what: str) -> None:
        if status != LB_OK:
            detail = self.last_error() or STATUS_NAMES.get(status, f"status {status}")
            raise _status_error(status, f"{what}: {detail}")

    def call(self, name: str, *args: Any) -> None:
        """Call an lb_status-returning function and raise on failure."""
        self.check(getattr(self.cdll, name)(*args), name)

    def abi_version(self) -> int:
        return int(self.cdll.lb_abi_version())

    def build_info(self) -> dict[str, Any]:
        return json.loads(self.cdll.lb_build_info().decode())

    def device_count(self) -> int:
        """Raises EngineUnavailable (with the reason) when there is no driver or device."""
        count = c_int(0)
        self.call("lb_device_count", ctypes.byref(count))
        return count.value

    def device_props(self, dev: int) -> dict[str, Any]:
        props = DeviceProps()
        self.call("lb_device_props", dev, ctypes.byref(props))
        return _props_dict(dev, props)

    def cuda_versions(self) -> dict[str, Optional[str]]:
        driver, runtime = c_int(0), c_int(0)
        self.cdll.lb_cuda_versions(ctypes.byref(driver), ctypes.byref(runtime))
        return {"driver": _cuda_version_str(driver.value), "runtime": _cuda_version_str(runtime.value)}


def _cuda_version_str(v: int) -> Optional[str]:
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None


def _props_dict(dev: int, p: DeviceProps) -> dict[str, Any]:
    d = {name: getattr(p, name) for name, _ in DeviceProps._fields_}
    d["name"] = p.name.decode("utf-8", "replace")
    d["index"] = dev
    d["compute_capability"] = f"{p.cc_major}.{p.cc_minor}"
    d["memory_gb"] = round(p.total_mem_bytes / 1e9, 1)
    return d


def open_lib(path: Path, profile: Optional[str] = None) -> Lib:
    """Open a library file without checks (doctor uses this to read build info of every build)."""
    if not path.is_file():
        raise EngineUnavailable(f"{path} is not built", hint=f"make build PROFILE={profile or path.parent.name}")
    return Lib(path=path, cdll=_open(str(path), path.stat().st_mtime_ns), profile=profile)


def cublas_ready(lib: Any) -> bool:
    """Whether the library's lb::blas (cuda/core/cublas_gemm.cuh) can run cuBLAS GEMMs now: loads a cuBLAS first
    (engines/cublas.py: once per process; LUCEBOX_CUBLAS=off keeps it unloaded), then asks lb_blas_ready(). False
    for a library (or test double) without it. Never raises. The one place the 27B engine asks."""
    fn = getattr(lib, "fn", None)
    probe = getattr(fn, "lb_blas_ready", None) if fn is not None else None
    if probe is None:
        return False
    try:
        if hasattr(fn, "lb_cublas_load"):
            from lucebox_cli.engines import cublas

            if not cublas.load(lib).loaded:  # also LUCEBOX_CUBLAS=off after another engine loaded one
                return False
        return bool(probe())
    except (OSError, TypeError, ValueError, LuceboxError):
        return False


def compiled_archs(lib: Lib) -> list[str]:
    return list(lib.build_info().get("archs", []))


def load(profile: Any, build_dir: Optional[Path] = None) -> Lib:
    """Open build/<profile>/liblucebox.so, check ABI and compiled arch. `profile` is a Profile or a name."""
    from lucebox_cli.config import Profile, arch_number, get_profile

    prof: Profile = profile if isinstance(profile, Profile) else get_profile(str(profile))
    fix = f"make build PROFILE={prof.name}"
    lib = open_lib(lib_path(prof.name, build_dir), prof.name)
    if lib.abi_version() != ABI_VERSION:
        raise ProfileMismatch(
            f"{lib.path} has C ABI {lib.abi_version()}, this lucebox needs {ABI_VERSION}", hint=fix
        )
    archs = compiled_archs(lib)
    if prof.arch_number not in {arch_number(a) for a in archs}:
        raise ProfileMismatch(
            f"{lib.path} is compiled for {', '.join(archs) or 'no arch'}, profile {prof.name} needs {prof.arch}",
            hint=fix,
        )
    return lib


# ---- GPU detection: never raises -------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProbe:
    gpus: list[dict[str, Any]]
    reason: Optional[str]  # why there are no GPUs (None when some were found)
    source: str  # "liblucebox", "libcuda" or "none"
    driver: Optional[str] = None  # CUDA driver version, e.g. "13.0"


def probe_gpus(build_dir: Optional[Path] = None) -> GpuProbe:
    """GPUs through a built liblucebox.so, else through libcuda (driver API), else none, with the reason."""
    if os.environ.get(FORCE_NO_GPU_ENV) == "1":
        return GpuProbe([], f"{FORCE_NO_GPU_ENV}=1", "none")
    for path in built_libs(build_dir).values():
        try:
            return _probe_with_lib(open_lib(path))
        except LuceboxError:
            continue
    return _probe_with_libcuda()


def gpu_count(build_dir: Optional[Path] = None) -> int:
    """Number of usable GPUs; 0 with no GPU, no driver or anything else wrong."""
    return len(probe_gpus(build_dir).gpus)


def gpu_info(build_dir: Optional[Path] = None) -> list[dict[str, Any]]:
    """One dict per GPU: index, name, cc_major, cc_minor, compute_capability, sm_count, total_mem_bytes, …"""
    return probe_gpus(build_dir).gpus


def _probe_with_lib(lib: Lib) -> GpuProbe:
    driver = lib.cuda_versions()["driver"]
    count = c_int(0)
    status = lib.cdll.lb_device_count(ctypes.byref(count))
    if status == LB_ERR_NO_DRIVER:
        reason = "no NVIDIA driver" if driver is None else f"NVIDIA driver {driver} is too old for this build"
        return GpuProbe([], reason, "liblucebox", driver)
    if status != LB_OK:
        return GpuProbe([], f"no usable GPU ({lib.last_error()})", "liblucebox", driver)
    try:
        gpus = [lib.device_props(i) for i in range(count.value)]
    except LuceboxError as err:
        return GpuProbe([], f"device query failed: {err.message}", "liblucebox", driver)
    return GpuProbe(gpus, None, "liblucebox", driver)


# CUdevice_attribute values (cuda.h), for the driver-API fallback.
_CU_ATTRS = {
    "sm_count": 16,
    "mem_clock_khz": 36,
    "mem_bus_width_bits": 37,
    "l2_bytes": 38,
    "max_threads_per_sm": 39,
    "cc_major": 75,
    "cc_minor": 76,
    "smem_per_sm": 81,
    "smem_per_block_optin": 97,
    "pci_bus_id": 33,
}


def _probe_with_libcuda() -> GpuProbe:
    """Driver API through libcuda.so.1: works without a built library (and without the CUDA toolkit)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return GpuProbe([], "no NVIDIA driver (libcuda.so.1 not found)", "none")
    try:
        return _libcuda_devices(cuda)
    except (AttributeError, OSError) as err:
        return GpuProbe([], f"libcuda unusable: {err}", "libcuda")


def _libcuda_devices(cuda: ctypes.CDLL) -> GpuProbe:
    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what} returned CUresult {rc}")

    version = c_int(0)
    driver = _cuda_version_str(version.value) if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    rc = cuda.cuInit(0)
    if rc != 0:
        # 100 = CUDA_ERROR_NO_DEVICE
        reason = "no CUDA device" if rc == 100 else f"cuInit failed (CUresult {rc})"
        return GpuProbe([], reason, "libcuda", driver)
    count = c_int(0)
    ok(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    gpus = []
    for i in range(count.value):
        dev = c_int(0)
        ok(cuda.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        ok(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        total = ctypes.c_size_t(0)
        ok(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem")
        info: dict[str, Any] = {"name": name.value.decode("utf-8", "replace"), "total_mem_bytes": total.value}
        for key, attr in _CU_ATTRS.items():
            value = c_int(0)
            info[key] = value.value if cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0 else 0
        info["index"] = i
        info["compute_capability"] = f"{info['cc_major']}.{info['cc_minor']}"
        info["memory_gb"] = round(total.value / 1e9, 1)
        gpus.append(info)
    reason = None if gpus else "no CUDA device"
    return GpuProbe(gpus, reason, "libcuda", driver)
