"""Qwen3.5 / 3.6 hybrid text model (GGUF arch `qwen35`): config and checkpoint fix-ups.

This is the only module that knows the checkpoint quirks (see docs/internals.md and
shared/reference/qwen35.md): HF RMSNorm weights are centred on zero (+1 here, except the DeltaNet
output norm), HF stores A_log (we keep ssm_a = -exp(A_log)), HF groups DeltaNet value heads by key
head (we tile them: value head p uses key head p % Hk), the conv weight is [C, 1, K] in HF ([C, K]
here), and tied models have no LM head. Everything downstream sees GGUF names and values.

Public API:
    Qwen35Config                          frozen hyper-parameters (from_hf_config / from_gguf_metadata)
    expected_tensors(cfg)                 {gguf_name: numpy shape} of a complete model
    hf_to_internal(name, array, cfg)      HF tensor -> [(gguf_name, array)] or None (skipped)
    internal_to_hf(name, array, cfg)      the inverse, text-only HF names (tests, round trips)
    iter_hf_tensors(folder)               (hf_name, float32 array) one at a time, memory-frugal
    HFCheckpoint(folder)                  tensors by HF name, unread: shape(), load(), rows(start, stop)
    hf_passthrough(name, cfg)             whether hf_to_internal leaves a tensor's values and rows as they are
    read_hf_config(folder)                config.json as a dict
    load_hf_checkpoint(folder)            (cfg, {gguf_name: float32 array})
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from lucebox_cli.errors import BadModelFile, ModelNotFound, UnsupportedModel
# HFCheckpoint is part of this module's API (above) too
from lucebox_cli.models.safetensors_io import HFCheckpoint, iter_hf_tensors  # noqa: F401

ARCH = "qwen35"
ATTENTION = "attention"
DELTANET = "deltanet"
_HF_LAYER_KIND = {"full_attention": ATTENTION, "linear_attention": DELTANET}


@dataclass(frozen=True)
class Qwen35Config:
    """Hyper-parameters of the text model. `hk`/`hv` are DeltaNet key/value heads, `dk`/`dv` their dims."""

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hk: int
    hv: int
    dk: int
    dv: int
    conv_kernel: int
    ffn: int
    vocab: int
    rope_theta: float
    rope_dims: int
    eps: float
    tied: bool
    layer_types: tuple[str, ...]  # "attention" | "deltanet" per layer
    full_attention_interval: int | None = None  # None when layer_types has no regular period
    context_length: int = 262144
    rope_sections: tuple[int, ...] = (11, 11, 10, 0)

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.n_layers or any(t not in (ATTENTION, DELTANET) for t in self.layer_types):
            raise BadModelFile(f"qwen35 config: layer_types must list {self.n_layers} of attention|deltanet")
        if self.hv % self.hk or self.n_heads % self.n_kv_heads:
            raise UnsupportedModel(
                f"qwen35: heads must divide evenly (Hv={self.hv}, Hk={self.hk}, heads={self.n_heads}, "
                f"kv heads={self.n_kv_heads})"
            )
        if self.rope_dims % 2 or not 0 < self.rope_dims <= self.head_dim:
            raise UnsupportedModel(f"qwen35: rotary dims {self.rope_dims} must be even and <= head_dim")

    @property
    def conv_channels(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv

    @property
    def value_per_key(self) -> int:
        return self.hv // self.hk

    def is_attention(self, layer: int) -> bool:
        return self.layer_types[layer] == ATTENTION

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "Qwen35Config":
        """From an HF config.json dict: `qwen3_5_text`, or the `qwen3_5` VLM with a `text_config`."""
        model_type = config.get("model_type")
        if model_type == "qwen3_5":
            text = dict(config.get("text_config") or {})
            if "tie_word_embeddings" in config:
                # The VLM's top-level flag is what Qwen3_5ForConditionalGeneration ties on.
                text["tie_word_embeddings"] = config["tie_word_embeddings"]
        elif model_type == "qwen3_5_text":
            text = dict(config)
        else:
            raise UnsupportedModel(
                f"model_type {model_type!r} is not a Qwen3.5/3.6 text model",
                hint="lucebox runs qwen3_5 / qwen3_5_text checkpoints (Qwen3.5, Qwen3.6)",
            )
        try:
            return cls._from_text_config(text)
        except KeyError as err:
            raise BadModelFile(f"config.json lacks {err.args[0]!r} for a qwen3_5 text model") from None

    @classmethod
    def _from_text_config(cls, t: Mapping[str, Any]) -> "Qwen35Config":
        n_layers = int(t["num_hidden_layers"])
        rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise UnsupportedModel(f"qwen35: rope type {rope_type!r} is not supported")
        theta = float(rope.get("rope_theta", t.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25)))
        head_dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
        if t.get("layer_types"):
            kinds = tuple(_HF_LAYER_KIND.get(k, k) for k in t["layer_types"])
        else:
            every = int(t.get("full_attention_interval", 4))
            kinds = tuple(ATTENTION if (i + 1) % every == 0 else DELTANET for i in range(n_layers))
        sections = tuple(int(s) for s in rope.get("mrope_section", (11, 11, 10)))
        return cls(
            hidden=int(t["hidden_size"]),
            n_layers=n_layers,
            n_heads=int(t["num_attention_heads"]),
            n_kv_heads=int(t["num_key_value_heads"]),
            head_dim=head_dim,
            hk=int(t["linear_num_key_heads"]),
            hv=int(t["linear_num_value_heads"]),
            dk=int(t["linear_key_head_dim"]),
            dv=int(t["linear_value_head_dim"]),
            conv_kernel=int(t.get("linear_conv_kernel_dim", 4)),
            ffn=int(t["intermediate_size"]),
            vocab=int(t["vocab_size"]),
            rope_theta=theta,
            rope_dims=int(head_dim * partial),
            eps=float(t.get("rms_norm_eps", 1e-6)),
            tied=bool(t.get("tie_word_embeddings", False)),
            layer_types=kinds,
            full_attention_interval=_interval_of(kinds),
            context_length=int(t.get("max_position_embeddings", 262144)),
            rope_sections=(sections + (0, 0, 0, 0))[:4],
        )

    @classmethod
    def from_gguf_metadata(
        cls, meta: Mapping[str, Any], *, vocab: int | None = None, tied: bool | None = None
    ) -> "Qwen35Config":
        """From GGUF metadata (full keys, e.g. `qwen35.block_count`).

        GGUF does not record vocab size or tying as keys: pass them from the tensors (`token_embd` rows,
        whether `output.weight` exists); otherwise `qwen35.vocab_size` / the token list / untied is used.
        """
        arch = meta.get("general.architecture")
        if arch != ARCH:
            raise UnsupportedModel(f"GGUF architecture {arch!r} is not {ARCH!r}", hint="lucebox runs Qwen3.5/3.6 GGUFs")

        def key(name: str, default: Any = None) -> Any:
            value = meta.get(f"{ARCH}.{name}", default)
            if value is None:
                raise BadModelFile(f"GGUF metadata lacks {ARCH}.{name}")
            return value

        n_layers = int(key("block_count"))
        every = int(key("full_attention_interval", 4))
        kinds = tuple(ATTENTION if (i + 1) % every == 0 else DELTANET for i in range(n_layers))
        if vocab is None:
            vocab = meta.get(f"{ARCH}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ()) or None
            if vocab is None:
                raise BadModelFile("GGUF file does not say its vocabulary size")
        hv = int(key("ssm.time_step_rank"))
        return cls(
            hidden=int(key("embedding_length")),
            n_layers=n_layers,
            n_heads=int(key("attention.head_count")),
            n_kv_heads=int(key("attention.head_count_kv")),
            head_dim=int(key("attention.key_length")),
            hk=int(key("ssm.group_count")),
            hv=hv,
            dk=int(key("ssm.state_size")),
            dv=int(key("ssm.inner_size")) // hv,
            conv_kernel=int(key("ssm.conv_kernel")),
            ffn=int(key("feed_forward_length")),
            vocab=int(vocab),
            rope_theta=_from_f32(key("rope.freq_base")),
            rope_dims=int(key("rope.dimension_count")),
            eps=_from_f32(key("attention.layer_norm_rms_epsilon")),
            tied=bool(tied) if tied is not None else False,
            layer_types=kinds,
            full_attention_interval=every,
            context_length=int(key("context_length", 262144)),
            rope_sections=tuple(int(s) for s in key("rope.dimension_sections", [11, 11, 10, 0])),
        )

    def to_gguf_metadata(self) -> dict[str, Any]:
        """The `qwen35.*` keys llama.cpp reads (full key names; general.architecture included)."""
        if self.full_attention_interval is None:
            raise UnsupportedModel("GGUF qwen35 needs a regular full_attention_interval; this layer pattern has none")
        a = ARCH
        return {
            "general.architecture": a,
            f"{a}.block_count": self.n_layers,
            f"{a}.context_length": self.context_length,
            f"{a}.embedding_length": self.hidden,
            f"{a}.feed_forward_length": self.ffn,
            f"{a}.attention.head_count": self.n_heads,
            f"{a}.attention.head_count_kv": self.n_kv_heads,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": self.eps,
            f"{a}.rope.freq_base": self.rope_theta,
            f"{a}.rope.dimension_count": self.rope_dims,
            f"{a}.rope.dimension_sections": list(self.rope_sections),
            f"{a}.ssm.conv_kernel": self.conv_kernel,
            f"{a}.ssm.state_size": self.dk,
            f"{a}.ssm.group_count": self.hk,
            f"{a}.ssm.time_step_rank": self.hv,
            f"{a}.ssm.inner_size": self.hv * self.dv,
            f"{a}.full_attention_interval": self.full_attention_interval,
            f"{a}.vocab_size": self.vocab,
        }


def _from_f32(value: Any) -> float:
    """GGUF stores these as float32: take the shortest decimal that round-trips (1e-06, not 9.99e-07)."""
    return float(str(np.float32(value)))


def _interval_of(kinds: tuple[str, ...]) -> int | None:
    """The period p with layer i full attention iff (i+1) % p == 0, if the pattern has one."""
    for p in range(1, len(kinds) + 1):
        if all((kinds[i] == ATTENTION) == ((i + 1) % p == 0) for i in range(len(kinds))):
            return p
    return None


def expected_tensors(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a complete model in the internal layout, with its numpy shape."""
    d, hd = cfg.hidden, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,)}
    if not cfg.tied:
        out["output.weight"] = (cfg.vocab, d)
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,)}
        out |= {b + "ffn_gate.weight": (cfg.ffn, d), b + "ffn_up.weight": (cfg.ffn, d), b + "ffn_down.weight": (d, cfg.ffn)}
        if cfg.is_attention(i):
            out |= {
                b + "attn_q.weight": (2 * cfg.n_heads * hd, d),
                b + "attn_k.weight": (cfg.n_kv_heads * hd, d),
                b + "attn_v.weight": (cfg.n_kv_heads * hd, d),
                b + "attn_output.weight": (d, cfg.n_heads * hd),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
            }
        else:
            vdim = cfg.hv * cfg.dv
            out |= {
                b + "attn_qkv.weight": (cfg.conv_channels, d),
                b + "attn_gate.weight": (vdim, d),
                b + "ssm_beta.weight": (cfg.hv, d),
                b + "ssm_alpha.weight": (cfg.hv, d),
                b + "ssm_conv1d.weight": (cfg.conv_channels, cfg.conv_kernel),
                b + "ssm_a": (cfg.hv,),
                b + "ssm_dt.bias": (cfg.hv,),
                b + "ssm_norm.weight": (cfg.dv,),
                b + "ssm_out.weight": (d, vdim),
            }
    return out


