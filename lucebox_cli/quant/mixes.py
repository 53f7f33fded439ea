"""Per-tensor type choice: llama.cpp's llama_tensor_get_type for the file types lucebox writes.

`choose_types` reproduces what `llama_model_quantize` (no imatrix, no overrides) picks for every
tensor of a model, including its quirks:
- tensors are visited in llama.cpp's weights_map order (layer number, then name; non-layer tensors
  first) because the "use more bits" rule reads running per-kind counters, not layer indices;
- attn_v and attn_qkv share one counter (both are "attention-v-like"), so the Q4_K_M/Q5_K_M rule for
  attn_qkv is the attn_v rule (the separate attn_qkv → Q5_K branch is unreachable);
- `output` (or `token_embd` when tied) becomes Q6_K for K mixes, Q8_0 when its rows are not a
  multiple of the block;
- only ≥2-D tensors whose name ends in "weight", that are not norms and not ssm_conv1d, are
  quantized; everything else keeps its input type (F32 from our converter);
- a row length that the chosen type cannot hold falls back: Q4_K → Q5_0, Q5_K → Q5_1,
  Q6_K → Q8_0, and to F16 if even 32 does not divide it.

"Q4_K" and "Q5_K" are llama.cpp's --pure mixes (every quantizable tensor of one type).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lucebox_cli.errors import UsageError
from lucebox_cli.quant.blocks import block_type, is_quantized

# file type → (default tensor type, pure, llama_ftype id for llama_model_quantize)
FTYPES: dict[str, tuple[str, bool, int]] = {
    "F32": ("F32", False, 0),
    "F16": ("F16", False, 1),
    "BF16": ("BF16", False, 32),
    "Q8_0": ("Q8_0", False, 7),
    "Q6_K": ("Q6_K", False, 18),
    "Q4_K": ("Q4_K", True, 15),  # --pure Q4_K_M
    "Q5_K": ("Q5_K", True, 17),  # --pure Q5_K_M
    "Q4_K_M": ("Q4_K", False, 15),
    "Q5_K_M": ("Q5_K", False, 17),
}

_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
_LAYER = re.compile(r"blk\.(\d+)\.")


def check_ftype(ftype: str) -> str:
    """The canonical name of a file type, or a UsageError listing the known ones."""
    name = ftype.upper()
    if name not in FTYPES:
        raise UsageError(f"unknown quantization type {ftype!r}", hint=f"choose one of {', '.join(FTYPES)}")
    return name


def llama_order_key(name: str) -> tuple[int, str]:
    """llama_model_loader's weight_name_comparer: layer number (−1 outside layers), then name."""
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


def category(name: str) -> str:
    """llama.cpp's tensor_get_category (substring tests, in its order)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if key in name:
            return cat
    return "other"


def _is_attn_v_like(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: dimensions up to the last ne > 1 (numpy shape is ne reversed)."""
    ne = list(reversed([int(d) for d in shape]))
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def allows_quantization(name: str, shape: Sequence[int]) -> bool:
    """tensor_allows_quantization, the parts that can apply to a qwen35 / DFlash model."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    blocked = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d", "shortconv.conv.weight",
               "altup", "laurel", "per_layer_model_proj", "attn_rel_b.weight", ".position_embd")
    return not any(b in name for b in blocked)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class _State:
    ftype: str
    n_layers: int
    n_attention_wv: int
    tied: bool
    i_attention_wv: int = 0
    i_ffn_down: int = 0


def _mix_type(st: _State, name: str, shape: Sequence[int], new_type: str) -> str:
    """llama_tensor_get_type_impl for the ftypes of FTYPES (dense model, no expert, not 70B)."""
    cat = category(name)
    if cat == "output" or (st.tied and cat == "token_embd"):
        ncols = int(shape[-1])
        if ncols % block_type(new_type).block:
            return "Q8_0"
        return "Q6_K" if new_type != "Q8_0" else new_type
    if cat == "token_embd":
        return new_type
    if _is_attn_v_like(cat):
        if st.ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(st.i_attention_wv, st.n_attention_wv):
            new_type = "Q6_K"
        st.i_attention_wv += 1
    elif cat == "ffn_down":
        if st.ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(st.i_ffn_down, st.n_layers):
            new_type = "Q6_K"
        st.i_ffn_down += 1
    return new_type


def fallback(name: str, shape: Sequence[int], qtype: str) -> str:
    """tensor_type_fallback: a type whose block divides the row length."""
    ncols = int(shape[-1])
    if ncols % block_type(qtype).block == 0:
        return qtype
    out = _FALLBACK.get(qtype, qtype)
    if ncols % block_type(out).block:
        out = "F16"
    return out


def choose_types(
    tensors: Iterable[tuple[str, Sequence[int], str]], ftype: str, n_layers: int
) -> dict[str, str]:
    """{name: ggml type name} for (name, numpy shape, input type) triples, as llama_model_quantize picks.

    `n_layers` is the model's block_count (llama.cpp's n_layer_all, the ffn_down counter's range).
    """
    ftype = check_ftype(ftype)
    default, pure, _ = FTYPES[ftype]
    items = sorted(((n, tuple(s), t) for n, s, t in tensors), key=lambda it: llama_order_key(it[0]))
    names = [n for n, _, _ in items]
    st = _State(
        ftype=ftype,
        n_layers=n_layers,
        n_attention_wv=sum(_is_attn_v_like(category(n)) for n in names),
        tied="output.weight" not in names,
    )
    out: dict[str, str] = {}
    for name, shape, in_type in items:
        if not allows_quantization(name, shape):
            out[name] = in_type
            continue
        new_type = default
        if is_quantized(default):
            if not pure:
                new_type = _mix_type(st, name, shape, new_type)
            new_type = fallback(name, shape, new_type)
        out[name] = new_type
    return out
