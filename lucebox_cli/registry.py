"""Model names → what to fetch: aliases are a data table, resolved into frozen ModelSpecs.

A name is one of:
- an alias from ALIASES (`qwen3.5-27b`, optionally with a quant tag: `qwen3.5-27b:Q8_0`);
- a raw hub repo `org/repo[:QUANT]` (a quant tag, or a repo named `*-GGUF`, means GGUF files);
- a local path: a directory (HF checkpoint) or a `.gguf` file.

Nothing here touches the network or the cache; hub.py turns a ModelSpec into files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox_cli.errors import ModelNotFound, UsageError

ROLES = ("target", "draft", "tokenizer")
DEFAULT_REVISION = "main"
DEFAULT_QUANT = "Q4_K_M"

# GGUF quant tags the engines can run (their tensors are BF16/Q8_0/Q4_K/Q5_K/Q6_K); first is the default.
QUANT_TAGS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "BF16")

_SAFETENSORS_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
)
# Unsloth puts a quant in one file at the repo root, or (when over the hub's 50 GB limit) as
# `{QUANT}/<stem>-{QUANT}-0000k-of-0000n.gguf` shards in a folder.
_GGUF_FILES = ("{stem}-{quant}.gguf", "{quant}/{stem}-{quant}-*-of-*.gguf")
_GGUF_FILES_ANY_STEM = ("*-{quant}.gguf", "{quant}/*-{quant}-*-of-*.gguf")


def _gguf_with_draft(version: str) -> dict[str, Any]:
    """Qwen{version} 27B: Unsloth's GGUF target and z-lab's matching DFlash draft."""
    return {
        "format": "gguf",
        "description": f"Qwen{version} 27B GGUF target + DFlash draft (DDTree speculative decoding)",
        "default_quant": DEFAULT_QUANT,
        "stem": f"Qwen{version}-27B",
        "repos": [
            {"role": "target", "repo": f"unsloth/Qwen{version}-27B-GGUF", "files": _GGUF_FILES},
            {"role": "draft", "repo": f"z-lab/Qwen{version}-27B-DFlash", "files": _SAFETENSORS_FILES},
        ],
    }


# The registry. `files` patterns may use {quant} and {stem}; a GGUF entry names its default quant.
ALIASES: dict[str, dict[str, Any]] = {
    "qwen3.5-0.8b": {
        "format": "safetensors",
        "description": "Qwen3.5 0.8B, BF16 safetensors (megakernel decode)",
        "repos": [
            {"role": "target", "repo": "Qwen/Qwen3.5-0.8B", "files": _SAFETENSORS_FILES},
            {"role": "tokenizer", "repo": "Qwen/Qwen3.5-0.8B", "files": _TOKENIZER_FILES},
        ],
    },
    "qwen3.5-27b": _gguf_with_draft("3.5"),
    "qwen3.6-27b": _gguf_with_draft("3.6"),
}

_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TAG_RE = re.compile(r"^[\w.-]+$")


@dataclass(frozen=True)
class RepoFiles:
    """One hub repo at one revision, the files wanted from it, and what they are for."""

    repo_id: str
    revision: str
    allow_patterns: tuple[str, ...]
    role: str


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model name: hub repos to fetch, or a local path (then `repos` is empty)."""

    name: str
    format: str  # "gguf" | "safetensors"
    repos: tuple[RepoFiles, ...] = ()
    quant: str | None = None
    alias: str | None = None
    local_path: Path | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None

    def repo(self, role: str) -> RepoFiles | None:
        return next((r for r in self.repos if r.role == role), None)

    def with_revision(self, revision: str) -> ModelSpec:
        """Pin revisions: `REV` applies to the target repo, `ROLE=REV` to that role's repo."""
        role, sep, rev = revision.partition("=")
        if not sep:
            role, rev = "target", revision
        if not rev or self.repo(role) is None:
            roles = ", ".join(sorted({r.role for r in self.repos})) or "none (local path)"
            raise UsageError(
                f"cannot apply revision {revision!r} to {self.name}: it has no {role!r} repo",
                hint=f"use REV (target repo) or ROLE=REV with ROLE one of: {roles}",
            )
        target_repo = self.repo(role).repo_id  # type: ignore[union-attr]
        # Roles that share the target's repo (0.8B tokenizer files) must move with it to one commit.
        repos = tuple(replace(r, revision=rev) if r.repo_id == target_repo else r for r in self.repos)
        return replace(self, repos=repos)


def known_aliases() -> list[str]:
    return sorted(ALIASES)


