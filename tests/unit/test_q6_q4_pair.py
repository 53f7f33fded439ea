"""engines/dflash_layers.Layers.q6_q4_pair and matmuls' use of it: a DeltaNet layer's one-row attn_qkv (Q6_K_T)
and attn_gate + ssm_beta + ssm_alpha (one Q4_K_T tensor, back-to-back outputs), and an attention layer's one-row
attn_q + attn_k (one Q4_K_T tensor) and attn_v (Q6_K_T), become one lb_gemv_q_pair call where the library has it;
everything else keeps matmuls' other forms (the library reads LUCEBOX_QKV_ZBA=0 itself: tests/gpu).
The tiny fixture of the emulated engine tests has no Q6_K attn_qkv / attn_v, so the layers here are synthetic: 27B
shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lucebox_cli.engines.dflash_layers import F32, AttnLayer, Buffers, GdnLayer, Layers, Mat, Pass

K = 5120
ROWS = {"attn_qkv": 10240, "attn_gate": 6144, "ssm_beta": 48, "ssm_alpha": 48}
NAMES = tuple(f"blk.0.{n}.weight" for n in ROWS)


def mats(qkv_type=270, zba_type=268, gap=0, k_zba=K):
    m, at = {}, 1 << 20
    m[NAMES[0]] = Mat(at, qkv_type, ROWS["attn_qkv"], K)
    at += 1 << 28
    for n, key in zip(NAMES[1:], ("attn_gate", "ssm_beta", "ssm_alpha")):
        m[n] = Mat(at, zba_type, ROWS[key], k_zba)
        at += ROWS[key] * (k_zba // 256) * 144 + gap
    m["blk.0.ssm_out.weight"] = Mat(at + (1 << 24), 268, K, 6144)
    return m


class RecLib:
    def __init__(self, pair=True):
        names = ["lb_gemv_q", "lb_gdn_decode_step"] + (["lb_gemv_q_pair"] if pair else [])
        self.fn = SimpleNamespace(**{n: object() for n in names})
        self.calls = []

    def call(self, name, *args):
        self.calls.append((name, args))


def layers(m, pair=True):
    cfg = SimpleNamespace(conv_channels=10240, hv=48, dv=128, hk=16, eps=1e-6)
    b = Buffers(*([0] * 2), proj=1 << 40, act=0, qf=0, gdn_scratch=0, tree_q=0, tree_o=0, saves=0, partials=0,
                logits=0, topk_scratch=0, topk_ids=0, parents=0, positions=0, masks=0, path=0)
    b.gdn[0] = GdnLayer(state=0, conv=0)
    vecs = {f"blk.0.{n}": 0 for n in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight")}
    lib = RecLib(pair)
    return Layers(lib, cfg, m, vecs, b, max_ctx=256), lib


def ys_back_to_back(y0=1 << 30):
    qkv = y0
    z = qkv + ROWS["attn_qkv"] * F32
    beta = z + ROWS["attn_gate"] * F32
    a = beta + ROWS["ssm_beta"] * F32
    return [qkv, z, beta, a]


def test_pair_plan_at_27b_types():
    L, _ = layers(mats())
    assert L.gemv_pair
    assert L.q6_q4_pair(NAMES, ys_back_to_back(), 1) == (0, [1, 2, 3])
    assert L.q6_q4_pair(NAMES, ys_back_to_back(), 2) is None  # verify / prefill rows: unchanged


@pytest.mark.parametrize("kw", [dict(qkv_type=14), dict(qkv_type=268), dict(zba_type=12), dict(gap=256),
                                dict(k_zba=6144)])
def test_no_pair_otherwise(kw):
    L, _ = layers(mats(**kw))
    assert L.q6_q4_pair(NAMES, ys_back_to_back(), 1) is None


def test_no_pair_without_the_entry_or_with_split_outputs():
    L, _ = layers(mats(), pair=False)
    assert L.q6_q4_pair(NAMES, ys_back_to_back(), 1) is None
    L, _ = layers(mats())
    ys = ys_back_to_back()
    ys[3] += 16
    assert L.q6_q4_pair(NAMES, ys, 1) is None


def test_deltanet_step_issues_one_pair_call():
    m = mats()
    L, lib = layers(m)
    p = SimpleNamespace(mode="step", t=1)
    regs, _ = L.deltanet_regions(0, p)
    L.deltanet(0, p, regs)
    names = [c[0] for c in lib.calls]
    assert names[0] == "lb_gemv_q_pair" and "lb_gemv_q" in names[1:]  # ssm_out stays lb_gemv_q
    assert names.count("lb_gemv_q_pair") == 1 and names.count("lb_gemv_q") == 1
    args = lib.calls[0][1]
    qkv, z, a, beta = regs
    rows_zba = ROWS["attn_gate"] + ROWS["ssm_beta"] + ROWS["ssm_alpha"]
    assert args[:4] == (270, m[NAMES[0]].ptr, ROWS["attn_qkv"], qkv)
    assert args[4:8] == (268, m[NAMES[1]].ptr, rows_zba, z)
    assert args[8] == K and args[10] == 1
    assert z == qkv + ROWS["attn_qkv"] * F32 and beta == z + ROWS["attn_gate"] * F32 and a == beta + 48 * F32


def test_deltanet_step_without_the_entry_keeps_gemvs():
    L, lib = layers(mats(), pair=False)
    p = SimpleNamespace(mode="step", t=1)
    regs, _ = L.deltanet_regions(0, p)
    L.deltanet(0, p, regs)
    rows = [c[1][2] for c in lib.calls if c[0] == "lb_gemv_q"]
    assert rows == [ROWS["attn_qkv"], 6144 + 48 + 48, K]


# an attention layer of the 27B: attn_q (q + gate, 12288 rows) and attn_k (1024) one Q4_K_T tensor, attn_v (1024)
# Q6_K_T where the Q4_K_M mix gave it more bits, else Q4_K_T right after attn_k
A_ROWS = {"attn_q": 12288, "attn_k": 1024, "attn_v": 1024}
A_NAMES = tuple(f"blk.3.{n}.weight" for n in A_ROWS)


def attn_mats(v_type=270, gap=0):
    m, at = {}, 1 << 20
    for n, key in zip(A_NAMES, A_ROWS):
        qtype = v_type if key == "attn_v" else 268
        m[n] = Mat(at, qtype, A_ROWS[key], K)
        at += A_ROWS[key] * (K // 256) * 144 + (gap if key == "attn_q" else 0)
    m["blk.3.attn_output.weight"] = Mat(at + (1 << 24), 268, K, 6144)
    return m


def attn_layers(m, pair=True, tickets=0):
    cfg = SimpleNamespace(n_heads=24, n_kv_heads=4, head_dim=256, rope_dims=64, rope_theta=1e7, eps=1e-6)
    b = Buffers(*([0] * 2), proj=1 << 40, act=0, qf=0, gdn_scratch=0, tree_q=0, tree_o=0, saves=0, partials=0,
                logits=0, topk_scratch=0, topk_ids=0, parents=0, positions=0, masks=0, path=0, tickets=tickets)
    b.attn[3] = AttnLayer(kc=0, vc=0)
    vecs = {f"blk.3.{n}": 0 for n in ("attn_q_norm.weight", "attn_k_norm.weight")}
    lib = RecLib(pair)
    if tickets:
        lib.fn.lb_attn_decode_fused = object()
    return Layers(lib, cfg, m, vecs, b, max_ctx=256), lib


@pytest.mark.parametrize("tickets", [0, 1])
def test_attention_step_with_q6_v_issues_one_pair_call(tickets):
    m = attn_mats()
    L, lib = attn_layers(m, tickets=tickets)
    p = Pass("step", 1, 7)
    regs, _ = L.attention_regions(1)
    qg, k, v = regs
    assert k == qg + A_ROWS["attn_q"] * F32  # q and k back to back: one Q4 part
    assert L.q6_q4_pair(A_NAMES, regs, 1) == (2, [0, 1])
    L.attention(3, p, regs)
    names = [c[0] for c in lib.calls]
    assert names[0] == "lb_gemv_q_pair" and names.count("lb_gemv_q_pair") == 1
    assert names.count("lb_gemv_q") == 1 and names[-1] == "lb_gemv_q"  # attn_output alone
    args = lib.calls[0][1]
    assert args[:4] == (270, m[A_NAMES[2]].ptr, A_ROWS["attn_v"], v)
    assert args[4:8] == (268, m[A_NAMES[0]].ptr, A_ROWS["attn_q"] + A_ROWS["attn_k"], qg)
    assert args[8] == K and args[10] == 1


def test_attention_all_q4_stays_one_gemv():
    L, lib = attn_layers(attn_mats(v_type=268))
    regs, _ = L.attention_regions(1)
    assert L.q6_q4_pair(A_NAMES, regs, 1) is None
    L.attention(3, Pass("step", 1, 7), regs)
    gemvs = [c[1][2] for c in lib.calls if c[0] == "lb_gemv_q"]
    assert gemvs == [sum(A_ROWS.values()), K] and "lb_gemv_q_pair" not in [c[0] for c in lib.calls]


@pytest.mark.parametrize("kw", [dict(pair=False), dict(gap=256)])
def test_attention_without_the_entry_or_split_q4_keeps_gemvs(kw):
    L, lib = attn_layers(attn_mats(gap=kw.get("gap", 0)), pair=kw.get("pair", True))
    regs, _ = L.attention_regions(1)
    L.attention(3, Pass("step", 1, 7), regs)
    gemvs = [c[1][2] for c in lib.calls if c[0] == "lb_gemv_q"]
    want = [A_ROWS["attn_q"] + A_ROWS["attn_k"], A_ROWS["attn_v"], K] if not kw.get("gap") else \
        [A_ROWS["attn_q"], A_ROWS["attn_k"], A_ROWS["attn_v"], K]
    assert gemvs == want and "lb_gemv_q_pair" not in [c[0] for c in lib.calls]
