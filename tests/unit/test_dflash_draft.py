"""DFlash draft (models/dflash_draft.py) against the reference package `dflash` 0.1.0 on torch CPU.

Tiny random drafts in the z-lab format (config.json + safetensors) are loaded by both sides; the
reference is stepped exactly as its `dflash_generate` steps it (new context rows + block in one
forward through a past-recording DynamicCache, then a crop back to the committed length), and our
cached-context forward must give the same logits (relative RMS < 1e-4 in fp32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucebox_cli.errors import BadModelFile, UnsupportedModel
from lucebox_cli.models.dflash_draft import (
    DFlashConfig,
    DFlashDraft,
    is_dflash_folder,
    load_draft,
    top_k_logprobs,
)

VOCAB = 50
HIDDEN = 64


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))


def hf_config(**over) -> dict:
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_target_layers": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": VOCAB,
        "block_size": 8, "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": VOCAB - 1},
    }
    cfg.update(over)
    return cfg


def write_draft(folder, cfg: dict, seed: int = 0, dtype: str = "float32"):
    """A random z-lab folder; HF names, with norms around one so the RMSNorm weight matters."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    c = DFlashConfig.from_hf(cfg)
    g = torch.Generator().manual_seed(seed)
    hf = {}
    for name, shape in c.tensor_shapes().items():
        t = torch.randn(shape, generator=g) * (0.3 if len(shape) == 1 else shape[1] ** -0.5)
        hf[_hf_name(name)] = t + 1.0 if len(shape) == 1 else t
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in hf.items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _hf_name(gguf: str) -> str:
    from lucebox_cli.models import dflash_draft as m

    inv_top = {v: k for k, v in m._TOP_NAMES.items()}
    if gguf in inv_top:
        return inv_top[gguf]
    _, i, rest = gguf.split(".", 2)
    return f"layers.{i}." + {v: k for k, v in m._LAYER_NAMES.items()}[rest]


def target_head(seed: int = 1, hidden: int = HIDDEN):
    rng = np.random.default_rng(seed)
    embd = rng.standard_normal((VOCAB, hidden)).astype(np.float32)
    head = (rng.standard_normal((VOCAB, hidden)) * hidden**-0.5).astype(np.float32)
    return embd, head


def reference_steps(folder, embd, head, chunks, features, n_block):
    """Step dflash's torch model like dflash_generate: returns the draft logits of every step."""
    torch = pytest.importorskip("torch")
    dmodel = pytest.importorskip("dflash.model")
    model = dmodel.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    cache = dmodel._make_cache(model.config)
    feats = torch.from_numpy(features)[None]
    start, out = 0, []
    with torch.inference_mode():
        for n_new in chunks:
            ctx = feats[:, start : start + n_new]
            start += n_new
            ids = torch.full((1, n_block), model.mask_token_id, dtype=torch.long)
            ids[0, 0] = start % (VOCAB - 1)
            noise = torch.from_numpy(embd)[ids]
            pos = torch.arange(start - n_new, start + n_block)[None]
            hidden = model(target_hidden=ctx, noise_embedding=noise, position_ids=pos,
                           past_key_values=cache, use_cache=True)[:, 1 - n_block :, :]
            dmodel._crop_to(cache, start)
            out.append((hidden[0] @ torch.from_numpy(head).T).numpy())
    return out


def ours_steps(draft: DFlashDraft, chunks, features, n_block):
    start, out = 0, []
    for n_new in chunks:
        draft.append_context(features[start : start + n_new])
        start += n_new
        out.append(draft.forward_block(start % (VOCAB - 1), n_block=n_block))
    return out


