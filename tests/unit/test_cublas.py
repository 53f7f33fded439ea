"""cuBLAS at run time without a GPU: where engines/cublas.py looks, the knobs, and the C loader's clean
failures (cuda/core/cublas_rt.cu). The loaded library is process-wide state in the C library, so the
checks that must start from "nothing loaded" run in a child process."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lucebox_cli.engines import _lib, cublas
from lucebox_cli.errors import EngineUnavailable, UsageError

REPO = Path(__file__).resolve().parents[2]
PROFILES = ["rtx3090-sm86", "h200-sm90"]


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_off_means_no_candidates_and_not_loaded():
    assert cublas.candidate_paths({cublas.CUBLAS_ENV: "off"}) == []
    assert cublas.candidate_paths({cublas.CUBLAS_ENV: "OFF"}, search=["/nonexistent"]) == []
    # no library is asked anything: a stand-in without functions would raise if it were
    status = cublas.load(SimpleNamespace(), env={cublas.CUBLAS_ENV: "off"})
    assert not status.loaded and status.reason == f"{cublas.CUBLAS_ENV}=off" and status.tried == ()


def test_a_named_path_is_the_only_candidate():
    assert cublas.candidate_paths({cublas.CUBLAS_ENV: "/x/libcublas.so.12"}) == ["/x/libcublas.so.12"]


def test_wheel_folders_then_sonames(tmp_path: Path):
    site = tmp_path / "site-packages"
    c13 = _touch(site / "nvidia/cu13/lib/libcublas.so.13")
    _touch(site / "nvidia/cu13/lib/libcublasLt.so.13")  # Lt is not a candidate (the C side preloads it)
    c12 = _touch(site / "nvidia/cublas/lib/libcublas.so.12")
    _touch(site / "nvidia/cublas/lib/libcublas.so.12.4.5.8")
    _touch(site / "nvidia/cublas/lib/libcublasLt.so.12")
    _touch(site / "nvidia/cublas/lib/libnvblas.so.12")
    # the same folder twice on sys.path, a missing entry and an empty one: each library once, no error
    got = cublas.candidate_paths({}, search=[str(site), str(tmp_path / "missing"), "", str(site)])
    assert got[:3] == [str(c13), str(c12), str(c12) + ".4.5.8"]
    assert got[3:] == list(cublas.SONAMES)


def test_nothing_in_the_wheels_leaves_the_sonames(tmp_path: Path):
    assert cublas.candidate_paths({}, search=[str(tmp_path)]) == list(cublas.SONAMES)
    assert cublas.candidate_paths({}, search=[]) == list(cublas.SONAMES)


def test_gemm_mode_knob():
    assert cublas.gemm_mode({}) == "auto"
    assert cublas.gemm_mode({cublas.GEMM_ENV: " Own "}) == "own"
    assert cublas.gemm_mode({cublas.GEMM_ENV: "cublas"}) == "cublas"
    with pytest.raises(UsageError, match="not a prefill GEMM path") as info:
        cublas.gemm_mode({cublas.GEMM_ENV: "fast"})
    assert "auto, own or cublas" in info.value.hint


def _built_lib_path() -> Path:
    for profile in PROFILES:
        path = _lib.lib_path(profile)
        if path.exists():
            return path
    pytest.skip("no built liblucebox.so (make build PROFILE=…)")


# Runs in a child: a bogus path, then the library still answers; then the Python finder with nothing to find.
_CHILD = r"""
import ctypes, json, sys
from pathlib import Path
from lucebox_cli.engines import _lib, cublas
lib = _lib.open_lib(Path(sys.argv[1]))
out = {}
out["bogus"] = lib.fn.lb_cublas_load(b"/nonexistent/dir/libcublas.so.12")
out["bogus_msg"] = lib.last_error()
buf = ctypes.create_string_buffer(64)
ver = ctypes.c_int(-1)
out["loaded"] = lib.fn.lb_cublas_loaded(buf, 64, ctypes.byref(ver))
out["loaded_path"], out["version"] = buf.value.decode(), ver.value
out["null_args"] = lib.fn.lb_cublas_loaded(None, 0, None)
out["abi"] = lib.abi_version()
n = ctypes.c_int(7)
out["devices"] = [lib.fn.lb_device_count(ctypes.byref(n)), n.value]
p = ctypes.c_void_p(256)
out["gemm_bad_k"] = lib.fn.lb_gemm_bf16_cublas(p, p, p, 37, 1024, 1000, 8, None)
out["gemm_bad_align"] = lib.fn.lb_gemm_bf16_cublas(p, p, ctypes.c_void_p(260), 37, 1024, 1024, 8, None)
out["gemm_not_loaded"] = lib.fn.lb_gemm_bf16_cublas(p, p, p, 37, 1024, 1024, 8, None)
out["gemm_not_loaded_msg"] = lib.last_error()
st = cublas.load(lib, env={cublas.CUBLAS_ENV: "/nonexistent/libcublas.so.13"})
out["named"] = [st.loaded, list(st.tried), st.reason]
st = cublas.load(lib, env={}, search=[])
out["sonames"] = [st.loaded, list(st.tried), st.reason, st.path]
print(json.dumps(out))
"""


def test_loader_fails_cleanly_and_the_library_keeps_working():
    path = _built_lib_path()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bogus"] == _lib.LB_ERR_NOT_FOUND
    assert "cuBLAS not loaded" in out["bogus_msg"] and "/nonexistent/dir/libcublas.so.12" in out["bogus_msg"]
    assert out["loaded"] == 0 and out["loaded_path"] == "" and out["version"] == 0 and out["null_args"] == 0
    assert out["abi"] == _lib.ABI_VERSION
    assert out["devices"][0] in (_lib.LB_OK, _lib.LB_ERR_NO_DRIVER, _lib.LB_ERR_NO_DEVICE)
    # argument checks first, then "not loaded", before anything touches CUDA
    assert out["gemm_bad_k"] == _lib.LB_ERR_INVALID_ARG and out["gemm_bad_align"] == _lib.LB_ERR_INVALID_ARG
    assert out["gemm_not_loaded"] == _lib.LB_ERR_NOT_FOUND and "not loaded" in out["gemm_not_loaded_msg"]
    loaded, tried, reason = out["named"]
    assert not loaded and tried == ["/nonexistent/libcublas.so.13"] and "/nonexistent/libcublas.so.13" in reason
    loaded, tried, reason, lib_path = out["sonames"]
    assert tried[: len(tried)] == list(cublas.SONAMES)[: len(tried)]
    # a machine with a system cuBLAS loads it; one without says why, naming every soname it tried
    assert (loaded and lib_path) or (not loaded and all(s in reason for s in cublas.SONAMES))


def test_prefill_create_ex_rejects_bad_arguments_without_a_gpu():
    lib = _lib.open_lib(_built_lib_path())
    handle = ctypes.c_void_p()
    assert lib.fn.lb_mk_prefill_create_ex(None, 0, 0, ctypes.byref(handle)) == _lib.LB_ERR_INVALID_ARG
    assert lib.fn.lb_mk_prefill_create_ex(ctypes.c_void_p(16), 0, 3, ctypes.byref(handle)) == _lib.LB_ERR_INVALID_ARG
    assert "unknown GEMM path" in lib.last_error()
    assert lib.fn.lb_mk_prefill_gemm(None) == -1


def test_prefill_asked_for_cublas_without_one_is_engine_unavailable(monkeypatch):
    """LUCEBOX_PREFILL_GEMM=cublas with LUCEBOX_CUBLAS=off fails before any context is made."""
    from lucebox_cli.engines.prefill_tc import TensorCorePrefill

    monkeypatch.setenv(cublas.CUBLAS_ENV, "off")
    engine = SimpleNamespace(lib=SimpleNamespace(), cfg=SimpleNamespace(vocab=16), _handle=None)
    with pytest.raises(EngineUnavailable, match="no cuBLAS loaded") as info:
        TensorCorePrefill(engine, gemm="cublas")
    assert cublas.CUBLAS_ENV in info.value.hint
    monkeypatch.setenv(cublas.GEMM_ENV, "cublas")
    with pytest.raises(EngineUnavailable):
        TensorCorePrefill(engine)
    with pytest.raises(UsageError):
        TensorCorePrefill(engine, gemm="fastest")


# A stand-in libcublas (and the libcublasLt it needs, as the real one does): enough symbols for the loader.
_FAKE_LT = "int cublasLtFake(void) { return 0; }\n"
_FAKE = r"""
extern int cublasLtFake(void);
static int handle_;
int cublasCreate_v2(void** h) { *h = &handle_; return cublasLtFake(); }
int cublasDestroy_v2(void* h) { return 0; }
int cublasSetStream_v2(void* h, void* s) { return 0; }
int cublasSetMathMode(void* h, int m) { return 0; }
int cublasGemmEx(void) { return 0; }
int cublasGetProperty(int type, int* v) { *v = type == 0 ? 12 : type == 1 ? 3 : 4; return 0; }
"""

_CHILD_FAKE = r"""
import ctypes, json, sys
from pathlib import Path
from lucebox_cli.engines import _lib, cublas
lib = _lib.open_lib(Path(sys.argv[1]))
st = cublas.load(lib, env={}, search=[sys.argv[2]])
again = cublas.load(lib, env={cublas.CUBLAS_ENV: "/nonexistent/libcublas.so.12"})  # the first one stays
off = cublas.load(lib, env={cublas.CUBLAS_ENV: "off"})
p = ctypes.c_void_p(256)
gemm = lib.fn.lb_gemm_bf16_cublas(p, p, p, 37, 1024, 1024, 8, None)  # no GPU here: a clean CUDA status
print(json.dumps([st.loaded, st.path, st.version, list(st.tried), again.path, off.loaded, gemm, lib.last_error()]))
"""


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v cc"], capture_output=True).returncode != 0,
                    reason="no C compiler")
def test_loader_loads_a_wheel_folder_library(tmp_path: Path):
    """A fake libcublas.so.12 in nvidia/cublas/lib of a sys.path entry, its libcublasLt.so.12 beside it
    (not on the loader's path: the C side opens it first by full path): found, loaded, version read."""
    path = _built_lib_path()
    folder = tmp_path / "site" / "nvidia" / "cublas" / "lib"
    folder.mkdir(parents=True)
    (tmp_path / "lt.c").write_text(_FAKE_LT)
    (tmp_path / "blas.c").write_text(_FAKE)
    lt, blas = folder / "libcublasLt.so.12", folder / "libcublas.so.12"
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "lt.c"), "-o", str(lt), "-Wl,-soname,libcublasLt.so.12"],
                   check=True)
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "blas.c"), "-o", str(blas), str(lt)], check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("LD_LIBRARY_PATH", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD_FAKE, str(path), str(tmp_path / "site")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded, got_path, version, tried, again, off, gemm, err = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded and Path(got_path).resolve() == blas.resolve() and version == "12.3.4" and tried == [str(blas)]
    assert Path(again).resolve() == blas.resolve() and off is False
    assert gemm in (_lib.LB_OK, _lib.LB_ERR_NO_DRIVER, _lib.LB_ERR_NO_DEVICE, _lib.LB_ERR_CUDA), err
    print("lb_gemm_bf16_cublas on the stand-in:", gemm, err)
