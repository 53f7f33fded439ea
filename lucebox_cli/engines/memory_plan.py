"""Device memory plan of the 27B target engine (+ an optional DFlash draft), checked before allocating.

Pure Python: every item is computed from the model config and the tensor byte sizes (read from a GGUF's
tensor infos, or derived from a config and a quantization mix for planning without the file), so a
plan can be made on any machine and the engine allocates exactly the buffers listed here
(`target_buffers` is the one description both use).

    p = plan(cfg, GGUFModel(path), context=16384, budget=22, draft=DFLASH_27B_BF16)
    print(p.table())
    fit(p, card_bytes)                   # OutOfMemory saying up to which context it would fit
    largest_context(cfg, sizes, card_bytes, budget=22, draft=DFLASH_27B_BF16)

Items: target weights (token_embd stays on the host when the head is untied: the engine dequantizes
the few rows it embeds from the memory-mapped file), the f16 K/V cache of the attention layers, the
DeltaNet recurrent (fp32) and conv states, the verify/prefill scratch for a tree budget (per-row
activations, the per-layer tree inputs kept until commit, branch states, attention partials, logits
rows × vocab fp32), with the cuBLAS prefill GEMM on (`cublas=True`) its fp16 scratch, with resident fp16 prefill
weights (`prefill_f16=True`, LUCEBOX_PREFILL_WEIGHTS=f16) every layer matrix again in fp16, the draft's weights, its
context K/V cache and its scratch, and a margin for the CUDA context, module images and allocator slack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from lucebox_cli.config import RunDefaults
from lucebox_cli.errors import OutOfMemory, UsageError
from lucebox_cli.models.qwen35 import ATTENTION, DELTANET, Qwen35Config, expected_tensors

GIB = 1 << 30
MIB = 1 << 20
# The CUDA context, the library's module images and allocator rounding: not measured on a 3090 yet;
# a context costs ~300 MiB on Ampere and the .so's kernels are a few tens of MiB.
CUDA_OVERHEAD = 640 * MIB
ALIGN = 256
CHUNK = 64  # the most tree slots one verify takes, and the columns of one quantized GEMM call (the small-N limit)
PREFILL_ROWS = RunDefaults.prefill_rows  # rows of one prefill pass unless the profile says otherwise
ATTN_SPLITS_ONE = 64  # split-KV blocks per kv head for a single query (decode)
ATTN_SPLITS_MANY = 16  # for prefill chunks and tree verify
D = 128  # DeltaNet dk = dv, the only size the ops take
# The cuBLAS prefill GEMM (lb_gemm_q_cublas): products of at least CUBLAS_MIN_ROWS columns go through it when the
# engine turned it on. Why 256 (H200, 27B Q4_K_M): each call first writes the weights as fp16 and reads them
# back (~4.6 B per weight of HBM traffic: ~31 ms per pass over the 27B), then runs at ~460-580 TFLOP/s
# (~0.1 ms per token over the 27B); the small-N kernel costs ~16.7 ms per 64 columns. 192 columns: ~50 ms either
# way; 256: ~56 ms against 67 ms. Below it, and in every verify (at most CHUNK slots) and decode step, the small-N
# kernels run: CUDA-graph captures never contain a cuBLAS call.
CUBLAS_MIN_ROWS = 256
HEAD_DIM = 256  # the attention ops' head_dim


def _al(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class DraftSpec:
    """What the plan needs of a DFlash draft: its weight bytes and the shape of its context K/V cache."""

    weight_bytes: int
    n_layers: int = 5
    n_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 5120
    ffn: int = 17408
    block_size: int = 16
    n_taps: int = 5
    kv_bytes: int = 2  # bf16 cache
    label: str = "BF16 draft"

    @property
    def kv_per_token(self) -> int:
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.kv_bytes

    def scratch_bytes(self, vocab: int) -> int:
        """Block activations, the fused-feature chunk of up to CHUNK new context rows, draft logits."""
        block = self.block_size * (4 * self.hidden + 2 * self.ffn) * 4
        feats = CHUNK * (self.n_taps + 1) * self.hidden * 4
        logits = (self.block_size - 1) * vocab * 4
        return _al(block) + _al(feats) + _al(logits)


def dflash_draft_27b(dtype_bytes: int = 2, label: str = "BF16 draft") -> DraftSpec:
    """z-lab/Qwen3.5-27B-DFlash: 5 layers, hidden 5120, 32 q / 8 kv heads of 128, SwiGLU 17408, fc 25600->5120."""
    h, ffn, nq, nkv, hd, layers = 5120, 17408, 32, 8, 128, 5
    per_layer = h * nq * hd + 2 * h * nkv * hd + nq * hd * h + 3 * h * ffn + 2 * h + 2 * hd
    params = layers * per_layer + 5 * h * h + 2 * h
    return DraftSpec(weight_bytes=params * dtype_bytes, label=label)


DFLASH_27B_BF16 = dflash_draft_27b()


def qwen35_27b_config() -> Qwen35Config:
    """Qwen3.5-27B (and 3.6-27B): the shapes of shared/reference/qwen35.md, for planning without a file."""
    kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(64))
    return Qwen35Config(hidden=5120, n_layers=64, n_heads=24, n_kv_heads=4, head_dim=256, hk=16, hv=48, dk=128,
                        dv=128, conv_kernel=4, ffn=17408, vocab=248320, rope_theta=1e7, rope_dims=64, eps=1e-6,
                        tied=False, layer_types=kinds, full_attention_interval=4)


# ---- tensor sizes ----


@dataclass(frozen=True)
class TensorSize:
    ggml_type: str
    shape: tuple[int, ...]
    nbytes: int


Sizes = Mapping[str, TensorSize]


def sizes_from_gguf(model: Any) -> dict[str, TensorSize]:
    """{name: TensorSize} from an open GGUFModel's tensor infos (no tensor data is read)."""
    out = {}
    for name in model.tensor_names:
        info = model.tensor_info(name)
        out[name] = TensorSize(info.ggml_type, tuple(info.shape), int(info.nbytes))
    return out


