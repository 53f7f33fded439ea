"""engines/_lib.py against cuda/include/lucebox.h and the built library (no GPU needed).

The header test parses every `LB_API` prototype, so functions other sections add are checked too:
each must have a row in _lib.DECLS with the same argument count and compatible ctypes.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lucebox_cli.config import get_profile
from lucebox_cli.engines import _lib
from lucebox_cli.errors import EngineUnavailable, ProfileMismatch

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "cuda" / "include" / "lucebox.h"
PROFILE = "rtx3090-sm86"

_SCALARS = {
    "int": ctypes.c_int, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "float": ctypes.c_float, "double": ctypes.c_double,
    "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16, "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8,
    "unsigned": ctypes.c_uint, "char": ctypes.c_char,
}


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def header_prototypes() -> dict[str, tuple[str, list[str]]]:
    """name → (return type, [parameter declarations]) for every LB_API function in lucebox.h."""
    text = _strip_comments(HEADER.read_text())
    protos = {}
    for m in re.finditer(r"\bLB_API\s+([^;{()]+?)\s*\b(lb_\w+)\s*\(([^)]*)\)\s*;", text):
        ret, name, params = " ".join(m.group(1).split()), m.group(2), " ".join(m.group(3).split())
        plist = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
        assert name not in protos, f"{name} declared twice in lucebox.h"
        protos[name] = (ret, plist)
    return protos


def header_structs() -> set[str]:
    text = _strip_comments(HEADER.read_text())
    return set(re.findall(r"typedef\s+struct\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text, flags=re.S))


def _parse_type(decl: str) -> tuple[str, int]:
    """'const lb_x_t* out' → ('lb_x_t', 1); the parameter name (if any) is dropped."""
    stars = decl.count("*")
    words = [w for w in re.findall(r"\w+", decl) if w not in ("const", "volatile", "struct")]
    if stars == 0 and len(words) > 1:
        words = words[:-1]  # the parameter name
    elif stars and len(words) > 1 and re.search(r"\*\s*\w+\s*$", decl):
        words = words[:-1]
    return " ".join(words), stars


def _compatible(c_decl: str, ctype, structs: set[str]) -> bool:
    base, stars = _parse_type(c_decl)
    if stars == 0:
        if base == "void":
            return ctype is None
        return base in _SCALARS and ctype is _SCALARS[base]
    if ctype is ctypes.c_void_p:
        return True  # device pointers, streams, opaque handles, raw host buffers
    if stars == 1 and base == "char":
        return ctype is ctypes.c_char_p
    if not (isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer)):
        return False
    target = ctype._type_
    if stars == 1 and base in _SCALARS:
        return target is _SCALARS[base]
    if stars == 1 and base in structs:
        return getattr(target, "c_name", None) == base
    return stars > 1  # T**: any pointer-to-pointer row


def test_header_and_table_agree():
    protos = header_prototypes()
    structs = header_structs()
    assert {"lb_abi_version", "lb_build_info", "lb_last_error", "lb_device_count", "lb_device_props"} <= set(protos)
    missing = sorted(set(protos) - set(_lib.DECLS))
    stale = sorted(set(_lib.DECLS) - set(protos))
    assert not missing, f"in lucebox.h but not in _lib.DECLS: {missing}"
    assert not stale, f"in _lib.DECLS but not in lucebox.h: {stale}"
    for name, (ret, params) in protos.items():
        restype, argtypes = _lib.DECLS[name]
        assert len(argtypes) == len(params), f"{name}: header has {len(params)} args, table {len(argtypes)}"
        assert _compatible(ret + " r", restype, structs), f"{name}: return {ret!r} vs {restype}"
        for i, (decl, ctype) in enumerate(zip(params, argtypes)):
            assert _compatible(decl, ctype, structs), f"{name} arg {i}: {decl!r} vs {ctype}"


def test_abi_version_constant_matches_header():
    m = re.search(r"#define\s+LB_ABI_VERSION\s+(\d+)", HEADER.read_text())
    assert m and int(m.group(1)) == _lib.ABI_VERSION


def test_status_codes_match_header():
    text = HEADER.read_text()
    for code, name in _lib.STATUS_NAMES.items():
        m = re.search(rf"\b{name}\s*=\s*(\d+)", text)
        assert m and int(m.group(1)) == code, name


def _structures():
    return [v for v in vars(_lib).values() if isinstance(v, type) and issubclass(v, ctypes.Structure) and hasattr(v, "c_name")]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_struct_layouts_match_c(tmp_path: Path):
    """sizeof and every offsetof of each mirrored struct, as the C compiler lays them out."""
    structs = _structures()
    assert {s.c_name for s in structs} >= {"lb_device_props_t"}
    assert {s.c_name for s in structs} >= header_structs(), "every struct in lucebox.h needs a ctypes mirror"
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{HEADER}"', "int main(void) {"]
    for s in structs:
        lines.append(f'printf("{s.c_name} size %zu\\n", sizeof({s.c_name}));')
        for fname, *_ in s._fields_:
            lines.append(f'printf("{s.c_name} {fname} %zu\\n", offsetof({s.c_name}, {fname}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    subprocess.run(["cc", "-std=c11", str(src), "-o", str(tmp_path / "layout")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout.split("\n")
    expected = []
    for s in structs:
        expected.append(f"{s.c_name} size {ctypes.sizeof(s)}")
        expected += [f"{s.c_name} {f} {getattr(s, f).offset}" for f, *_ in s._fields_]
    assert [line for line in out if line] == expected


@pytest.fixture(scope="session")
def built_lib() -> Path:
    """build/<PROFILE>/liblucebox.so, made (incrementally) by `make build` once per session."""
    path = _lib.lib_path(PROFILE)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        if not path.exists():
            pytest.skip("nvcc not found and the library is not built")
        return path
    env = dict(os.environ, PY=sys.executable)
    proc = subprocess.run(["make", "--no-print-directory", "build", f"PROFILE={PROFILE}", f"BUILD_DIR={path.parent.parent}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return path


def test_load_checks_abi_and_arch(built_lib: Path):
    lib = _lib.load(PROFILE)
    assert lib.abi_version() == _lib.ABI_VERSION
    info = lib.build_info()
    assert info["abi"] == _lib.ABI_VERSION and "sm_86" in info["archs"] and info["arch_flag"] == "sm_86"
    assert re.match(r"^\d+\.\d+\.\d+$", info["nvcc"]) and info["commit"]
    assert json.loads(lib.cdll.lb_build_info().decode()) == info
    assert lib.last_error() == "" or isinstance(lib.last_error(), str)


def test_load_refuses_wrong_arch(built_lib: Path, tmp_path: Path):
    # The sm_86 library under the h200 profile's name: compiled arch != profile arch.
    (tmp_path / "h200-sm90").mkdir()
    shutil.copy(built_lib, tmp_path / "h200-sm90" / _lib.LIB_NAME)
    with pytest.raises(ProfileMismatch) as info:
        _lib.load(get_profile("h200-sm90"), build_dir=tmp_path)
    assert "sm_86" in info.value.message and info.value.hint == "make build PROFILE=h200-sm90"


def test_load_refuses_wrong_abi(built_lib: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(_lib, "ABI_VERSION", _lib.ABI_VERSION + 1)
    with pytest.raises(ProfileMismatch, match="C ABI"):
        _lib.load(PROFILE)


def test_not_built_is_engine_unavailable(tmp_path: Path):
    with pytest.raises(EngineUnavailable) as info:
        _lib.load(PROFILE, build_dir=tmp_path)
    assert f"make build PROFILE={PROFILE}" in info.value.hint


def test_gpu_count_never_raises(built_lib: Path, tmp_path: Path, monkeypatch):
    probe = _lib.probe_gpus()
    assert _lib.gpu_count() == len(probe.gpus)
    if probe.gpus:
        assert probe.reason is None and all(g["sm_count"] > 0 and g["cc_major"] >= 7 for g in probe.gpus)
    else:
        assert probe.reason
    # Without any built library: the libcuda fallback (or none) still answers.
    monkeypatch.setenv(_lib.BUILD_DIR_ENV, str(tmp_path))
    assert _lib.gpu_count() == len(probe.gpus)
    monkeypatch.setenv(_lib.FORCE_NO_GPU_ENV, "1")
    assert _lib.gpu_count() == 0 and _lib.gpu_info() == []


def test_device_count_without_usable_gpu(built_lib: Path):
    """With no GPU visible (no driver here, or CUDA_VISIBLE_DEVICES='' on a GPU machine) the C call
    reports a clean status and zero devices. Run in a child: the CUDA runtime caches its first answer."""
    code = (
        "import ctypes, json, sys\n"
        "from lucebox_cli.engines import _lib\n"
        f"lib = _lib.load({PROFILE!r})\n"
        "n = ctypes.c_int(7)\n"
        "st = lib.cdll.lb_device_count(ctypes.byref(n))\n"
        "props = _lib.DeviceProps()\n"
        "st2 = lib.cdll.lb_device_props(0, ctypes.byref(props))\n"
        "print(json.dumps([st, n.value, st2, lib.last_error(), _lib.probe_gpus().reason]))\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status, count, status2, err, reason = json.loads(out.stdout)
    assert status in (_lib.LB_ERR_NO_DRIVER, _lib.LB_ERR_NO_DEVICE) and count == 0
    assert status2 in (_lib.LB_ERR_NO_DRIVER, _lib.LB_ERR_NO_DEVICE) and err
    assert reason


def test_check_maps_status_to_errors(built_lib: Path):
    lib = _lib.load(PROFILE)
    with pytest.raises(Exception) as info:
        lib.call("lb_device_count", None)  # NULL pointer → LB_ERR_INVALID_ARG
    assert "count is NULL" in str(info.value)


@pytest.mark.gpu
def test_device_props_on_gpu():
    from lucebox_cli.config import resolve_profile

    gpus = _lib.gpu_info()
    assert gpus and gpus[0]["total_mem_bytes"] > 0 and gpus[0]["smem_per_block_optin"] > 0
    profile = resolve_profile(None, gpus)
    if profile is not None:
        assert (gpus[0]["cc_major"], gpus[0]["cc_minor"]) == profile.hardware.compute_capability
        assert gpus[0]["sm_count"] == profile.hardware.sm_count
        assert gpus[0]["smem_per_block_optin"] == profile.hardware.smem_per_block_optin
        assert gpus[0]["l2_bytes"] == profile.hardware.l2_bytes