CASES = {
    "full-b8": (hf_config(), [5, 3, 1, 4], 8),
    "mha-b16": (hf_config(num_key_value_heads=4, block_size=16), [7, 2], 16),
    "short-block": (hf_config(), [6, 2], 5),
    "sliding-w6": (hf_config(use_sliding_window=True, sliding_window=6,
                             layer_types=["sliding_attention", "full_attention"]), [9, 3, 1, 5], 8),
    "all-sliding-w20": (hf_config(use_sliding_window=True, sliding_window=20,
                                  layer_types=["sliding_attention"] * 2), [12, 4, 7], 8),
    "causal-override": (hf_config(is_causal=True), [4, 4], 8),
    "sliding-noncausal-w4": (hf_config(is_causal=False, use_sliding_window=True, sliding_window=4,
                                       layer_types=["sliding_attention", "full_attention"]), [6, 2], 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dflash_draft_matches_reference(tmp_path, case):
    cfg, chunks, n_block = CASES[case]
    folder = write_draft(tmp_path / "draft", cfg)
    embd, head = target_head()
    c = DFlashConfig.from_hf(cfg)
    features = np.random.default_rng(2).standard_normal((sum(chunks), c.fc_in)).astype(np.float32)
    ref = reference_steps(folder, embd, head, chunks, features, n_block)
    draft = DFlashDraft.from_path(folder, embd, head)
    ours = ours_steps(draft, chunks, features, n_block)
    for step, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == (n_block - 1, VOCAB)
        assert rel_rms(a, b) < 1e-4, f"step {step}"


def test_incremental_context_equals_recompute(tmp_path):
    cfg = hf_config(use_sliding_window=True, sliding_window=5,
                    layer_types=["full_attention", "sliding_attention"])
    folder = write_draft(tmp_path / "d", cfg)
    embd, head = target_head()
    c = DFlashConfig.from_hf(cfg)
    feats = np.random.default_rng(3).standard_normal((17, c.fc_in)).astype(np.float32)
    inc = DFlashDraft.from_path(folder, embd, head)
    for lo, hi in [(0, 6), (6, 7), (7, 11), (11, 17)]:
        inc.append_context(feats[lo:hi])
    fresh = DFlashDraft.from_path(folder, embd, head)
    fresh.append_context(feats)
    assert inc.n_ctx == fresh.n_ctx == 17 and inc.next_pos == 17
    # row-wise projections of different batch sizes may sum in another order: fp32 rounding only
    assert rel_rms(inc.forward_block(3), fresh.forward_block(3)) < 1e-6
    # rollback: drop 4 rows and append different ones == a fresh draft over the new history
    other = np.random.default_rng(4).standard_normal((4, c.fc_in)).astype(np.float32)
    inc.truncate(13)
    inc.append_context(other)
    redo = DFlashDraft.from_path(folder, embd, head)
    redo.append_context(np.concatenate([feats[:13], other]))
    assert rel_rms(inc.forward_block(9), redo.forward_block(9)) < 1e-6
    # following an engine's feature store: grow, then roll back past the last sync
    synced = DFlashDraft.from_path(folder, embd, head)
    for n in (5, 11, 17, 13):
        synced.sync_context(feats[:n])
        assert synced.n_ctx == n
    assert rel_rms(synced.forward_block(2), fresh_over(folder, embd, head, feats[:13]).forward_block(2)) < 1e-6


def fresh_over(folder, embd, head, feats):
    d = DFlashDraft.from_path(folder, embd, head)
    d.append_context(feats)
    return d


def test_propose_topk(tmp_path):
    folder = write_draft(tmp_path / "d", hf_config())
    embd, head = target_head()
    draft = DFlashDraft.from_path(folder, embd, head)
    draft.append_context(np.ones((3, 3 * HIDDEN), np.float32))
    logprobs, ids = draft.propose(7, top_k=4)
    assert logprobs.shape == ids.shape == (7, 4)
    full = draft.forward_block(7)
    full = full - np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1, keepdims=True)) - full.max(-1, keepdims=True)
    np.testing.assert_array_equal(ids[:, 0], full.argmax(-1))
    np.testing.assert_allclose(logprobs, np.take_along_axis(full, ids, -1), rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(logprobs, axis=-1) <= 0)


def test_top_k_ties_go_to_lower_id():
    logits = np.array([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0]], np.float32)
    lp, ids = top_k_logprobs(logits, 2)
    assert ids.tolist() == [[1, 3]]
    assert lp[0, 0] == lp[0, 1]


def test_bf16_checkpoint_loads_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    folder = write_draft(tmp_path / "d", hf_config(), dtype="bfloat16")
    from safetensors.torch import load_file

    ref = load_file(str(folder / "model.safetensors"))
    _, weights = load_draft(folder)
    np.testing.assert_array_equal(weights["blk.1.ffn_down.weight"],
                                  ref["layers.1.mlp.down_proj.weight"].to(torch.float32).numpy())
    assert is_dflash_folder(folder) and not is_dflash_folder(tmp_path)


def test_config_defaults_and_metadata_round_trip():
    cfg = hf_config(block_size=None, use_sliding_window=True, sliding_window=2048, max_window_layers=1,
                    dflash_config={"mask_token_id": 248070, "block_size": 16},
                    num_target_layers=64, num_hidden_layers=5, rope_theta=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e7})
    c = DFlashConfig.from_hf(cfg)
    assert c.target_layer_ids == (1, 16, 31, 46, 61)
    assert c.block_size == 16 and c.rope_theta == 1e7 and c.sliding_window == 2048
    assert c.layer_types == ("full_attention",) + ("sliding_attention",) * 4
    md = c.to_gguf_metadata()
    assert DFlashConfig.from_gguf_metadata({"general.architecture": "dflash-qwen3", **md}) == c
    forced = DFlashConfig.from_hf(hf_config(is_causal=True))
    assert DFlashConfig.from_gguf_metadata(forced.to_gguf_metadata()) == forced


