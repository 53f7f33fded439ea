#!/usr/bin/env python3
"""Write a tiny random-weight Qwen3.5 checkpoint (real tokenizer and architecture) for demos.

    python scripts/make_tiny_model.py OUT_DIR

The same writer the unit tests use (tests/unit/tiny_models.py); `make run` falls back to it when the
real weights are neither cached nor downloadable, so the whole pipeline still runs (its text is noise).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from tiny_models import make_tiny_checkpoint  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py OUT_DIR")
    out = Path(sys.argv[1])
    if not (out / "config.json").exists():
        make_tiny_checkpoint(out, hv_ratio=2, tied=True, n_layers=4, hidden=64, seed=0)
    print(out)


if __name__ == "__main__":
    main()
