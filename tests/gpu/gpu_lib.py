"""What every GPU test file shares: `pytest` (the real one, or a stand-in when a file runs as a plain script
on a machine without pytest) and `lib()`, the built library for this machine's GPU (skips without one).
`tests/gpu` is on sys.path under pytest and in script mode."""

from __future__ import annotations

import functools

try:
    import pytest
except ImportError:  # script mode without pytest: decorators become no-ops, a skip is an error

    class _Shim:
        def __getattr__(self, _name):
            return lambda *a, **k: (lambda f: f)

        @staticmethod
        def skip(reason: str):
            raise RuntimeError(reason)

    pytest = _Shim()
    pytest.mark = _Shim()


@functools.lru_cache(maxsize=1)
def lib():
    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    probe = _lib.probe_gpus()
    if not probe.gpus:
        pytest.skip(f"no GPU: {probe.reason}")
    return _lib.load(resolve_profile(None, probe.gpus))
