"""Run configuration (and, below, hardware profiles).

RunConfig is resolved once — CLI > LUCEBOX_* environment > profile run defaults > built-in defaults —
then frozen; `-v` prints it and bench JSON embeds it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, get_type_hints

import yaml

from lucebox_cli.errors import LuceboxError, ProfileError, ProfileMismatch, UsageError


@dataclass(frozen=True)
class RunConfig:
    model: str
    engine: str = "auto"  # auto | cpu | cuda
    profile: Optional[str] = None  # None: matched from the GPU
    max_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    chat: bool = False
    thinking: bool = False
    stop_at_eos: bool = True
    draft: Optional[str] = None  # alias | folder | .gguf | replay[:RATE]
    spec: str = "none"  # none | chain | ddtree
    budget: int = 22  # DDTree node budget (excluding the root)
    max_context: int = 4096
    # what the 27B GGUF engine's cuBLAS prefill passes read: q (dequantize per pass) | f16 (resident fp16 copies,
    # 2 B a weight more device memory); None: the engine's LUCEBOX_PREFILL_WEIGHTS, else q. Other engines ignore it.
    prefill_weights: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------
# Hardware profiles: profiles/*.yaml, validated on load (schema below, documented in profiles/README.md)
# ---------------------------------------------------------------------------------------------------

PROFILES_ENV = "LUCEBOX_PROFILES_DIR"
PROFILE_ENV = "LUCEBOX_PROFILE"
_MISSING = object()


@dataclass(frozen=True)
class _Field:
    """One key of the profile schema: dotted path, kind, and the allowed range."""

    path: str
    kind: str  # str | int | num | str_list | cc
    required: bool = True
    nullable: bool = False
    lo: Optional[float] = None
    hi: Optional[float] = None
    choices: Optional[tuple[str, ...]] = None


_SCHEMA: tuple[_Field, ...] = (
    _Field("name", "str"),
    _Field("description", "str", required=False),
    _Field("hardware.gpu_names", "str_list"),
    _Field("hardware.compute_capability", "cc"),
    _Field("hardware.sm_count", "int", lo=1, hi=1024),
    _Field("hardware.memory_gb", "num", lo=1, hi=4096),
    _Field("hardware.bandwidth_gbps", "num", lo=10, hi=100_000),
    _Field("hardware.bandwidth_measured_gbps", "num", required=False, nullable=True, lo=10, hi=100_000),
    _Field("hardware.copy_bandwidth_measured_gbps", "num", required=False, nullable=True, lo=10, hi=100_000),
    _Field("hardware.smem_per_block_optin", "int", lo=16 * 1024, hi=1 << 20),
    _Field("hardware.smem_per_sm", "int", required=False, lo=16 * 1024, hi=1 << 20),
    _Field("hardware.max_threads_per_sm", "int", required=False, lo=32, hi=4096),
    _Field("hardware.l2_bytes", "int", lo=1 << 18, hi=1 << 30),
    _Field("hardware.bf16_tflops", "num", lo=1, hi=100_000),
    _Field("hardware.bf16_tflops_measured", "num", required=False, nullable=True, lo=1, hi=100_000),
    _Field("build.arch", "str"),
    _Field("build.gencode", "str"),
    _Field("build.megakernel.threads", "int", lo=32, hi=1024),
    _Field("build.megakernel.blocks_per_sm", "int", lo=1, hi=32),
    # the per-warp weight ring (absent: the largest that fits the card's shared memory); the C side checks
    # that the slot size is 1024, 2048 or 4096 and that the ring fits
    _Field("build.megakernel.ring_slots", "int", required=False, lo=2, hi=8),
    _Field("build.megakernel.ring_slot_bytes", "int", required=False, lo=1024, hi=4096),
    # when the ring's refills are issued (lb_mk_config_t.ring_hold: 0 as slots free up, 1 refills for later phases
    # held to the next GEMV phase's start); absent: 0
    _Field("build.megakernel.ring_hold", "int", required=False, lo=0, hi=1),
    _Field("run.budget", "int", lo=1, hi=1024),
    _Field("run.kv_cache_type", "str", choices=("f16", "bf16", "q8_0", "q4_0")),
    _Field("run.max_context", "int", lo=256, hi=1 << 22),
    # rows of one 27B prefill pass (a multiple of 64; more rows: fewer, longer launches, more activation memory)
    _Field("run.prefill_rows", "int", required=False, lo=64, hi=1024),
    # rows of one 27B prefill pass when its wide GEMMs run through cuBLAS (absent: run.prefill_rows); each pass
    # dequantizes the weights to fp16 once, so longer passes pay that less often
    _Field("run.prefill_rows_cublas", "int", required=False, lo=64, hi=1024),
)
# Sections whose keys are all listed above (a typo there is an error). `build` also takes extra
# sub-sections of tuning values for other kernels (numbers, strings, or lists of them).
_CLOSED_SECTIONS = ("", "hardware", "run", "build.megakernel")
_ARCH_RE = re.compile(r"^sm_(\d)(\d+)([a-z]?)$")


@dataclass(frozen=True)
class Hardware:
    gpu_names: tuple[str, ...]
    compute_capability: tuple[int, int]
    sm_count: int
    memory_gb: float
    bandwidth_gbps: float
    bandwidth_measured_gbps: Optional[float]
    copy_bandwidth_measured_gbps: Optional[float]
    smem_per_block_optin: int
    smem_per_sm: Optional[int]
    max_threads_per_sm: Optional[int]
    l2_bytes: int
    bf16_tflops: float
    bf16_tflops_measured: Optional[float]


@dataclass(frozen=True)
class RunDefaults:
    budget: int
    kv_cache_type: str
    max_context: int
    prefill_rows: int = 64  # the default of run.prefill_rows (engines/memory_plan.py takes it from here)
    prefill_rows_cublas: Optional[int] = None  # run.prefill_rows_cublas; None: prefill_rows


@dataclass(frozen=True)
class Profile:
    """A validated hardware profile. Typed views for the common keys; `get("a.b.c")` for the rest."""

    name: str
    description: str
    path: Path
    hardware: Hardware
    arch: str  # nvcc arch, e.g. "sm_86"
    gencode: str
    run: RunDefaults
    data: Mapping[str, Any] = field(repr=False, compare=False)  # the whole document, read-only

    @property
    def arch_number(self) -> int:
        """86 for sm_86, 90 for sm_90a: what `lb_build_info()`'s arch list is compared against."""
        return arch_number(self.arch)

    def get(self, dotted: str, default: Any = _MISSING) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                if default is _MISSING:
                    raise ProfileError(f"profile {self.name} has no key {dotted}", hint=f"see {self.path}")
                return default
            node = node[part]
        return node

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able view: name, arch and the rest of the document."""
        return {"name": self.name, "arch": self.arch, "path": str(self.path), **_thaw(self.data)}


def arch_number(arch: str) -> int:
    m = _ARCH_RE.match(arch)
    if not m:
        raise ProfileError(f"not an nvcc arch: {arch!r}", hint="expected sm_XY, e.g. sm_86 or sm_90a")
    return int(m.group(1) + m.group(2))


def arch_runs_on(arch: str, cc: tuple[int, int]) -> bool:
    """SASS for sm_XY runs on compute capability X.Z with Z >= Y (same major); we never rely on PTX JIT."""
    m = _ARCH_RE.match(arch)
    if not m:
        return False
    major, minor = int(m.group(1)), int(m.group(2))
    return cc[0] == major and cc[1] >= minor


def repo_root() -> Optional[Path]:
    """The source checkout holding this package (editable install), found by walking up; None otherwise."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "profiles").is_dir():
            return parent
    return None