# ---- value-head order: HF groups value heads by key head, GGUF tiles them ----


def _reorder_heads(x: np.ndarray, axis: int, hk: int, r: int, head: int, *, to_tiled: bool) -> np.ndarray:
    """Permute Hv·head entries along `axis` between grouped [Hk, r, head] and tiled [r, Hk, head] order."""
    if r == 1:
        return x
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    src = (hk, r, head) if to_tiled else (r, hk, head)
    x = x.reshape(*src, *rest).swapaxes(0, 1).reshape(hk * r * head, *rest)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


# The DeltaNet tensors whose value-head order _reorder_linear changes (when Hv != Hk).
_REORDERED = ("attn_qkv.weight", "ssm_conv1d.weight", "attn_gate.weight", "ssm_beta.weight",
              "ssm_alpha.weight", "ssm_a", "ssm_dt.bias", "ssm_out.weight")


def _reorder_linear(gguf_suffix: str, x: np.ndarray, cfg: Qwen35Config, *, to_tiled: bool) -> np.ndarray:
    """Apply the value-head reorder to one DeltaNet tensor (identity when Hv == Hk)."""
    hk, r, dv = cfg.hk, cfg.value_per_key, cfg.dv
    if r == 1:
        return x
    qk = 2 * cfg.hk * cfg.dk
    if gguf_suffix in ("attn_qkv.weight", "ssm_conv1d.weight"):
        # Only the v part (after q and k) is per value head.
        v = _reorder_heads(x[qk:], 0, hk, r, dv, to_tiled=to_tiled)
        return np.concatenate([x[:qk], v], axis=0)
    if gguf_suffix == "attn_gate.weight":
        return _reorder_heads(x, 0, hk, r, dv, to_tiled=to_tiled)
    if gguf_suffix in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
        return _reorder_heads(x, 0, hk, r, 1, to_tiled=to_tiled)
    if gguf_suffix == "ssm_out.weight":
        return _reorder_heads(x, 1, hk, r, dv, to_tiled=to_tiled)
    return x


