#!/usr/bin/env bash
# Run the `skyrl` tier: the Tinker backend against a real SkyRL tx Tinker-API
# server on 127.0.0.1 (CPU, a tiny model built offline).
#
# Usage: plugins/tinker/scripts/run_skyrl_tests.sh [pytest args...]
# Builds the server's venv first when it is missing (setup_skyrl_venv.sh is
# idempotent). The tests themselves run with the current `python` (tracerl's
# environment, with tracerl and tracerl-tinker installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${TRACERL_SKYRL_VENV:-$ROOT/.venv-skyrl}"
bash "$ROOT/plugins/tinker/scripts/setup_skyrl_venv.sh"
cd "$ROOT"
export TRACERL_SKYRL_PYTHON="$VENV/bin/python"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
# The tinker SDK leaves pooled sockets to the garbage collector after ServiceClient.close()
# (its transport is not ours to close); they may be collected between tests or at exit.
exec python -m pytest -m skyrl plugins/tinker/tests/skyrl -s -W ignore::ResourceWarning "$@"