def test_unsupported_and_bad_drafts(tmp_path):
    with pytest.raises(UnsupportedModel):
        DFlashConfig.from_hf(hf_config(architectures=["DFlash2DraftModel"]))
    with pytest.raises(UnsupportedModel):
        DFlashConfig.from_hf(hf_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(BadModelFile):
        DFlashConfig.from_hf(hf_config(dflash_config={"target_layer_ids": [1]}))
    folder = write_draft(tmp_path / "d", hf_config())
    cfg = hf_config(num_hidden_layers=3)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadModelFile, match="missing"):
        load_draft(folder)


# ---- GGUF form (quant/convert_draft.py) -------------------------------------------------------


def _gguf_round_trip(tmp_path, cfg, qtype, dtype="float32"):
    from lucebox_cli.gguf_io import GGUFModel
    from lucebox_cli.quant.convert_draft import convert_draft

    folder = write_draft(tmp_path / "hf", cfg, dtype=dtype)
    seen = []
    res = convert_draft(folder, tmp_path / f"draft-{qtype}.gguf", qtype, progress=lambda d, t, n: seen.append(n))
    assert res.path.is_file() and not list(tmp_path.glob("*.tmp-*"))
    assert seen[-1] == res.tensors[-1].name
    model = GGUFModel(res.path)
    assert model.architecture == "dflash-qwen3"
    types = {n: model.tensor_info(n).ggml_type for n in model.tensor_names}
    embd, head = target_head(hidden=cfg["hidden_size"])
    feats = np.random.default_rng(5).standard_normal((9, DFlashConfig.from_hf(cfg).fc_in)).astype(np.float32)
    outs = []
    for src in (folder, res.path):
        d = DFlashDraft.from_path(src, embd, head)
        d.append_context(feats)
        outs.append(d.forward_block(4))
    return res, types, outs, folder


@pytest.mark.parametrize("qtype,dtype", [("F32", "float32"), ("BF16", "bfloat16")])
def test_gguf_float_round_trip_is_exact(tmp_path, qtype, dtype):
    cfg = hf_config(use_sliding_window=True, sliding_window=5, layer_types=["sliding_attention", "full_attention"])
    res, types, (hf, gguf), _ = _gguf_round_trip(tmp_path, cfg, qtype, dtype)
    assert types["fc.weight"] == qtype and types["blk.0.attn_norm.weight"] == "F32"
    np.testing.assert_array_equal(hf, gguf)
    from lucebox_cli.models.dflash_draft import load_draft

    assert load_draft(res.path)[0] == DFlashConfig.from_hf(cfg)


def test_gguf_q8_0_round_trip_is_close(tmp_path):
    _, types, (hf, gguf), _ = _gguf_round_trip(tmp_path, hf_config(), "Q8_0")
    assert {t for n, t in types.items() if n.endswith("norm.weight")} == {"F32"}
    assert {t for n, t in types.items() if not n.endswith("norm.weight")} == {"Q8_0"}
    assert 0 < rel_rms(gguf, hf) < 2e-2


def test_q4_k_m_mix():
    from lucebox_cli.quant.convert_draft import tensor_type

    assert tensor_type("fc.weight", (256, 768), "Q4_K_M") == "Q6_K"
    assert tensor_type("blk.3.attn_v.weight", (128, 256), "Q4_K_M") == "Q6_K"
    assert tensor_type("blk.3.ffn_down.weight", (256, 512), "Q4_K_M") == "Q6_K"
    assert tensor_type("blk.3.attn_q.weight", (512, 256), "Q4_K_M") == "Q4_K"
    assert tensor_type("blk.3.attn_q.weight", (512, 96), "Q4_K_M") == "Q8_0"
    assert tensor_type("blk.3.attn_q.weight", (512, 40), "Q8_0") == "BF16"
    assert tensor_type("blk.3.attn_q_norm.weight", (128,), "Q4_K_M") == "F32"


@pytest.mark.slow
def test_gguf_q4_k_m_round_trip(tmp_path):
    from lucebox_cli.models.dflash_draft import load_draft

    cfg = hf_config(hidden_size=256, intermediate_size=512, head_dim=64, block_size=4)
    res, types, (hf, gguf), folder = _gguf_round_trip(tmp_path, cfg, "Q4_K_M")
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["fc.weight"] == "Q6_K" and types["blk.0.ffn_norm.weight"] == "F32"
    # random Gaussian weights are the worst case for 4 bits: bound each tensor, then the logits loosely
    want, got = load_draft(folder)[1], load_draft(res.path)[1]
    bound = {"Q4_K": 0.12, "Q6_K": 0.03, "F32": 0.0}
    for name, t in types.items():
        assert rel_rms(got[name], want[name]) <= bound[t], name
    assert 0 < rel_rms(gguf, hf) < 0.25


def test_convert_rejects_unknown_type(tmp_path):
    from lucebox_cli.errors import UsageError
    from lucebox_cli.quant.convert_draft import convert_draft

    with pytest.raises(UsageError):
        convert_draft(tmp_path, tmp_path / "x.gguf", "Q5_K_M")
