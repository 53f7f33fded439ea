"""models/qwen35.py and the CPU engine against HF transformers' Qwen3_5ForCausalLM (torch CPU, fp32).

Two tiny random checkpoints with the real structure and the real 248320-token vocabulary:
(Hk = Hv, tied head) and (Hv = 3·Hk, untied head), 4 layers (DeltaNet, attention, DeltaNet, attention).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.errors import BadModelFile, UnsupportedModel
from lucebox_cli.models import qwen35
from lucebox_cli.models.qwen35 import Qwen35Config, hf_to_internal, internal_to_hf, iter_hf_tensors, load_hf_checkpoint
from tiny_models import make_tiny_checkpoint, write_safetensors

torch = pytest.importorskip("torch")
transformers_qwen = pytest.importorskip("transformers.models.qwen3_5")

STRUCTURES = {"Hk2-Hv2-tied": dict(hv_ratio=1, tied=True), "Hk2-Hv6-untied": dict(hv_ratio=3, tied=False)}
PROMPT_LEN = 70  # crosses the 64-token DeltaNet chunk boundary


def rel_rms(a: np.ndarray, b: np.ndarray, axis=None) -> np.ndarray:
    return np.sqrt(np.mean((a - b) ** 2, axis=axis) / np.mean(b**2, axis=axis))


@pytest.fixture(scope="module", params=list(STRUCTURES), ids=list(STRUCTURES))
def tiny(request, tmp_path_factory):
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp(request.param), **STRUCTURES[request.param])
    cfg, weights = load_hf_checkpoint(folder)
    hf = transformers_qwen.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = np.random.default_rng(7).integers(0, 248000, PROMPT_LEN)
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0].numpy()
    return dict(key=request.param, folder=folder, cfg=cfg, weights=weights, hf=hf, ids=ids, ref=ref)


def test_config_from_hf(tiny):
    cfg, want = tiny["cfg"], STRUCTURES[tiny["key"]]
    assert (cfg.hk, cfg.hv, cfg.tied, cfg.vocab) == (2, 2 * want["hv_ratio"], want["tied"], 248320)
    assert cfg.layer_types == ("deltanet", "attention", "deltanet", "attention")
    assert cfg.full_attention_interval == 2 and cfg.rope_dims == 16 and cfg.rope_theta == 1e7
    hf_cfg = tiny["hf"].config.to_dict()
    assert Qwen35Config.from_hf_config(hf_cfg) == cfg


def test_logits_match_hf_every_position(tiny):
    engine = CPUEngine(tiny["cfg"], tiny["weights"])
    ours = engine.prefill(tiny["ids"], all_logits=True)
    assert ours.shape == tiny["ref"].shape
    assert rel_rms(ours, tiny["ref"], axis=-1).max() < 1e-4


def test_prefill_then_decode_equals_full_forward(tiny):
    engine = CPUEngine(tiny["cfg"], tiny["weights"])
    ids, ref, split = tiny["ids"], tiny["ref"], 37
    rows = [engine.prefill(ids[:split])]
    rows += [engine.step(int(t)) for t in ids[split:]]
    assert engine.n_past == PROMPT_LEN
    assert rel_rms(np.stack(rows), ref[split - 1 :], axis=-1).max() < 1e-4


def test_greedy_generation_matches_hf_generate(tiny):
    prompt = tiny["ids"][:12]
    with torch.no_grad():
        hf_out = tiny["hf"].generate(torch.tensor(prompt)[None], max_new_tokens=16, do_sample=False)
    want = hf_out[0, prompt.size :].tolist()
    engine = CPUEngine(tiny["cfg"], tiny["weights"])
    got = [int(np.argmax(engine.prefill(prompt)))]
    while len(got) < 16:
        got.append(int(np.argmax(engine.step(got[-1]))))
    assert got == want


def test_hf_internal_round_trip_is_exact(tiny):
    cfg = tiny["cfg"]
    for name, array in iter_hf_tensors(tiny["folder"]):
        mapped = hf_to_internal(name, array, cfg)
        assert mapped is not None and len(mapped) == 1
        (back_name, back), = internal_to_hf(*mapped[0], cfg)
        assert back_name == name
        if array.ndim == 2 and array.shape[1] > 4:  # matrices move without arithmetic: bit-exact
            assert np.array_equal(back, array), name
        else:  # norms (±1), A_log (log/exp), conv (reshape)
            np.testing.assert_allclose(back, array, rtol=1e-6, atol=1e-6)


def test_value_heads_are_tiled(tiny):
    """Internal value head p must be HF value head (p % Hk)·r + p // Hk on every per-value-head tensor."""
    cfg, w = tiny["cfg"], tiny["weights"]
    hf = dict(iter_hf_tensors(tiny["folder"]))
    r, hk, dv = cfg.value_per_key, cfg.hk, cfg.dv
    grouped = np.array([(p % hk) * r + p // hk for p in range(cfg.hv)])
    rows = (grouped[:, None] * dv + np.arange(dv)).reshape(-1)
    la = "model.layers.0.linear_attn."
    np.testing.assert_array_equal(w["blk.0.ssm_a"], -np.exp(hf[la + "A_log"][grouped]))
    np.testing.assert_array_equal(w["blk.0.ssm_dt.bias"], hf[la + "dt_bias"][grouped])
    np.testing.assert_array_equal(w["blk.0.ssm_beta.weight"], hf[la + "in_proj_b.weight"][grouped])
    np.testing.assert_array_equal(w["blk.0.ssm_alpha.weight"], hf[la + "in_proj_a.weight"][grouped])
    np.testing.assert_array_equal(w["blk.0.attn_gate.weight"], hf[la + "in_proj_z.weight"][rows])
    np.testing.assert_array_equal(w["blk.0.ssm_out.weight"], hf[la + "out_proj.weight"][:, rows])
    qk = 2 * hk * cfg.dk
    np.testing.assert_array_equal(w["blk.0.attn_qkv.weight"][qk:], hf[la + "in_proj_qkv.weight"][qk:][rows])
    np.testing.assert_array_equal(w["blk.0.ssm_conv1d.weight"][qk:], hf[la + "conv1d.weight"][qk:, 0][rows])
    np.testing.assert_array_equal(w["blk.0.ssm_norm.weight"], hf[la + "norm.weight"])  # plain, no +1
    np.testing.assert_array_equal(w["blk.0.attn_norm.weight"], hf["model.layers.0.input_layernorm.weight"] + 1)
    assert ("output.weight" in w) != cfg.tied


def test_gguf_metadata_round_trip(tiny):
    cfg = tiny["cfg"]
    meta = cfg.to_gguf_metadata()
    assert meta["general.architecture"] == "qwen35" and meta["qwen35.ssm.inner_size"] == cfg.hv * cfg.dv
    assert Qwen35Config.from_gguf_metadata(meta, tied=cfg.tied) == cfg


def test_vlm_naming_bf16_and_shards(tmp_path, tiny):
    """VLM config + model.language_model.* names, bf16 storage and a sharded index load the same model."""
    want = STRUCTURES[tiny["key"]]
    if want["hv_ratio"] == 1:
        pytest.skip("one structure is enough for the loader paths; Hv = 3·Hk also covers the reorder")
    folder = make_tiny_checkpoint(tmp_path / "vlm", vlm=True, dtype="bfloat16", **want)
    tensors = dict(iter_hf_tensors(folder))
    tensors["mtp.fc.weight"] = np.zeros((2, 2), np.float32)  # MTP head: skipped by the text model
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((2, 2), np.float32)
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in shards.items():
        write_safetensors(folder / file, {n: tensors[n] for n in part})
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg, weights = load_hf_checkpoint(folder)
    assert cfg == tiny["cfg"] and weights.keys() == tiny["weights"].keys()
    for name, x in tiny["weights"].items():
        # bf16 keeps 8 mantissa bits.
        np.testing.assert_allclose(weights[name], x, rtol=2**-8, atol=1e-6 if "norm" not in name else 2**-7)


def test_truncated_and_foreign_checkpoints(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "t", vocab=512)
    st = folder / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    with pytest.raises(BadModelFile, match="truncated"):
        load_hf_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(UnsupportedModel, match="llama"):
        Qwen35Config.from_hf_config({**config, "model_type": "llama"})
    with pytest.raises(UnsupportedModel):
        Qwen35Config.from_gguf_metadata({"general.architecture": "llama"})
    del config["num_hidden_layers"]
    with pytest.raises(BadModelFile, match="num_hidden_layers"):
        Qwen35Config.from_hf_config(config)


def test_missing_tensor_named(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "m", vocab=512)
    tensors = dict(iter_hf_tensors(folder))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(BadModelFile, match=r"blk\.1\.attn_k_norm\.weight"):
        load_hf_checkpoint(folder)
    assert qwen35.expected_tensors(Qwen35Config.from_hf_config(qwen35.read_hf_config(folder)))