# HF per-layer suffix -> GGUF per-layer suffix. Norms marked True get +1 on the way in.
_LAYER_MAP: dict[str, tuple[str, bool]] = {
    "input_layernorm.weight": ("attn_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
    "self_attn.q_proj.weight": ("attn_q.weight", False),
    "self_attn.k_proj.weight": ("attn_k.weight", False),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", True),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", True),
    "linear_attn.in_proj_qkv.weight": ("attn_qkv.weight", False),
    "linear_attn.in_proj_z.weight": ("attn_gate.weight", False),
    "linear_attn.in_proj_b.weight": ("ssm_beta.weight", False),
    "linear_attn.in_proj_a.weight": ("ssm_alpha.weight", False),
    "linear_attn.conv1d.weight": ("ssm_conv1d.weight", False),
    "linear_attn.out_proj.weight": ("ssm_out.weight", False),
    "linear_attn.A_log": ("ssm_a", False),
    "linear_attn.dt_bias": ("ssm_dt.bias", False),
    # The DeltaNet output norm is a plain RMSNorm weight in both conventions: no +1.
    "linear_attn.norm.weight": ("ssm_norm.weight", False),
}
_LAYER_UNMAP = {g: (h, plus1) for h, (g, plus1) in _LAYER_MAP.items()}
_TEXT_PREFIXES = ("model.language_model.", "model.")
_SKIPPED_PREFIXES = ("mtp.", "model.visual.", "visual.", "model.vision_tower.")


