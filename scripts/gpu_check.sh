#!/usr/bin/env bash
# The GPU check: a roofline of this card, then every module's solution notebook on NCCL
# (scripts/gpu_check.py says what it measures). Run from anywhere, after `make setup`:
#     scripts/gpu_check.sh [--budget 480]
# On a machine without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ! -x .venv/bin/python ]]; then
  echo "no .venv here: run \`make setup\` first" >&2
  exit 2
fi
exec .venv/bin/python scripts/gpu_check.py "$@"
