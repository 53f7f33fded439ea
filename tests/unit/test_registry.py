"""registry.resolve: aliases (data), quant tags, raw hub repos, local paths, and the errors users see."""

from __future__ import annotations

import dataclasses

import pytest

from lucebox_cli import registry
from lucebox_cli.errors import ModelNotFound, UsageError
from lucebox_cli.registry import QUANT_TAGS, resolve


def test_aliases_are_data_with_known_roles():
    assert registry.known_aliases() == ["qwen3.5-0.8b", "qwen3.5-27b", "qwen3.6-27b"]
    for entry in registry.ALIASES.values():
        assert entry["format"] in ("gguf", "safetensors")
        assert {r["role"] for r in entry["repos"]} <= set(registry.ROLES)


def test_qwen35_08b_is_bf16_safetensors_with_tokenizer():
    spec = resolve("qwen3.5-0.8b")
    assert spec.format == "safetensors" and spec.quant is None and not spec.is_local
    target, tok = spec.repo("target"), spec.repo("tokenizer")
    assert target.repo_id == tok.repo_id == "Qwen/Qwen3.5-0.8B"
    assert {"config.json", "*.safetensors"} <= set(target.allow_patterns)
    assert "tokenizer.json" in tok.allow_patterns
    assert spec.repo("draft") is None


@pytest.mark.parametrize(
    "name, quant, target_repo, draft_repo, gguf",
    [
        ("qwen3.5-27b", "Q4_K_M", "unsloth/Qwen3.5-27B-GGUF", "z-lab/Qwen3.5-27B-DFlash", "Qwen3.5-27B-Q4_K_M.gguf"),
        ("qwen3.5-27b:q8_0", "Q8_0", "unsloth/Qwen3.5-27B-GGUF", "z-lab/Qwen3.5-27B-DFlash", "Qwen3.5-27B-Q8_0.gguf"),
        ("Qwen3.5-27B:BF16", "BF16", "unsloth/Qwen3.5-27B-GGUF", "z-lab/Qwen3.5-27B-DFlash", "Qwen3.5-27B-BF16.gguf"),
        ("qwen3.6-27b", "Q4_K_M", "unsloth/Qwen3.6-27B-GGUF", "z-lab/Qwen3.6-27B-DFlash", "Qwen3.6-27B-Q4_K_M.gguf"),
        ("qwen3.6-27b:Q6_K", "Q6_K", "unsloth/Qwen3.6-27B-GGUF", "z-lab/Qwen3.6-27B-DFlash", "Qwen3.6-27B-Q6_K.gguf"),
    ],
)
def test_gguf_aliases(name, quant, target_repo, draft_repo, gguf):
    spec = resolve(name)
    assert spec.format == "gguf" and spec.quant == quant
    assert spec.repo("target").repo_id == target_repo
    assert gguf in spec.repo("target").allow_patterns
    # Quants over the hub's 50 GB file limit come as shards in a folder named after the quant.
    assert f"{quant}/{gguf[:-5]}-*-of-*.gguf" in spec.repo("target").allow_patterns
    assert spec.repo("draft").repo_id == draft_repo
    assert all(r.revision == "main" for r in spec.repos)


def test_name_keeps_what_the_user_typed_so_hints_can_repeat_it():
    assert resolve("qwen3.5-27b").name == "qwen3.5-27b"
    assert resolve("qwen3.5-27b:q8_0").name == "qwen3.5-27b:Q8_0"


def test_bad_quant_tag_lists_the_allowed_tags():
    with pytest.raises(UsageError) as err:
        resolve("qwen3.5-27b:Q3_XXL")
    assert "Q3_XXL" in err.value.message
    for tag in QUANT_TAGS:
        assert tag in err.value.message
    assert "default Q4_K_M" in err.value.message


def test_safetensors_alias_takes_no_quant_tag():
    with pytest.raises(UsageError, match="takes no quant tag"):
        resolve("qwen3.5-0.8b:Q8_0")


def test_unknown_alias_lists_known_ones_and_hints_org_repo():
    with pytest.raises(ModelNotFound) as err:
        resolve("llama-7b")
    for alias in registry.known_aliases():
        assert alias in err.value.message
    assert "org/repo" in err.value.hint
    assert "\n" not in err.value.message


@pytest.mark.parametrize(
    "name, fmt, quant",
    [
        ("someorg/some-model", "safetensors", None),
        ("unsloth/Foo-GGUF", "gguf", "Q4_K_M"),
        ("someorg/foo:q5_k_m", "gguf", "Q5_K_M"),
    ],
)
def test_raw_repos(name, fmt, quant):
    spec = resolve(name)
    assert spec.format == fmt and spec.quant == quant
    assert spec.repo("target").repo_id == name.split(":")[0]
    if fmt == "gguf":
        assert f"*-{quant}.gguf" in spec.repo("target").allow_patterns


def test_raw_repo_bad_tag_or_id():
    with pytest.raises(UsageError, match="Q4_K_M"):
        resolve("someorg/foo:Q1_0")
    with pytest.raises(UsageError, match="not a valid hub repo id"):
        resolve("someorg/foo--bar")


def test_local_gguf_file_and_directory(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    spec = resolve(str(gguf))
    assert spec.is_local and spec.local_path == gguf and spec.format == "gguf" and spec.repos == ()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    spec = resolve(str(tmp_path / "ckpt"))
    assert spec.is_local and spec.format == "safetensors"


def test_missing_local_path_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFound, match="not a .gguf"):
        (tmp_path / "x.bin").write_bytes(b"")
        resolve(str(tmp_path / "x.bin"))


def test_specs_are_frozen():
    spec = resolve("qwen3.5-27b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.quant = "Q8_0"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.repos[0].revision = "x"  # type: ignore[misc]


def test_with_revision_pins_target_or_a_role():
    spec = resolve("qwen3.5-27b").with_revision("v1").with_revision("draft=abc")
    assert spec.repo("target").revision == "v1"
    assert spec.repo("draft").revision == "abc"
    # The tokenizer lives in the target's repo: both move to the same revision.
    small = resolve("qwen3.5-0.8b").with_revision("v2")
    assert small.repo("target").revision == small.repo("tokenizer").revision == "v2"
    with pytest.raises(UsageError, match="no 'draft' repo"):
        resolve("qwen3.5-0.8b").with_revision("draft=x")