def hf_to_internal(name: str, array: np.ndarray, cfg: Qwen35Config) -> list[tuple[str, np.ndarray]] | None:
    """One HF tensor -> internal (GGUF-named, GGUF-valued) tensors; None for tensors the text model ignores."""
    if name.startswith(_SKIPPED_PREFIXES):
        return None
    if name == "lm_head.weight":
        return None if cfg.tied else [("output.weight", array)]
    stem = next((name[len(p):] for p in _TEXT_PREFIXES if name.startswith(p)), None)
    if stem is None:
        raise UnsupportedModel(f"unexpected tensor {name!r} in a qwen3_5 checkpoint")
    if stem == "embed_tokens.weight":
        return [("token_embd.weight", array)]
    if stem == "norm.weight":
        return [("output_norm.weight", array + 1.0)]
    parts = stem.split(".", 2)
    if len(parts) != 3 or parts[0] != "layers" or parts[2] not in _LAYER_MAP:
        raise UnsupportedModel(f"unexpected tensor {name!r} in a qwen3_5 checkpoint")
    layer, suffix = int(parts[1]), parts[2]
    gguf_suffix, plus1 = _LAYER_MAP[suffix]
    x = array
    if plus1:
        x = x + 1.0
    if gguf_suffix == "ssm_a":
        x = -np.exp(x)
    if gguf_suffix == "ssm_conv1d.weight":
        x = x.reshape(x.shape[0], x.shape[-1])
    x = _reorder_linear(gguf_suffix, x, cfg, to_tiled=True)
    return [(f"blk.{layer}.{gguf_suffix}", np.ascontiguousarray(x, dtype=np.float32))]


