#!/usr/bin/env python3
"""Summarise the 0.8B megakernel's all-block phase stamps (MKPB lines of an MK_PROFILE build).

    LUCEBOX_BUILD_DIR=<profile build> lucebox bench speed MODEL -p 520 -n 8 -r 1 > prof.txt
    python scripts/mk_profile_blocks.py prof.txt

Every block's thread 0 stamps %globaltimer at each phase boundary of step 1 (cuda/megakernel/mk_kernel.cu).
For each of a layer's five grid barriers this prints, averaged over the DeltaNet and the attention layers
apart: when the first and the last block arrive (after the phase before it), how long the release takes
after the last arrival, and which blocks arrive last most often: whether a barrier costs because of the
barrier itself or because it waits for a slow block, and whether the slow blocks are always the same.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import Counter

import numpy as np

# per layer, 14 marks after the layer's start mark m0 = 1 + 14 l (mark m0 + k is stamped after phase k):
# 0 pro1, 1 in, 2 bar1, 3 mix, 4 bar2, 5 pro2, 6 out, 7 bar3, 8 pro3, 9 gu, 10 bar4, 11 pro4, 12 down, 13 bar5
PHASES = ["pro1", "in", "bar1", "mix", "bar2", "pro2", "out", "bar3", "pro3", "gu", "bar4", "pro4", "down", "bar5"]
BARRIERS = {"bar1": 1, "bar2": 3, "bar3": 6, "bar4": 9, "bar5": 12}  # arrival mark offset; release = +1


def parse(text: str) -> np.ndarray:
    rows: dict[int, list[int]] = {}
    for line in text.splitlines():
        m = re.match(r"MKPB (\d+): (.*)", line.strip())
        if m:
            rows[int(m.group(1))] = [int(v) for v in m.group(2).split()]
    if not rows:
        raise SystemExit("no MKPB lines: run an MK_PROFILE build with n_steps >= 2")
    n = min(len(v) for v in rows.values())
    return np.array([rows[b][:n] for b in sorted(rows)], dtype=np.int64)


def summarise(t: np.ndarray, n_layers: int) -> str:
    out = []
    # a layer is attention when its mixer phase is the long one (the profile does not say which is which)
    mix = [float(np.median(t[:, 1 + 14 * l + 3] - t[:, 1 + 14 * l + 2])) for l in range(n_layers)]
    cut = (min(mix) + max(mix)) / 2
    kinds = {"deltanet": [l for l in range(n_layers) if mix[l] <= cut],
             "attention": [l for l in range(n_layers) if mix[l] > cut]}
    for kind, layers in kinds.items():
        if not layers:
            continue
        out.append(f"== {kind} layers ({len(layers)}): µs, mean over layers")
        out.append("phase   median-block  max-block")
        for k, name in enumerate(PHASES):
            med, mx = [], []
            for l in layers:
                a = 1 + 14 * l + k
                d = (t[:, a] - t[:, a - 1]) / 1e3
                med.append(float(np.median(d)))
                mx.append(float(d.max()))
            out.append(f"{name:6s} {statistics.mean(med):10.2f} {statistics.mean(mx):10.2f}")
        out.append("barrier  first-arrival  last-arrival  release-after-last  release-spread  (from the previous "
                   "phase's earliest start)")
        for name, off in BARRIERS.items():
            first, last, lag, spread = [], [], [], []
            late = Counter()
            for l in layers:
                a, r = 1 + 14 * l + off, 1 + 14 * l + off + 1
                start = t[:, a - 1].min()
                first.append((t[:, a].min() - start) / 1e3)
                last.append((t[:, a].max() - start) / 1e3)
                lag.append((t[:, r].min() - t[:, a].max()) / 1e3)
                spread.append((t[:, r].max() - t[:, r].min()) / 1e3)
                for b in np.argsort(t[:, a])[-3:]:
                    late[int(b)] += 1
            top = ", ".join(f"{b}×{c}" for b, c in late.most_common(5))
            out.append(f"{name:6s} {statistics.mean(first):10.2f} {statistics.mean(last):13.2f} "
                       f"{statistics.mean(lag):15.2f} {statistics.mean(spread):14.2f}   last three: {top}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="output of a profile-build run (MKPB lines)")
    args = ap.parse_args(argv)
    t = parse(open(args.file).read())
    n_layers = (t.shape[1] - 3) // 14
    print(f"{t.shape[0]} blocks, {n_layers} layers")
    print(summarise(t, n_layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