def sizes_from_mix(cfg: Qwen35Config, ftype: str = "Q4_K_M") -> dict[str, TensorSize]:
    """{name: TensorSize} of the file llama_model_quantize would write for cfg in `ftype`."""
    from lucebox_cli.gguf_io import tensor_nbytes
    from lucebox_cli.quant.mixes import choose_types

    shapes = expected_tensors(cfg)
    types = choose_types(((n, s, "F32") for n, s in shapes.items()), ftype, cfg.n_layers)
    return {n: TensorSize(types[n], tuple(s), tensor_nbytes(types[n], s)) for n, s in shapes.items()}


def on_device(name: str, cfg: Qwen35Config) -> bool:
    """token_embd lives on the device only when it is also the (tied) LM head."""
    return name != "token_embd.weight" or cfg.tied


def weight_bytes(cfg: Qwen35Config, sizes: Sizes) -> int:
    return sum(_al(s.nbytes) for n, s in sizes.items() if on_device(n, cfg))


# ---- the target engine's buffers (the engine allocates exactly these) ----


def _proj_width(cfg: Qwen35Config) -> int:
    """Floats per row of the projection buffer: the widest layer's outputs side by side."""
    gdn = cfg.conv_channels + cfg.hv * cfg.dv + 2 * cfg.hv
    attn = 2 * cfg.n_heads * cfg.head_dim + 2 * cfg.n_kv_heads * cfg.head_dim
    return max(gdn, attn, 2 * cfg.ffn)


def _act_width(cfg: Qwen35Config) -> int:
    return max(cfg.hv * cfg.dv, cfg.n_heads * cfg.head_dim, cfg.ffn)


