"""The 27B target engine's memory plan (engines/memory_plan.py): the real 27B shapes in llama.cpp's
Q4_K_M mix with the 3.46 GB BF16 DFlash draft.

On the rtx3090-sm86 profile (24 GB, budget 22) the largest context that fits is 41,690 tokens (with the
640 MiB CUDA margin and token_embd kept on the host); the H200 profile (141 GB, budget 40) fits far
more than the model's 262,144-token window. A change to any buffer or to the margin moves these
numbers: update them here and in docs/perf.md together.
"""

from __future__ import annotations

import pytest

from lucebox_cli.config import get_profile
from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.errors import OutOfMemory, UsageError

# 41,726 before the split DeltaNet scan's chunk start states (3 MB at 64 rows), 41,732 before the 0.5 MB
# device argmax / top-8 buffers
LARGEST_3090 = 41_690


@pytest.fixture(scope="module")
def big():
    cfg = mp.qwen35_27b_config()
    return cfg, mp.sizes_from_mix(cfg, "Q4_K_M")


def test_27b_sizes(big):
    cfg, sizes = big
    # llama.cpp's Q4_K_M file of the 27B: ~16.5 GB, the LM head Q6_K, the embedding Q4_K
    assert 16.3e9 < sum(s.nbytes for s in sizes.values()) < 16.8e9
    assert sizes["output.weight"].ggml_type == "Q6_K" and sizes["token_embd.weight"].ggml_type == "Q4_K"
    p = mp.plan(cfg, sizes, context=4096, budget=22)
    assert p.bytes_of("kv cache") == 4096 * 64 * 1024  # f16: 64 KiB per token
    assert p.bytes_of("deltanet state") == 144 * 2**20
    assert p.bytes_of("logits") == 64 * cfg.vocab * 4
    # the embedding is not on the device for an untied head
    assert p.bytes_of("target weights") < sum(s.nbytes for s in sizes.values()) - 0.7e9
    assert "the 27B Q4_K_M target" in p.label


def test_draft_spec():
    assert abs(mp.DFLASH_27B_BF16.weight_bytes - 3.46e9) < 0.01e9
    assert mp.DFLASH_27B_BF16.kv_per_token == 20 * 1024


def test_largest_context_3090(big):
    cfg, sizes = big
    prof = get_profile("rtx3090-sm86")
    card = mp.card_bytes_of_profile(prof)
    best = mp.largest_context(cfg, sizes, card, budget=prof.run.budget, draft=mp.DFLASH_27B_BF16)
    assert best == LARGEST_3090
    assert mp.plan(cfg, sizes, context=best, budget=22, draft=mp.DFLASH_27B_BF16).total <= card
    assert mp.plan(cfg, sizes, context=best + 1, budget=22, draft=mp.DFLASH_27B_BF16).total > card
    # the profile's default context fits
    mp.fit(mp.plan(cfg, sizes, context=prof.run.max_context, budget=22, draft=mp.DFLASH_27B_BF16), card)


def test_prefill_rows_cost_context(big):
    """run.prefill_rows sizes the activations, DeltaNet scratch and attention partials by the rows of one pass;
    the logits stay at 64 rows. On the 3090 a 256-row pass would cost ~1,950 tokens of context (target and
    draft KV), which is why its profile keeps 64."""
    cfg, sizes = big
    p64 = mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=64)
    p256 = mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=256)
    assert p256.bytes_of("activations") == pytest.approx(4 * p64.bytes_of("activations"), rel=1e-3)
    assert p256.bytes_of("logits") == p64.bytes_of("logits") == 64 * cfg.vocab * 4
    assert 150 * 2**20 < p256.total - p64.total < 170 * 2**20
    prof = get_profile("rtx3090-sm86")
    card = mp.card_bytes_of_profile(prof)
    at256 = mp.largest_context(cfg, sizes, card, budget=22, draft=mp.DFLASH_27B_BF16, prefill_rows=256)
    assert 1_800 < LARGEST_3090 - at256 < 2_100  # 41,690 -> 39,633
    assert prof.run.prefill_rows == 64 and get_profile("h200-sm90").run.prefill_rows == 256
    with pytest.raises(UsageError, match="multiple of 64"):
        mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=96)


def test_h200_much_larger(big):
    cfg, sizes = big
    prof = get_profile("h200-sm90")
    best = mp.largest_context(cfg, sizes, mp.card_bytes_of_profile(prof), budget=prof.run.budget,
                              draft=mp.DFLASH_27B_BF16)
    assert best > 20 * LARGEST_3090 and best > cfg.context_length


def test_refusal_names_the_numbers(big):
    cfg, sizes = big
    p = mp.plan(cfg, sizes, context=100_000, budget=22, draft=mp.DFLASH_27B_BF16)
    with pytest.raises(OutOfMemory) as err:
        mp.fit(p, 24_000_000_000, "24 GB")
    msg = err.value.message
    assert f"up to {LARGEST_3090} tokens" in msg and "asked for 100000" in msg
    assert "the 27B Q4_K_M target + BF16 draft fit a 24 GB card" in msg
    assert str(LARGEST_3090) in err.value.hint


def test_no_context_fits(big):
    cfg, sizes = big
    with pytest.raises(OutOfMemory, match="does not fit a 16 GB card at any context"):
        mp.fit(mp.plan(cfg, sizes, context=1024, budget=22), 16_000_000_000, "16 GB")


def test_bad_budget(big):
    cfg, sizes = big
    with pytest.raises(UsageError, match="budget"):
        mp.plan(cfg, sizes, context=1024, budget=64)


def test_gdn_scratch_formula_matches_the_step_part():
    # lb_gdn_step_scratch_bytes(t) = t * (2 hk 128 + 2 hv 128 + 2 hv) * 4 is the first part of the prefill scratch
    t, hk, hv = 64, 16, 48
    step = t * (2 * hk * 128 + 2 * hv * 128 + 2 * hv) * 4
    assert mp.gdn_prefill_scratch(t, hk, hv) > step
