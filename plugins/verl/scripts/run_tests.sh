#!/usr/bin/env bash
# Run the verl plugin's tests inside its own virtual environment.
#
# Usage: plugins/verl/scripts/run_tests.sh [pytest args...]
# Builds the venv first when it is missing (setup_venv.sh is idempotent).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${TRACERL_VERL_VENV:-$ROOT/.venv-verl}"
bash "$ROOT/plugins/verl/scripts/setup_venv.sh"
cd "$ROOT"
# Ray and verl read these; keep them quiet and offline.
export TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export RAY_USAGE_STATS_ENABLED=0 TORCH_COMPILE_DISABLE=1
exec "$VENV/bin/python" -m pytest plugins/verl/tests "$@"
