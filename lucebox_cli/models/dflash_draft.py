"""DFlash block-diffusion draft (z-lab checkpoints): config, weights, and the numpy reference forward.

The draft is a small Qwen3-style decoder with no embedding or LM head of its own: it embeds with the
target's `token_embd` and projects its final RMSNorm output with the target's LM head. Per committed
position the hidden states after the tapped target layers are concatenated and fused into one
context vector, ctx = RMSNorm(fc · concat, hidden_norm). Every draft layer draws its queries from the
block stream [bonus, MASK × (block_size − 1)] and its keys/values from [ctx rows ; block rows], both
with k_norm and RoPE at their absolute positions (context row i sits at position i, the block starts
at the committed length). Full-attention layers see everything (non-causal inside the block);
sliding-attention layers are causal and see keys at most `sliding_window − 1` positions back.

Checked against the PyPI package `dflash` 0.1.0 (`DFlashDraftModel`), which keeps the context K/V in
a cache that grows by the committed tokens; `DFlashDraft` does the same (`append_context`), so one
draft step costs one projection per newly committed token instead of a recompute of the window.

RMSNorms here are the standard Qwen3 ones (x · w, weights centred on one): no +1 fix-up, in either
the HF or our GGUF form (architecture `dflash-qwen3`, documented in docs/dflash-gguf.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lucebox_cli.errors import BadModelFile, LuceboxError, ModelNotFound, UnsupportedModel
from lucebox_cli.models.dflash_forward import ContextCache, attention, rms_norm, rope_neox, top_k_logprobs, visible
from lucebox_cli.models.safetensors_io import HFCheckpoint

ARCH = "dflash-qwen3"

# HF (z-lab) tensor name → our GGUF name; per-layer names are under `layers.N.` / `blk.N.`
_TOP_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "fc_norm.weight",
    "norm.weight": "output_norm.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# some exports nest the draft under `model.`
_HF_PREFIXES = ("model.",)
# fields only DFlash2 (dynamic convolutions + candidate selector) drafts carry
_DFLASH2_KEYS = ("selector_rank", "selector_top_k", "conv_kernel_size", "conv_group_size")


def default_target_layer_ids(n_target_layers: int, n_draft_layers: int) -> list[int]:
    """The reference's tap rule when a config names none: start 1, end n − 3, evenly spread."""
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    span = n_target_layers - 4
    return [round(1 + i * span / (n_draft_layers - 1)) for i in range(n_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    # None: each sliding layer is causal and each full layer is not (the reference's default)
    is_causal: bool | None = None
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    vocab_size: int = 0
    n_target_layers: int = 0
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    logit_softcap: float = 0.0

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def fc_in(self) -> int:
        """Width of one context feature row: the tapped hidden states concatenated."""
        return self.n_taps * self.hidden_size

    def layer_causal(self, i: int) -> bool:
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_types[i] == "sliding_attention"

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the draft, by GGUF name, in numpy shape ([out, in] for matrices)."""
        h, d, f = self.hidden_size, self.head_dim, self.intermediate_size
        shapes = {"fc.weight": (h, self.fc_in), "fc_norm.weight": (h,), "output_norm.weight": (h,)}
        for i in range(self.n_layers):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (h,),
                b + "attn_q.weight": (self.n_heads * d, h),
                b + "attn_k.weight": (self.n_kv_heads * d, h),
                b + "attn_v.weight": (self.n_kv_heads * d, h),
                b + "attn_output.weight": (h, self.n_heads * d),
                b + "attn_q_norm.weight": (d,),
                b + "attn_k_norm.weight": (d,),
                b + "ffn_norm.weight": (h,),
                b + "ffn_gate.weight": (f, h),
                b + "ffn_up.weight": (f, h),
                b + "ffn_down.weight": (h, f),
            })
        return shapes

    @classmethod
    def from_hf(cls, cfg: dict) -> DFlashConfig:
        """From a z-lab config.json dict, resolving defaults the way the reference (and Qwen3Config) do."""
        dcfg = cfg.get("dflash_config") or {}
        _check_supported(cfg, dcfg)

        def draft_value(name, default=None):
            # the reference reads dflash_config first, then the top level
            return dcfg.get(name, cfg.get(name, default))

        try:
            n_layers = int(cfg["num_hidden_layers"])
            n_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            intermediate = int(cfg["intermediate_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise BadModelFile(f"DFlash config.json lacks a valid {e}") from e
        n_target = int(draft_value("num_target_layers", 0) or 0)
        taps = draft_value("target_layer_ids")
        if taps is None:
            if not n_target:
                raise BadModelFile("DFlash config.json names neither target_layer_ids nor num_target_layers")
            taps = default_target_layer_ids(n_target, n_layers)
        mask_id = draft_value("mask_token_id")
        if mask_id is None:
            raise BadModelFile("DFlash config.json has no mask_token_id")
        # Qwen3Config drops the window unless use_sliding_window is set, then derives layer types
        window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
        layer_types = cfg.get("layer_types") or [
            "sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28)
            else "full_attention"
            for i in range(n_layers)
        ]
        softcap = draft_value("final_logit_softcapping")
        return cls(
            hidden_size=hidden, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or 128), intermediate_size=intermediate,
            target_layer_ids=tuple(int(t) for t in taps), block_size=int(draft_value("block_size", 16)),
            mask_token_id=int(mask_id), layer_types=tuple(layer_types),
            sliding_window=None if window is None else int(window),
            is_causal=None if cfg.get("is_causal") is None else bool(cfg["is_causal"]),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(cfg),
            vocab_size=int(cfg.get("vocab_size", 0) or 0), n_target_layers=n_target,
            input_embedding_scale=float(draft_value("input_embedding_scale", 1.0)),
            output_multiplier=float(draft_value("output_multiplier", 1.0)),
            logit_softcap=float(softcap) if softcap else 0.0,
        ).validated()

    def validated(self) -> DFlashConfig:
        bad = [t for t in self.layer_types if t not in ("full_attention", "sliding_attention")]
        if len(self.layer_types) != self.n_layers or bad:
            raise UnsupportedModel(f"DFlash draft layer types {list(self.layer_types)} are not supported")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2 or self.block_size < 2:
            raise BadModelFile("DFlash draft config is inconsistent (heads, head_dim or block_size)")
        if not self.target_layer_ids:
            raise BadModelFile("DFlash draft config has an empty target_layer_ids")
        return self

    def to_gguf_metadata(self) -> dict:
        """The `dflash-qwen3.*` keys (docs/dflash-gguf.md); general.architecture is the writer's."""
        a = ARCH + "."
        md = {
            a + "block_count": self.n_layers,
            a + "embedding_length": self.hidden_size,
            a + "feed_forward_length": self.intermediate_size,
            a + "attention.head_count": self.n_heads,
            a + "attention.head_count_kv": self.n_kv_heads,
            a + "attention.key_length": self.head_dim,
            a + "attention.value_length": self.head_dim,
            a + "attention.layer_norm_rms_epsilon": float(self.rms_eps),
            a + "attention.layer_types": list(self.layer_types),
            a + "attention.causal_layers": [self.layer_causal(i) for i in range(self.n_layers)],
            a + "rope.freq_base": float(self.rope_theta),
            a + "rope.dimension_count": self.head_dim,
            a + "vocab_size": self.vocab_size,
            a + "dflash.target_layer_ids": list(self.target_layer_ids),
            a + "dflash.block_size": self.block_size,
            a + "dflash.mask_token_id": self.mask_token_id,
            a + "dflash.n_target_layers": self.n_target_layers,
            a + "dflash.input_embedding_scale": float(self.input_embedding_scale),
            a + "dflash.output_multiplier": float(self.output_multiplier),
            a + "dflash.final_logit_softcapping": float(self.logit_softcap),
        }
        if self.sliding_window is not None:
            md[a + "attention.sliding_window"] = self.sliding_window
        return md

    @classmethod
    def from_gguf_metadata(cls, md: dict) -> DFlashConfig:
        if md.get("general.architecture", ARCH) != ARCH:
            raise UnsupportedModel(
                f"GGUF architecture {md.get('general.architecture')!r} is not a DFlash draft ({ARCH})"
            )
        a = ARCH + "."
        try:
            n_layers = int(md[a + "block_count"])
            causal = [bool(c) for c in md[a + "attention.causal_layers"]]
            types = tuple(str(t) for t in md[a + "attention.layer_types"])
            cfg = cls(
                hidden_size=int(md[a + "embedding_length"]), n_layers=n_layers,
                n_heads=int(md[a + "attention.head_count"]),
                n_kv_heads=int(md[a + "attention.head_count_kv"]),
                head_dim=int(md[a + "attention.key_length"]),
                intermediate_size=int(md[a + "feed_forward_length"]),
                target_layer_ids=tuple(int(t) for t in md[a + "dflash.target_layer_ids"]),
                block_size=int(md[a + "dflash.block_size"]),
                mask_token_id=int(md[a + "dflash.mask_token_id"]), layer_types=types,
                sliding_window=md.get(a + "attention.sliding_window"),
                rms_eps=_f32(md[a + "attention.layer_norm_rms_epsilon"]),
                rope_theta=_f32(md[a + "rope.freq_base"]),
                vocab_size=int(md.get(a + "vocab_size", 0)),
                n_target_layers=int(md.get(a + "dflash.n_target_layers", 0)),
                input_embedding_scale=_f32(md.get(a + "dflash.input_embedding_scale", 1.0)),
                output_multiplier=_f32(md.get(a + "dflash.output_multiplier", 1.0)),
                logit_softcap=_f32(md.get(a + "dflash.final_logit_softcapping", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BadModelFile(f"DFlash GGUF metadata lacks a valid {e}") from e
        return _with_causality(cfg, causal)


def _f32(value) -> float:
    """A FLOAT32 metadata value as the decimal it was written from (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def _with_causality(cfg: DFlashConfig, causal: list[bool]) -> DFlashConfig:
    """Store per-layer causality as the tri-state the forward reads (None = follow the layer type)."""
    if len(causal) != cfg.n_layers:
        raise BadModelFile("DFlash GGUF causal_layers does not have one entry per layer")
    by_type = [t == "sliding_attention" for t in cfg.layer_types]
    if causal == by_type:
        return cfg.validated()
    if len(set(causal)) == 1:
        return DFlashConfig(**{**cfg.__dict__, "is_causal": causal[0]}).validated()
    raise UnsupportedModel("DFlash GGUF mixes causal layers in a way no z-lab config can express")


def _check_supported(cfg: dict, dcfg: dict) -> None:
    archs = cfg.get("architectures") or []
    if "DFlash2DraftModel" in archs or any(k in dcfg for k in _DFLASH2_KEYS):
        raise UnsupportedModel("DFlash2 drafts (dynamic convolutions, candidate selector) are not supported",
                               hint="use a DFlash (v1) draft such as z-lab/Qwen3.5-27B-DFlash")
    if cfg.get("attention_bias"):
        raise UnsupportedModel("DFlash drafts with attention biases are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"DFlash draft activation {cfg.get('hidden_act')!r} is not supported")
    if dcfg.get("attention_mode", "gqa") not in ("gqa", "mha"):
        raise UnsupportedModel(f"DFlash attention_mode {dcfg.get('attention_mode')!r} is not supported")


def _rope_theta(cfg: dict) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UnsupportedModel(f"DFlash draft RoPE type {kind!r} is not supported (plain RoPE only)")
    return float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)


# ---- loading --------------------------------------------------------------------------------


def is_dflash_folder(path: str | Path) -> bool:
    """True for an HF folder whose config.json carries `dflash_config` (a z-lab draft)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "dflash_config" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def read_hf_config(folder: str | Path) -> DFlashConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelNotFound(f"no config.json in {folder}")
    try:
        return DFlashConfig.from_hf(json.loads(path.read_text()))
    except ValueError as e:
        if isinstance(e, LuceboxError):
            raise
        raise BadModelFile(f"{path} is not valid JSON: {e}") from e


@dataclass(frozen=True)
class HFTensor:
    """One checkpoint tensor, not yet read: `load()` returns it as float32."""

    hf_name: str
    shape: tuple[int, ...]
    path: Path
    checkpoint: HFCheckpoint = field(repr=False, compare=False)

    def load(self) -> np.ndarray:
        return self.checkpoint.load(self.hf_name).astype(np.float32, copy=False)


def hf_tensors(folder: str | Path) -> dict[str, HFTensor]:
    """Every tensor of a z-lab folder by GGUF name, unread."""
    ckpt = HFCheckpoint(folder)
    return {_gguf_name(n): HFTensor(n, ckpt.shape(n), ckpt.path(n), ckpt) for n in ckpt.names}


def _gguf_name(hf_name: str) -> str:
    name = hf_name
    for prefix in _HF_PREFIXES:
        name = name.removeprefix(prefix)
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"blk.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise UnsupportedModel(f"unexpected tensor {hf_name!r} in a DFlash draft checkpoint")


def check_weights(cfg: DFlashConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Every expected tensor present with its shape, nothing extra."""
    want = cfg.tensor_shapes()
    missing = sorted(set(want) - set(shapes))
    if missing:
        raise BadModelFile(f"{where}: missing DFlash tensor(s) {', '.join(missing[:4])}")
    extra = sorted(set(shapes) - set(want))
    if extra:
        raise UnsupportedModel(f"{where}: unexpected tensor(s) {', '.join(extra[:4])}")
    for name, shape in want.items():
        if tuple(shapes[name]) != shape:
            raise BadModelFile(f"{where}: {name} has shape {tuple(shapes[name])}, expected {shape}")


def load_hf_draft(folder: str | Path) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    cfg = read_hf_config(folder)
    tensors = hf_tensors(folder)
    check_weights(cfg, {k: t.shape for k, t in tensors.items()}, str(folder))
    return cfg, {name: t.load() for name, t in tensors.items()}


def load_gguf_draft(path: str | Path) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    from lucebox_cli.gguf_io import GGUFModel

    model = GGUFModel(path)
    cfg = DFlashConfig.from_gguf_metadata(model.metadata)
    weights = {name: np.asarray(model.dequant(name), dtype=np.float32) for name in model.tensor_names}
    check_weights(cfg, {k: v.shape for k, v in weights.items()}, str(path))
    return cfg, weights


def load_draft(src: str | Path) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    """A z-lab HF folder or our `dflash-qwen3` GGUF → (config, float32 weights by GGUF name)."""
    src = Path(src)
    if src.is_dir():
        return load_hf_draft(src)
    if src.is_file():
        return load_gguf_draft(src)
    raise ModelNotFound(f"DFlash draft {src} does not exist")


# ---- forward (its numpy pieces: models/dflash_forward.py) ----


class DFlashDraft:
    """The draft forward over a growing context; weights by GGUF name, float32, [out, in]."""

    def __init__(self, config: DFlashConfig, weights: dict[str, np.ndarray],
                 token_embd: np.ndarray, lm_head: np.ndarray):
        check_weights(config, {k: np.shape(v) for k, v in weights.items()}, "DFlash draft")
        if token_embd.shape[1] != config.hidden_size or lm_head.shape[1] != config.hidden_size:
            raise BadModelFile(
                f"target embedding/LM head width {token_embd.shape[1]}/{lm_head.shape[1]} does not match "
                f"the draft hidden size {config.hidden_size}", hint="use the draft made for this target")
        self.config = config
        self.w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        # [V, hidden] each; a float32 memmap is used in place
        self.token_embd = token_embd.astype(np.float32, copy=False)
        self.lm_head = lm_head.astype(np.float32, copy=False)
        self.reset()

    @classmethod
    def from_path(cls, src: str | Path, token_embd: np.ndarray, lm_head: np.ndarray) -> DFlashDraft:
        cfg, weights = load_draft(src)
        return cls(cfg, weights, token_embd, lm_head)

    @property
    def n_ctx(self) -> int:
        return self._ctx.n

    @property
    def next_pos(self) -> int:
        """Position of the next context row (and of the bonus token): one past the last row."""
        return int(self._ctx.pos[self._ctx.n - 1]) + 1 if self._ctx.n else 0

    def reset(self) -> None:
        c = self.config
        self._ctx = ContextCache(c.n_layers, c.n_kv_heads, c.head_dim)

    def truncate(self, n: int) -> None:
        """Drop context rows past the first n (rows live in the buffers until overwritten)."""
        if not 0 <= n <= self._ctx.n:
            raise ValueError(f"cannot truncate a {self._ctx.n}-row draft context to {n}")
        self._ctx.n = n

    def fuse(self, features: np.ndarray) -> np.ndarray:
        """[n, n_taps·hidden] tapped target states → [n, hidden] context vectors."""
        c = self.config
        features = np.asarray(features, dtype=np.float32).reshape(-1, c.fc_in)
        return rms_norm(features @ self.w["fc.weight"].T, self.w["fc_norm.weight"], c.rms_eps)

    def append_context(self, features: np.ndarray, pos0: int | None = None) -> None:
        """Project new committed rows (features of tokens pos0 … pos0+n−1) into every layer's K/V."""
        c = self.config
        ctx = self.fuse(features)
        pos0 = self.next_pos if pos0 is None else pos0
        pos = np.arange(pos0, pos0 + ctx.shape[0], dtype=np.int64)
        ks, vs = [], []
        for i in range(c.n_layers):
            k, v = self._kv(i, ctx, pos)
            ks.append(k)
            vs.append(v)
        self._ctx.append(pos, ks, vs)

    def sync_context(self, features: np.ndarray) -> None:
        """Follow a target's feature store [n_past, n_taps·hidden] (rows at positions 0 … n_past−1):
        project only the rows past the cached ones; a shorter store (a rollback) truncates first."""
        n = features.shape[0]
        if n < self.n_ctx:
            self.truncate(n)
        if n > self.n_ctx:
            self.append_context(features[self.n_ctx :], pos0=self.n_ctx)

    def _kv(self, i: int, x: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, b = self.config, f"blk.{i}."
        k = (x @ self.w[b + "attn_k.weight"].T).reshape(-1, c.n_kv_heads, c.head_dim)
        k = rope_neox(rms_norm(k, self.w[b + "attn_k_norm.weight"], c.rms_eps), pos, c.rope_theta)
        v = (x @ self.w[b + "attn_v.weight"].T).reshape(-1, c.n_kv_heads, c.head_dim)
        return k, v

    def _layer(self, i: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, b, w = self.config, f"blk.{i}.", self.w
        x = rms_norm(h, w[b + "attn_norm.weight"], c.rms_eps)
        q = (x @ w[b + "attn_q.weight"].T).reshape(-1, c.n_heads, c.head_dim)
        q = rope_neox(rms_norm(q, w[b + "attn_q_norm.weight"], c.rms_eps), pos, c.rope_theta)
        kb, vb = self._kv(i, x, pos)
        n = self._ctx.n
        k = np.concatenate([self._ctx.k[i][:n], kb]) if n else kb
        v = np.concatenate([self._ctx.v[i][:n], vb]) if n else vb
        k_pos = np.concatenate([self._ctx.pos[:n], pos])
        mask = visible(pos, k_pos, c.layer_causal(i), c.layer_window(i))
        h = h + attention(q, k, v, mask, c.head_dim ** -0.5) @ w[b + "attn_output.weight"].T
        x = rms_norm(h, w[b + "ffn_norm.weight"], c.rms_eps)
        gate = x @ w[b + "ffn_gate.weight"].T
        act = gate / (np.float32(1.0) + np.exp(-gate)) * (x @ w[b + "ffn_up.weight"].T)
        return h + act @ w[b + "ffn_down.weight"].T

    def forward_hidden(self, bonus_token: int, pos0: int | None = None, n_block: int | None = None) -> np.ndarray:
        """Final-norm hidden states [n_block, hidden] of the block [bonus, MASK × (n_block − 1)]."""
        c = self.config
        n_block = c.block_size if n_block is None else n_block
        pos0 = self.next_pos if pos0 is None else pos0
        ids = np.full(n_block, c.mask_token_id, dtype=np.int64)
        ids[0] = bonus_token
        h = self.token_embd[ids].astype(np.float32) * np.float32(c.input_embedding_scale)
        pos = np.arange(pos0, pos0 + n_block, dtype=np.int64)
        for i in range(c.n_layers):
            h = self._layer(i, h, pos)
        return rms_norm(h, self.w["output_norm.weight"], c.rms_eps)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """The target's LM head on draft hidden states, with the draft's output scale and softcap."""
        c = self.config
        out = hidden @ self.lm_head.T
        if c.output_multiplier != 1.0:
            out = out * np.float32(c.output_multiplier)
        if c.logit_softcap > 0:
            out = np.tanh(out / np.float32(c.logit_softcap)) * np.float32(c.logit_softcap)
        return out

    def forward_block(self, bonus_token: int, pos0: int | None = None, n_block: int | None = None) -> np.ndarray:
        """Logits [n_block − 1, V] of the masked positions pos0+1 … pos0+n_block−1."""
        return self.logits(self.forward_hidden(bonus_token, pos0, n_block)[1:])

    def propose(self, bonus_token: int, top_k: int, pos0: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-K log-probs [L, K] (descending) and ids [L, K] per masked position, L = block_size − 1."""
        return top_k_logprobs(self.forward_block(bonus_token, pos0), top_k)