def gdn_prefill_scratch(t: int, hk: int, hv: int) -> int:
    """lb_gdn_prefill_scratch_bytes (cuda/ops/gdn_chunked.cu), which also covers lb_gdn_step_scratch_bytes."""
    step = t * (2 * hk * D + 2 * hv * D + 2 * hv) * 4
    tp = (t + 63) // 64 * 64
    # pf::dn_scratch_bytes: u, w, Aqk, cum and the split scan's chunk start states (deltanet_chunked.cuh)
    dn = (hv * t * D + hv * tp * D + hv * tp * 64 + hv * tp + hv * (tp // 64) * D * D) * 4
    chunked = _al(dn) + 3 * _al(hv * t * D * 4) + 2 * _al(hv * t * 4) + _al(hv * D * D * 4)
    return _al(step) + chunked


def attn_partials(tq: int, n_heads: int, max_splits: int) -> int:
    """lb_attn_partials_bytes (cuda/ops/attn_decode.cu)."""
    return max_splits * tq * n_heads * (HEAD_DIM + 2) * 4 if max_splits > 1 else 0


def cublas_scratch(n: int, k: int, chunk_rows: int) -> int:
    """lb_gemm_q_cublas_scratch_bytes (cuda/ops/gemm_q_cublas.cu): x as fp16 [n, k] + one fp16 weight chunk."""
    return _al(2 * n * k) + _al(2 * chunk_rows * k)


def cublas_gemm_scratch(cfg: Qwen35Config, rows: int) -> int:
    """The engine's lb_gemm_q_cublas scratch for passes of `rows` rows: x at the widest K (ffn_down's) and a
    chunk that holds the largest layer product whole: the FFN's gate + up as one tensor of 2·ffn rows
    (LUCEBOX_PREFILL_GU=merged16, lb_gemm_q_cublas_x16_h; 356 MB fp16 on the 27B), so every product is one
    dequantization and one cublasGemmEx at full size. Sized so whichever LUCEBOX_PREFILL_GU the engine reads (the
    plan does not know it): split uses half the chunk, +178 MB on the H200 that buys nothing there. Only plans with
    a cuBLAS pass (rows >= CUBLAS_MIN_ROWS: the H200's 1024-row passes, never the 3090's 64) carry it. Chunks
    small enough to stay in L2 (~24 MB: ~2,400 rows at K = 5120) would save most of that traffic, but cuBLAS already
    drops from 584 to 462 TFLOP/s going from 34816 to 6144 rows at M = 520 (H200), and a ~2,400-row GEMM fills fewer
    tiles still: an estimate, not measured, that the loss matches the saving; lb_gemm_q_cublas takes any chunk the
    scratch holds, so it can be measured."""
    ks = (cfg.hidden, cfg.ffn, cfg.hv * cfg.dv, cfg.n_heads * cfg.head_dim)
    mats = (2 * cfg.ffn * cfg.hidden, cfg.conv_channels * cfg.hidden, 2 * cfg.n_heads * cfg.head_dim * cfg.hidden,
            cfg.hidden * cfg.hv * cfg.dv, cfg.hidden * cfg.n_heads * cfg.head_dim)
    return _al(2 * rows * max(ks)) + _al(2 * max(mats))


def prefill_f16_bytes(cfg: Qwen35Config, sizes: Sizes) -> int:
    """Device bytes of the resident fp16 prefill weights: every quantized layer matrix (blk.*, two dimensions; the
    engine's Mats of those names) as fp16 rows, 2 B a weight, each 256-aligned as the engine's arena takes them.
    Not the LM head or the embedding: a prefill's LM-head product is one row (the GEMV), the embedding a lookup.
    Why a plan item: on the 27B it is 48.7 GB, more than the quantized weights, so only large cards can keep it."""
    return sum(_al(2 * math.prod(s.shape)) for n, s in sizes.items()
               if n.startswith("blk.") and len(s.shape) == 2 and s.ggml_type not in ("F32", "F16", "BF16"))


def cublas_on(cublas: bool, rows: int) -> bool:
    """Whether a pass of `rows` rows can reach the cuBLAS path at all (else it costs no scratch)."""
    return bool(cublas) and rows >= CUBLAS_MIN_ROWS


TOPK_MAX_K = 8  # lb_df_topk's largest k


def topk_scratch(rows: int, cols: int, k: int) -> int:
    """lb_df_topk_scratch_bytes (cuda/dflash/df_argmax.cu): k (value, column) pairs per column block."""
    col_blocks = min(-(-cols // 2048), 128)
    return rows * col_blocks * k * 8 if rows >= 1 and cols >= 1 and k >= 1 else 0


@dataclass(frozen=True)
class Buffer:
    """One device buffer of the target engine: plan category, name, bytes (256-aligned), and whether
    it is scratch (poisoned by tests; holds nothing between calls) or state."""

    category: str
    name: str
    nbytes: int
    scratch: bool


def check_prefill_rows(rows: int) -> int:
    """rows of one prefill pass: a positive multiple of CHUNK (a pass runs its GEMMs CHUNK columns at a time)."""
    if rows < CHUNK or rows % CHUNK:
        raise UsageError(f"prefill rows {rows}: need a positive multiple of {CHUNK}")
    return int(rows)


def buffer_list(cfg: Qwen35Config, *, context: int, budget: int, prefill_rows: int = PREFILL_ROWS,
                cublas: bool = False) -> list[Buffer]:
    """Every buffer the target engine allocates besides weights, in carving order. The activations, the
    DeltaNet scratch and the attention partials hold one prefill pass (prefill_rows rows; a verify's slots
    are fewer); the logits and the tree index hold CHUNK rows (a prefill needs the last row's logits only).
    cublas: the cuBLAS prefill GEMM is on (its scratch is listed when cublas_on(cublas, prefill_rows))."""
    slots = budget + 1
    if not 1 <= slots <= CHUNK:
        raise UsageError(f"tree budget {budget} outside 0..{CHUNK - 1} (one verify takes at most {CHUNK} slots)")
    c, vd, kd, rows = cfg.conv_channels, cfg.hv * cfg.dv, cfg.hk * cfg.dk, check_prefill_rows(prefill_rows)
    out: list[Buffer] = []

    def add(cat: str, name: str, nbytes: int, scratch: bool) -> None:
        out.append(Buffer(cat, name, _al(nbytes), scratch))

    for i in range(cfg.n_layers):
        if cfg.is_attention(i):
            for kv in ("k", "v"):
                add("kv_cache", f"{kv}_cache.{i}", cfg.n_kv_heads * context * cfg.head_dim * 2, False)
        else:
            add("deltanet_state", f"state.{i}", cfg.hv * cfg.dk * cfg.dv * 4, False)
            add("conv_state", f"conv.{i}", (cfg.conv_kernel - 1) * c * 4, False)
            # a verify's per-slot inputs, read by commit: state, not scratch
            for name, width in (("pre", c), ("k", kd), ("v", vd), ("g", cfg.hv), ("beta", cfg.hv)):
                add("tree_inputs", f"tree_{name}.{i}", slots * width * 4, False)
    for name, width in (("x", cfg.hidden), ("h", cfg.hidden), ("proj", _proj_width(cfg)), ("act", _act_width(cfg)),
                        ("qf", cfg.n_heads * cfg.head_dim)):
        add("activations", name, rows * width * 4, True)
    add("gdn_scratch", "gdn_scratch", gdn_prefill_scratch(rows, cfg.hk, cfg.hv), True)
    add("tree_inputs", "tree_q", slots * kd * 4, True)
    add("tree_inputs", "tree_o", slots * vd * 4, True)
    add("tree_saves", "saves", max(slots - 1, 1) * cfg.hv * cfg.dk * cfg.dv * 4, True)
    add("attn_partials", "partials", max(attn_partials(1, cfg.n_heads, ATTN_SPLITS_ONE),
                                         attn_partials(rows, cfg.n_heads, ATTN_SPLITS_MANY), 4), True)
    # the fused decode attention's per-kv-head tickets (lb_attn_decode_fused): zero between calls, so state
    # (the engine zeroes it at reset), not scratch (a NaN-poisoned counter would never reach its last block)
    add("attn_partials", "attn_tickets", 4 * cfg.n_kv_heads, False)
    add("logits", "logits", CHUNK * cfg.vocab * 4, True)
    add("argmax", "topk_scratch", topk_scratch(CHUNK, cfg.vocab, TOPK_MAX_K), True)
    add("argmax", "topk_ids", CHUNK * TOPK_MAX_K * 4, True)
    for name in ("parents", "positions", "masks", "path"):
        add("tree_index", name, CHUNK * 8, False)
    # int32 {n_past, token, steps}: what the engine's CUDA graphs read instead of host arguments
    add("tree_index", "gstate", 16, False)
    # int32 token ids of a pass whose embedding rows are made on the device (lb_df_embed_q)
    add("tree_index", "tokens", rows * 4, False)
    if cublas_on(cublas, rows):
        add("gemm_scratch", "gemm_scratch", cublas_gemm_scratch(cfg, rows), True)
    return out


def target_buffers(cfg: Qwen35Config, *, context: int, budget: int, prefill_rows: int = PREFILL_ROWS,
                   cublas: bool = False) -> dict[str, int]:
    """{plan category: bytes} of everything the target engine allocates besides weights."""
    out: dict[str, int] = {}
    for b in buffer_list(cfg, context=context, budget=budget, prefill_rows=prefill_rows, cublas=cublas):
        out[b.category] = out.get(b.category, 0) + b.nbytes
    return out


# ---- the plan ----


@dataclass(frozen=True)
class PlanItem:
    name: str
    nbytes: int
    note: str = ""


@dataclass(frozen=True)
class MemoryPlan:
    items: tuple[PlanItem, ...]
    context: int
    budget: int
    label: str
    cfg: Qwen35Config = field(repr=False)
    sizes: Sizes = field(repr=False)
    draft: Optional[DraftSpec] = None
    prefill_rows: int = PREFILL_ROWS
    cublas: bool = False
    prefill_f16: bool = False

    @property
    def total(self) -> int:
        return sum(i.nbytes for i in self.items)

    def bytes_of(self, name: str) -> int:
        return sum(i.nbytes for i in self.items if i.name == name)

    def table(self) -> str:
        lines = [f"{'item':<22} {'MiB':>10}  note"]
        for i in self.items:
            lines.append(f"{i.name:<22} {i.nbytes / MIB:>10.1f}  {i.note}")
        lines.append(f"{'total':<22} {self.total / MIB:>10.1f}  {self.label}, context {self.context}, budget {self.budget}")
        return "\n".join(lines)


def _label(cfg: Qwen35Config, sizes: Sizes, draft: Optional[DraftSpec]) -> str:
    params = sum(math.prod(s.shape) for s in sizes.values())
    size = f"{params / 1e9:.0f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    types = {s.ggml_type for n, s in sizes.items() if s.ggml_type != "F32" and on_device(n, cfg)}
    mix = "Q4_K_M" if types == {"Q4_K", "Q6_K"} else "/".join(sorted(types)) or "?"
    return f"the {size} {mix} target" + (f" + {draft.label}" if draft else "")


def plan(cfg: Qwen35Config, gguf_or_sizes: Union[Any, Sizes], *, context: int, budget: int,
         draft: Optional[DraftSpec] = None, overhead: int = CUDA_OVERHEAD, prefill_rows: int = PREFILL_ROWS,
         cublas: bool = False, prefill_f16: bool = False) -> MemoryPlan:
    """The device memory of a run at `context` tokens, tree `budget` (slots = budget + 1) and prefill passes of
    `prefill_rows` rows (cublas: with the cuBLAS prefill GEMM on; prefill_f16: with resident fp16 prefill weights,
    which only a cuBLAS pass reads)."""
    if context < 1:
        raise UsageError(f"context {context} must be positive")
    sizes = gguf_or_sizes if isinstance(gguf_or_sizes, Mapping) else sizes_from_gguf(gguf_or_sizes)
    buf = target_buffers(cfg, context=context, budget=budget, prefill_rows=prefill_rows, cublas=cublas)
    n_attn = sum(cfg.is_attention(i) for i in range(cfg.n_layers))
    host_note = "" if cfg.tied else "token_embd stays on the host (rows dequantized per call)"
    items = [
        PlanItem("target weights", weight_bytes(cfg, sizes), host_note),
        PlanItem("kv cache", buf["kv_cache"], f"f16, {n_attn} layers"),
        PlanItem("deltanet state", buf["deltanet_state"], "fp32 recurrent states"),
        PlanItem("conv state", buf["conv_state"], "last 3 pre-conv inputs"),
        PlanItem("activations", buf["activations"], f"{prefill_rows} rows (one prefill pass)"),
        PlanItem("deltanet scratch", buf["gdn_scratch"], f"chunked prefill of {prefill_rows} rows"),
        PlanItem("tree inputs", buf["tree_inputs"], f"{budget + 1} slots, kept per DeltaNet layer until commit"),
        PlanItem("tree saves", buf["tree_saves"], "fp32 states at branch points"),
        PlanItem("attention partials", buf["attn_partials"], "split-KV"),
        PlanItem("logits", buf["logits"], f"{CHUNK} x vocab fp32"),
        PlanItem("logits argmax", buf["argmax"], "device argmax / top-8 ids and their scratch"),
        PlanItem("tree index", buf["tree_index"], "parents, positions, masks, path, graph state, token ids"),
    ]
    if "gemm_scratch" in buf:
        items.append(PlanItem("cublas gemm scratch", buf["gemm_scratch"],
                              f"fp16 x ({prefill_rows} rows) + the largest layer matrix in fp16"))
    if prefill_f16:
        items.append(PlanItem("prefill f16 weights", prefill_f16_bytes(cfg, sizes),
                              "every layer matrix in fp16, dequantized once at load (LUCEBOX_PREFILL_WEIGHTS=f16)"))
    if draft is not None:
        items += [
            PlanItem("draft weights", draft.weight_bytes, draft.label),
            PlanItem("draft kv cache", draft.kv_per_token * context, f"{draft.kv_per_token} B/token"),
            PlanItem("draft scratch", draft.scratch_bytes(cfg.vocab), "block, feature chunk, draft logits"),
        ]
    items.append(PlanItem("cuda overhead", overhead, "context, module images, allocator slack (margin)"))
    return MemoryPlan(tuple(items), context, budget, _label(cfg, sizes, draft), cfg, sizes, draft, prefill_rows,
                      cublas_on(cublas, prefill_rows), bool(prefill_f16))


def largest_context(cfg: Qwen35Config, sizes: Union[Any, Sizes], card_bytes: int, *, budget: int,
                    draft: Optional[DraftSpec] = None, overhead: int = CUDA_OVERHEAD, limit: int = 1 << 24,
                    prefill_rows: int = PREFILL_ROWS, cublas: bool = False, prefill_f16: bool = False) -> int:
    """The most context tokens whose plan fits `card_bytes` (0 when not even one token does)."""
    sizes = sizes if isinstance(sizes, Mapping) else sizes_from_gguf(sizes)

    def fits(ctx: int) -> bool:
        return plan(cfg, sizes, context=ctx, budget=budget, draft=draft, overhead=overhead,
                    prefill_rows=prefill_rows, cublas=cublas, prefill_f16=prefill_f16).total <= card_bytes

    if not fits(1):
        return 0
    lo, hi = 1, limit
    if fits(hi):
        return hi
    while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def fit(p: MemoryPlan, card_bytes: int, card_name: str = "") -> None:
    """Raise OutOfMemory when the plan exceeds the card, naming the largest context that would fit."""
    if p.total <= card_bytes:
        return
    card = card_name or f"{card_bytes / 1e9:.0f} GB"
    best = largest_context(p.cfg, p.sizes, card_bytes, budget=p.budget, draft=p.draft,
                           overhead=p.bytes_of("cuda overhead"), prefill_rows=p.prefill_rows, cublas=p.cublas,
                           prefill_f16=p.prefill_f16)
    need = f"needs {p.total / GIB:.2f} GiB of {card_bytes / GIB:.2f} GiB"
    if best == 0:
        raise OutOfMemory(
            f"{p.label} does not fit a {card} card at any context ({need} at {p.context} tokens; "
            f"weights alone {p.bytes_of('target weights') / GIB:.2f} GiB)",
            hint="use a smaller quantization, no draft, or a larger card"
            + (" (or drop LUCEBOX_PREFILL_WEIGHTS=f16: the fp16 copy is "
               f"{p.bytes_of('prefill f16 weights') / GIB:.1f} GiB)" if p.prefill_f16 else ""),
        )
    raise OutOfMemory(
        f"{p.label} fit a {card} card up to {best} tokens of context; asked for {p.context} ({need})",
        hint=f"pass --max-context {best} or less, or lower the budget"
        + (" (or drop LUCEBOX_PREFILL_WEIGHTS=f16)" if p.prefill_f16 else ""),
    )


def card_bytes_of_profile(profile: Any) -> int:
    """A profile's memory in bytes (memory_gb is decimal GB, as vendors state it: the conservative reading)."""
    return int(float(profile.hardware.memory_gb) * 1e9)