def profiles_dir(directory: Optional[os.PathLike | str] = None) -> Path:
    """Explicit argument > $LUCEBOX_PROFILES_DIR > the checkout's profiles/."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get(PROFILES_ENV)
    if env:
        return Path(env)
    root = repo_root()
    if root is None:
        raise ProfileError(
            "cannot find the profiles/ folder (lucebox is not installed from a source checkout)",
            hint=f"set {PROFILES_ENV} to a folder of profile .yaml files",
        )
    return root / "profiles"


def load_profile_file(path: Path) -> Profile:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ProfileError(f"{path}: cannot read profile: {_one_line(err)}", hint="fix the YAML syntax") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{path}: a profile must be a YAML mapping", hint="see profiles/README.md")
    _validate(path, doc)
    if doc["name"] != path.stem:
        raise ProfileError(f"{path}: key name: {doc['name']!r} differs from the file name", hint=f"use name: {path.stem}")
    hw, run, build = doc["hardware"], doc["run"], doc["build"]
    hardware = Hardware(
        gpu_names=tuple(hw["gpu_names"]),
        compute_capability=(hw["compute_capability"][0], hw["compute_capability"][1]),
        **{f.name: hw.get(f.name) for f in dataclasses.fields(Hardware) if f.name not in ("gpu_names", "compute_capability")},
    )
    return Profile(
        name=doc["name"],
        description=doc.get("description", ""),
        path=path,
        hardware=hardware,
        arch=build["arch"],
        gencode=build["gencode"],
        run=RunDefaults(budget=run["budget"], kv_cache_type=run["kv_cache_type"], max_context=run["max_context"],
                        prefill_rows=run.get("prefill_rows", RunDefaults.prefill_rows),
                        prefill_rows_cublas=run.get("prefill_rows_cublas")),
        data=_freeze(doc),
    )


def load_profiles(directory: Optional[os.PathLike | str] = None) -> dict[str, Profile]:
    """Every profiles/*.yaml, validated, by name (sorted). A broken file is an error, not skipped."""
    folder = profiles_dir(directory)
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise ProfileError(f"no profiles found in {folder}", hint=f"set {PROFILES_ENV} or restore profiles/*.yaml")
    return {p.name: p for p in map(load_profile_file, files)}


def get_profile(name: str, directory: Optional[os.PathLike | str] = None) -> Profile:
    profiles = load_profiles(directory)
    if name not in profiles:
        raise ProfileError(f"unknown profile {name!r}", hint=f"known profiles: {', '.join(profiles)}")
    return profiles[name]


def _gpu_cc(gpu: Mapping[str, Any]) -> tuple[int, int]:
    if "cc_major" in gpu:
        return int(gpu["cc_major"]), int(gpu["cc_minor"])
    cc = gpu["compute_capability"]
    if isinstance(cc, str):
        major, minor = cc.split(".")
        return int(major), int(minor)
    return int(cc[0]), int(cc[1])


def _match_score(profile: Profile, gpu: Mapping[str, Any]) -> int:
    """0 = no match. Compute capability must be equal; then a name pattern counts 2, the SM count 1."""
    if _gpu_cc(gpu) != profile.hardware.compute_capability:
        return 0
    name = str(gpu.get("name", ""))
    score = 2 if any(re.search(p, name, re.IGNORECASE) for p in profile.hardware.gpu_names) else 0
    if gpu.get("sm_count") == profile.hardware.sm_count:
        score += 1
    return score


def match_profile(gpu_info: Mapping[str, Any], profiles: Optional[Mapping[str, Profile]] = None) -> Optional[Profile]:
    """Best profile for one GPU (dict with name, cc_major/cc_minor or compute_capability, sm_count)."""
    profiles = load_profiles() if profiles is None else profiles
    # Highest score wins; ties go to the first name in sorted order, so the result is deterministic.
    scored = sorted((-_match_score(p, gpu_info), p.name) for p in profiles.values())
    if not scored or scored[0][0] == 0:
        return None
    return profiles[scored[0][1]]


def _describe_gpu(gpu: Mapping[str, Any]) -> str:
    major, minor = _gpu_cc(gpu)
    return f"{gpu.get('name', '?')}, sm_{major}{minor}, {gpu.get('sm_count', '?')} SMs"


def resolve_profile(
    name_or_none: Optional[str],
    gpus: Sequence[Mapping[str, Any]],
    directory: Optional[os.PathLike | str] = None,
) -> Optional[Profile]:
    """--profile > $LUCEBOX_PROFILE > matched from GPU 0. None when nothing is named and there is no GPU.

    A named profile whose arch cannot run on GPU 0 is a ProfileMismatch; an unmatched GPU a ProfileError.
    """
    profiles = load_profiles(directory)
    name = name_or_none or os.environ.get(PROFILE_ENV) or None
    if name:
        if name not in profiles:
            raise ProfileError(f"unknown profile {name!r}", hint=f"known profiles: {', '.join(profiles)}")
        chosen = profiles[name]
        if gpus and not arch_runs_on(chosen.arch, _gpu_cc(gpus[0])):
            better = match_profile(gpus[0], profiles)
            hint = f"use --profile {better.name}" if better else "add a profile for this card (profiles/README.md)"
            raise ProfileMismatch(
                f"profile {name} is for {chosen.arch} but GPU 0 is {_describe_gpu(gpus[0])}", hint=hint
            )
        return chosen
    if not gpus:
        return None
    matched = match_profile(gpus[0], profiles)
    if matched is None:
        raise ProfileError(
            f"no profile matches GPU 0 ({_describe_gpu(gpus[0])})",
            hint=f"pass --profile NAME (known: {', '.join(profiles)}) or add profiles/<card>.yaml",
        )
    return matched


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _lookup(doc: Mapping[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _check_value(f: _Field, value: Any) -> Optional[str]:
    """None if `value` fits the field, else what is wrong with it."""
    if value is None:
        return None if f.nullable else "must not be empty"
    if f.kind == "str":
        if not isinstance(value, str) or not value:
            return "must be a non-empty string"
        if f.choices and value not in f.choices:
            return f"must be one of {', '.join(f.choices)}"
        return None
    if f.kind == "str_list":
        ok = isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)
        return None if ok else "must be a non-empty list of strings"
    if f.kind == "cc":
        ok = isinstance(value, list) and len(value) == 2 and all(type(v) is int and 0 <= v < 100 for v in value)
        return None if ok else "must be [major, minor], e.g. [8, 6]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (f.kind == "int" and not isinstance(value, int)):
        return "must be an integer" if f.kind == "int" else "must be a number"
    if (f.lo is not None and value < f.lo) or (f.hi is not None and value > f.hi):
        return f"must be between {f.lo:g} and {f.hi:g}"
    return None


def _validate(path: Path, doc: Mapping[str, Any]) -> None:
    def fail(key: str, problem: str) -> None:
        raise ProfileError(f"{path}: key {key}: {problem}", hint="see profiles/README.md for the schema")

    known = {f.path for f in _SCHEMA}
    for section in _CLOSED_SECTIONS:
        node = doc if not section else _lookup(doc, section)
        if isinstance(node, Mapping):
            for key in node:
                full = f"{section}.{key}" if section else str(key)
                if full not in known and not any(k.startswith(full + ".") for k in known):
                    fail(full, "unknown key")
    for f in _SCHEMA:
        value = _lookup(doc, f.path)
        if value is _MISSING:
            if f.required:
                fail(f.path, "missing")
            continue
        problem = _check_value(f, value)
        if problem:
            fail(f.path, problem)
    for key, value in doc["build"].items():
        if key not in ("arch", "gencode", "megakernel") and not _is_tuning(value):
            fail(f"build.{key}", "tuning values must be numbers, strings, lists or sections of them")
    m = _ARCH_RE.match(doc["build"]["arch"])
    if not m:
        fail("build.arch", "must look like sm_86 or sm_90a")
    cc = doc["hardware"]["compute_capability"]
    if (int(m.group(1)), int(m.group(2))) != (cc[0], cc[1]):
        fail("build.arch", f"{doc['build']['arch']} does not match compute_capability {cc[0]}.{cc[1]}")
    if f"compute_{m.group(1)}{m.group(2)}" not in doc["build"]["gencode"]:
        fail("build.gencode", f"does not name compute_{m.group(1)}{m.group(2)}")
    for key in ("prefill_rows", "prefill_rows_cublas"):
        rows = doc["run"].get(key, RunDefaults.prefill_rows)
        if rows % 64:
            fail(f"run.{key}", f"{rows} is not a multiple of 64 (the quantized GEMMs take 64 columns at a time)")
    for pattern in doc["hardware"]["gpu_names"]:
        try:
            re.compile(pattern)
        except re.error as err:
            fail("hardware.gpu_names", f"bad regex {pattern!r}: {err}")


def _is_tuning(value: Any) -> bool:
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_tuning(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_tuning(v) and not isinstance(v, (Mapping, list)) for v in value)
    return isinstance(value, (int, float, str, bool))


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------
# RunConfig resolution: CLI > LUCEBOX_* environment > profile run defaults > RunConfig defaults
# ---------------------------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_env(var: str, text: str, hint_type: Any) -> Any:
    kind = str(hint_type)
    try:
        if "bool" in kind:
            low = text.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ValueError(text)
            return low in _TRUE
        if "int" in kind:
            return int(text)
        if "float" in kind:
            return float(text)
    except ValueError:
        raise UsageError(f"{var}={text!r} is not a valid {kind.replace('typing.', '')}", hint=f"unset {var} or fix it") from None
    return text


def resolve_run_config(
    cli_values: Mapping[str, Any], profile: Optional[Profile], env: Optional[Mapping[str, str]] = None
) -> RunConfig:
    """Frozen RunConfig from CLI values (None = not given) > LUCEBOX_<FIELD> env > profile run defaults > defaults.

    Profile run keys that are RunConfig fields (budget, max_context) apply; the others (kv_cache_type)
    stay on the profile for the engine to read.
    """
    env = os.environ if env is None else env
    hints = get_type_hints(RunConfig)
    unknown = set(cli_values) - set(hints)
    if unknown:
        raise ValueError(f"not RunConfig fields: {sorted(unknown)}")
    values: dict[str, Any] = {}
    if profile is not None:
        values["profile"] = profile.name
        run = _thaw(profile.data.get("run", {}))
        values.update({k: v for k, v in run.items() if k in hints})
    for name, hint_type in hints.items():
        var = f"LUCEBOX_{name.upper()}"
        if env.get(var, "") != "":
            values[name] = _parse_env(var, env[var], hint_type)
    values.update({k: v for k, v in cli_values.items() if v is not None})
    if "model" not in values:
        raise UsageError("no model given", hint="name one, e.g. `lucebox run qwen3.5-0.8b`")
    return RunConfig(**values)


# ---------------------------------------------------------------------------------------------------
# `python -m lucebox_cli.config …`: what the Makefile asks (arch of a profile, the known names)
# ---------------------------------------------------------------------------------------------------

_USAGE = """usage: python -m lucebox_cli.config COMMAND
  names            known profile names, one a line
  arch NAME        the nvcc arch of profile NAME (e.g. sm_86)
  resolve [NAME]   NAME if known, else the profile matched from GPU 0
  get NAME KEY     a value by dotted key (e.g. build.megakernel.threads)"""


def _cli_resolve(name: str) -> str:
    if name:
        return get_profile(name).name
    from lucebox_cli.engines import _lib  # only here: config must not depend on engines at import

    probe = _lib.probe_gpus()
    profile = resolve_profile(None, probe.gpus)
    if profile is None:
        raise ProfileError(
            f"no PROFILE given and no GPU to match ({probe.reason})",
            hint=f"pass PROFILE=NAME; known profiles: {', '.join(load_profiles())}",
        )
    return profile.name


def main(argv: Sequence[str]) -> int:
    cmd, args = (argv[0], list(argv[1:])) if argv else ("", [])
    try:
        if cmd == "names" and not args:
            print("\n".join(load_profiles()))
        elif cmd == "arch" and len(args) == 1:
            print(get_profile(args[0]).arch)
        elif cmd == "resolve" and len(args) <= 1:
            print(_cli_resolve(args[0] if args else ""))
        elif cmd == "get" and len(args) == 2:
            value = get_profile(args[0]).get(args[1])
            print(" ".join(map(str, value)) if isinstance(value, tuple) else value)
        else:
            print(_USAGE, file=sys.stderr)
            return 2
    except LuceboxError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
