#!/usr/bin/env bash
# The main job (`make run`): generate with Qwen3.5-0.8B.
#   engine: `--engine auto` picks the GPU megakernel when a GPU and a built engine are here, else the
#           CPU reference engine (and says so);
#   weights: the HF cache, pulled on first use; with no cache and no network, a tiny random-weight
#            checkpoint with the real tokenizer, so every stage still runs (its text is noise).
set -uo pipefail
cd "$(dirname "$0")/.."
LB=.venv/bin/lucebox
PY=.venv/bin/python
prompt="${1:-The capital of France is}"

if $PY -c "from lucebox_cli.engines import _lib; raise SystemExit(0 if _lib.gpu_count() > 0 else 1)" 2>/dev/null; then
  make --no-print-directory build >&2 || echo "lucebox: engine build failed; the CPU engine will run" >&2
fi

if $LB pull qwen3.5-0.8b >&2; then
  model=qwen3.5-0.8b
else
  model=${LUCEBOX_DEMO_DIR:-.cache/tiny-qwen35-random}
  echo "lucebox: qwen3.5-0.8b is not cached and could not be pulled; running a tiny RANDOM-weight model at $model (output is noise)" >&2
  $PY scripts/make_tiny_model.py "$model" >/dev/null || exit 1
fi
exec $LB run "$model" --prompt "$prompt" --max-tokens 32