def resolve(name: str) -> ModelSpec:
    """Turn what the user typed into a ModelSpec; raises ModelNotFound / UsageError with a hint."""
    text = name.strip()
    if not text:
        raise UsageError("empty model name", hint=_known_hint())
    local = _local_spec(text)
    if local is not None:
        return local
    base, _, tag = text.partition(":")
    alias = base.lower()
    if alias in ALIASES:
        return _alias_spec(alias, tag)
    if _REPO_RE.match(base):
        return _repo_spec(base, tag)
    raise ModelNotFound(
        f"unknown model {text!r}; known aliases: {', '.join(known_aliases())}",
        hint="use an alias, a hub repo as `org/repo[:QUANT]`, or a path to a model directory or .gguf file",
    )


def _known_hint() -> str:
    return f"known aliases: {', '.join(known_aliases())}; or `org/repo[:QUANT]`, or a local path"


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text.lower().endswith(".gguf") or text in (".", "..")


def _local_spec(text: str) -> ModelSpec | None:
    path = Path(text).expanduser()
    if not path.exists():
        if _looks_like_path(text):
            raise ModelNotFound(f"no such file or directory: {text}", hint="check the path, or pull a model by name")
        return None
    path = path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFound(
                f"{text} is a file but not a .gguf", hint="pass a .gguf file or a directory with config.json"
            )
        return ModelSpec(name=text, format="gguf", local_path=path, quant=None)
    fmt = "gguf" if any(path.glob("*.gguf")) and not (path / "config.json").exists() else "safetensors"
    return ModelSpec(name=text, format=fmt, local_path=path)


def _check_quant(tag: str, what: str) -> str:
    for allowed in QUANT_TAGS:
        if tag.upper() == allowed:
            return allowed
    raise UsageError(
        f"unknown quant tag {tag!r} for {what}; allowed: {', '.join(QUANT_TAGS)} (default {DEFAULT_QUANT})",
        hint=f"e.g. `{what}:{QUANT_TAGS[-2]}`",
    )


def _alias_spec(alias: str, tag: str) -> ModelSpec:
    entry = ALIASES[alias]
    fmt = entry["format"]
    if fmt == "gguf":
        quant = _check_quant(tag, alias) if tag else entry["default_quant"]
    elif tag:
        raise UsageError(
            f"{alias} is a {fmt} model and takes no quant tag (got {tag!r})",
            hint=f"use `{alias}`; GGUF aliases with quant tags: "
            + ", ".join(a for a in known_aliases() if ALIASES[a]["format"] == "gguf"),
        )
    else:
        quant = None
    fill = {"quant": quant or "", "stem": entry.get("stem", "")}
    repos = tuple(
        RepoFiles(
            repo_id=r["repo"],
            revision=DEFAULT_REVISION,
            allow_patterns=tuple(p.format(**fill) for p in r["files"]),
            role=r["role"],
        )
        for r in entry["repos"]
    )
    # The name echoes what was typed (tag only if given) so hints like `lucebox pull NAME` read naturally.
    name = f"{alias}:{quant}" if tag else alias
    return ModelSpec(name=name, format=fmt, repos=repos, quant=quant, alias=alias)


def _repo_spec(repo_id: str, tag: str) -> ModelSpec:
    if "--" in repo_id or ".." in repo_id or len(repo_id) > 96:
        # The hub's own repo-id rules; checked here so the error is ours, not a library traceback.
        raise UsageError(f"{repo_id!r} is not a valid hub repo id", hint="use `org/repo`: no '--' or '..', ≤ 96 chars")
    if tag and not _TAG_RE.match(tag):
        raise UsageError(f"bad quant tag {tag!r} in {repo_id}:{tag}", hint=f"allowed: {', '.join(QUANT_TAGS)}")
    if tag or repo_id.lower().endswith("-gguf"):
        quant = _check_quant(tag, repo_id) if tag else DEFAULT_QUANT
        patterns = tuple(p.format(quant=quant) for p in _GGUF_FILES_ANY_STEM)
        repos = (RepoFiles(repo_id, DEFAULT_REVISION, patterns, "target"),)
        return ModelSpec(name=f"{repo_id}:{quant}" if tag else repo_id, format="gguf", repos=repos, quant=quant)
    repos = (
        RepoFiles(repo_id, DEFAULT_REVISION, _SAFETENSORS_FILES, "target"),
        RepoFiles(repo_id, DEFAULT_REVISION, _TOKENIZER_FILES, "tokenizer"),
    )
    return ModelSpec(name=repo_id, format="safetensors", repos=repos)