def hf_passthrough(name: str, cfg: Qwen35Config) -> bool:
    """True when hf_to_internal returns this HF tensor unchanged (same values, same row order), so
    a converter may read it in row slabs; False for skipped tensors and for every fix-up above."""
    if name == "lm_head.weight":
        return not cfg.tied
    stem = next((name[len(p):] for p in _TEXT_PREFIXES if name.startswith(p)), None)
    if stem is None or name.startswith(_SKIPPED_PREFIXES):
        return False
    if stem == "embed_tokens.weight":
        return True
    parts = stem.split(".", 2)
    if len(parts) != 3 or parts[0] != "layers" or parts[2] not in _LAYER_MAP:
        return False
    gguf_suffix, plus1 = _LAYER_MAP[parts[2]]
    if plus1 or gguf_suffix in ("ssm_a", "ssm_conv1d.weight"):
        return False
    return cfg.value_per_key == 1 or gguf_suffix not in _REORDERED


def internal_to_hf(name: str, array: np.ndarray, cfg: Qwen35Config) -> list[tuple[str, np.ndarray]]:
    """One internal tensor -> HF text-only (`model.layers…`) tensors; the exact inverse of hf_to_internal."""
    if name == "token_embd.weight":
        return [("model.embed_tokens.weight", array)]
    if name == "output.weight":
        return [("lm_head.weight", array)]
    if name == "output_norm.weight":
        return [("model.norm.weight", array - 1.0)]
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or parts[2] not in _LAYER_UNMAP:
        raise UnsupportedModel(f"unexpected internal tensor {name!r}")
    layer, gguf_suffix = int(parts[1]), parts[2]
    hf_suffix, plus1 = _LAYER_UNMAP[gguf_suffix]
    x = _reorder_linear(gguf_suffix, array, cfg, to_tiled=False)
    if plus1:
        x = x - 1.0
    if gguf_suffix == "ssm_a":
        x = np.log(-x)
    if gguf_suffix == "ssm_conv1d.weight":
        x = x.reshape(x.shape[0], 1, x.shape[1])
    return [(f"model.layers.{layer}.{hf_suffix}", np.ascontiguousarray(x, dtype=np.float32))]


# ---- reading HF checkpoints (tensors: models/safetensors_io.py) ----


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelNotFound(f"{folder} has no config.json", hint="point at an HF checkpoint folder or a .gguf file")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadModelFile(f"{path} is not valid JSON: {err}") from None


def load_hf_checkpoint(folder: str | Path) -> tuple[Qwen35Config, dict[str, np.ndarray]]:
    """Read an HF folder into (config, internal float32 weights), checking names and shapes."""
    cfg = Qwen35Config.from_hf_config(read_hf_config(folder))
    weights: dict[str, np.ndarray] = {}
    saw_lm_head = False
    for name, array in iter_hf_tensors(folder):
        saw_lm_head |= name == "lm_head.weight"
        for gguf_name, x in hf_to_internal(name, array, cfg) or ():
            weights[gguf_name] = x
    if not cfg.tied and not saw_lm_head:
        # Some exports drop lm_head while leaving tie_word_embeddings false; the head is then the embedding.
        cfg = replace(cfg, tied=True)
    check_weights(cfg, weights, source=str(folder))
    return cfg, weights


def check_weights(cfg: Qwen35Config, weights: Mapping[str, np.ndarray], *, source: str = "model") -> None:
    """Raise BadModelFile naming the first missing tensor or wrong shape.

    A lazy mapping (gguf_io.LazyWeights) is checked through its `shape_of`, so nothing is dequantized.
    """
    shape_of = getattr(weights, "shape_of", None) or (lambda name: tuple(weights[name].shape))
    for name, shape in expected_tensors(cfg).items():
        if name not in weights:
            raise BadModelFile(f"{source}: tensor {name} is missing")
        got = tuple(shape_of(name))
        if got != shape:
            raise BadModelFile(f"{source}: tensor {name} has shape {got}, expected {shape}")
