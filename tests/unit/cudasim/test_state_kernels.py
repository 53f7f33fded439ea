"""State kernels (numba.cuda) against their numpy twins, under the CUDA simulator, on random inputs.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, and it must not leak into other
test modules of the same pytest process (GPU tests there want the real driver). So, in an ordinary
pytest process this module holds one test that re-runs this very file in a subprocess with the simulator
switched on; inside that subprocess the real, parametrized tests run. The twins are also checked against
the definition (sequential one-token bookkeeping), so kernel == twin == definition.

On a machine with a GPU the same tests run on the real device with
`LUCEBOX_STATE_KERNELS_ON_GPU=1 python -m pytest tests/unit/cudasim/test_state_kernels.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ON_GPU = os.environ.get("LUCEBOX_STATE_KERNELS_ON_GPU") == "1"

if not (IN_SIM or ON_GPU):

    def test_state_kernels_under_the_simulator():
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", __file__]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).parents[3], timeout=600)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]

else:
    from numba import cuda

    from lucebox_cli.engines.base import Tree
    from lucebox_cli.state.conv_gather import conv_gather_ref, run_conv_gather
    from lucebox_cli.state.feature_compact import feature_compact_ref, run_feature_compact
    from lucebox_cli.state.kv_compact import kv_compact_ref, run_kv_compact
    from lucebox_cli.state.state_select import run_state_select, state_select_ref
    from lucebox_cli.state.tree_mask import mask_words, run_tree_mask, tree_mask_ref, unpack_mask

    @pytest.fixture(autouse=True)
    def _fast_simulator():
        # the simulator hands the GIL between its per-thread Python threads; switch often
        old = sys.getswitchinterval()
        if IN_SIM:
            sys.setswitchinterval(1e-6)
        yield
        sys.setswitchinterval(old)

    def _random_tree(rng: np.random.Generator, n: int) -> Tree:
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
        return Tree(rng.integers(0, 100, size=n), parents)

    def _random_path(rng: np.random.Generator, n: int) -> tuple[Tree, list[int]]:
        tree = _random_tree(rng, n)
        return tree, tree.path_to(int(rng.integers(0, n)))

    @pytest.mark.parametrize("n,committed", [(1, 0), (5, 3), (33, 17), (40, 1000)], ids=lambda v: str(v))
    def test_tree_mask(n, committed):
        rng = np.random.default_rng(n)
        tree = _random_tree(rng, n)
        parents = tree.parents.astype(np.int32)
        mask = np.full((n, mask_words(n)), 0xFFFFFFFF, dtype=np.uint32)
        pos = np.full(n, -7, dtype=np.int32)
        tree_mask_ref(parents, committed, mask, pos)
        assert np.array_equal(unpack_mask(mask, n), tree.ancestor_mask())
        assert np.array_equal(pos, committed + tree.depth)
        # outputs poisoned so any element the kernel skips fails the comparison
        d_mask = cuda.to_device(np.full_like(mask, 0xFFFFFFFF))
        d_pos = cuda.to_device(np.full_like(pos, -7))
        run_tree_mask(cuda.to_device(parents), committed, d_mask, d_pos)
        assert np.array_equal(d_mask.copy_to_host(), mask)
        assert np.array_equal(d_pos.copy_to_host(), pos)

    @pytest.mark.parametrize("shape,n_slots,committed", [((2, 3, 40, 5), 9, 4), ((1, 2, 64, 3), 23, 30)], ids=str)
    def test_kv_compact(shape, n_slots, committed):
        rng = np.random.default_rng(n_slots)
        _, path = _random_path(rng, n_slots)
        k0 = rng.standard_normal(shape).astype(np.float32)
        v0 = rng.standard_normal(shape).astype(np.float32)
        k, v = kv_compact_ref(k0.copy(), v0.copy(), np.array(path), committed)
        # definition: row committed + j holds accepted slot path[j]'s row; committed rows stay
        for j, slot in enumerate(path):
            assert np.array_equal(k[:, :, committed + j], k0[:, :, committed + slot])
            assert np.array_equal(v[:, :, committed + j], v0[:, :, committed + slot])
        assert np.array_equal(k[:, :, :committed], k0[:, :, :committed])
        d_k, d_v = cuda.to_device(k0), cuda.to_device(v0)
        run_kv_compact(d_k, d_v, cuda.to_device(np.array(path, dtype=np.int32)), committed)
        assert np.array_equal(d_k.copy_to_host(), k)
        assert np.array_equal(d_v.copy_to_host(), v)

    def test_kv_compact_overlapping_rows():
        # path [0, 2, 3]: slot 2 moves onto row 1 while slot 3 moves onto row 2 (a parallel-j race)
        k0 = np.arange(2 * 1 * 6 * 2, dtype=np.float32).reshape(2, 1, 6, 2)
        k, _ = kv_compact_ref(k0.copy(), k0.copy(), np.array([0, 2, 3]), 1)
        assert np.array_equal(k[:, :, 1:4], k0[:, :, [1, 3, 4]])
        d_k, d_v = cuda.to_device(k0), cuda.to_device(k0)
        run_kv_compact(d_k, d_v, cuda.to_device(np.array([0, 2, 3])), 1)
        assert np.array_equal(d_k.copy_to_host(), k)

    @pytest.mark.parametrize("shape,n_slots", [((2, 3, 4, 5), 7), ((1, 1, 2, 3), 1)], ids=str)
    def test_state_select(shape, n_slots):
        rng = np.random.default_rng(len(shape) + n_slots)
        nodes = rng.standard_normal((n_slots, *shape)).astype(np.float32)
        slot = int(rng.integers(0, n_slots))
        state = state_select_ref(np.full(shape, np.nan, dtype=np.float32), nodes, slot)
        assert np.array_equal(state, nodes[slot])
        d_state = cuda.to_device(np.full(shape, np.nan, dtype=np.float32))
        run_state_select(d_state, cuda.to_device(nodes), slot)
        assert np.array_equal(d_state.copy_to_host(), state)

    def _conv_sequential(window: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        # definition: each token shifts the window left by one and appends its input
        for x in inputs:
            window = np.concatenate([window[:, 1:], x[:, None]], axis=1)
        return window

    @pytest.mark.parametrize("depth", [0, 1, 2, 3, 6], ids=lambda d: f"depth{d}")
    def test_conv_gather(depth):
        rng = np.random.default_rng(depth)
        n_layers, width, channels, n_slots = 2, 3, 6, 12
        tree = _random_tree(rng, n_slots)
        # pick a slot of the wanted depth, or make one by chaining the tail
        parents = tree.parents.copy()
        for d in range(1, depth + 1):
            parents[d] = d - 1
        tree = Tree(tree.tokens, parents)
        slot = depth
        conv0 = rng.standard_normal((n_layers, width, channels)).astype(np.float32)
        inputs = rng.standard_normal((n_slots, n_layers, channels)).astype(np.float32)
        conv = conv_gather_ref(conv0.copy(), inputs, tree.parents, slot)
        assert np.array_equal(conv, _conv_sequential(conv0, inputs[tree.path_to(slot)]))
        d_conv = cuda.to_device(conv0)
        run_conv_gather(d_conv, cuda.to_device(inputs), cuda.to_device(tree.parents), slot)
        assert np.array_equal(d_conv.copy_to_host(), conv)

    @pytest.mark.parametrize("ring_len,committed,n_slots", [(8, 6, 9), (32, 0, 5), (4, 13, 3)], ids=str)
    def test_feature_compact(ring_len, committed, n_slots):
        rng = np.random.default_rng(ring_len + committed)
        _, path = _random_path(rng, n_slots)
        ring0 = rng.standard_normal((ring_len, 5)).astype(np.float32)
        feats = rng.standard_normal((n_slots, 5)).astype(np.float32)
        ring = feature_compact_ref(ring0.copy(), feats, np.array(path), committed)
        for j, slot in enumerate(path):
            assert np.array_equal(ring[(committed + j) % ring_len], feats[slot])
        d_ring = cuda.to_device(ring0)
        run_feature_compact(d_ring, cuda.to_device(feats), cuda.to_device(np.array(path)), committed)
        assert np.array_equal(d_ring.copy_to_host(), ring)
