#!/usr/bin/env bash
# Install tracerl, its in-tree plugins and (with "test") the test tools into
# the current Python environment. Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip install --disable-pip-version-check -q"
# The CPU build of torch first: a bare `torch` requirement would pull a CUDA build.
$PIP "torch==2.13.0"
EXTRAS=""
if [[ "${1:-}" == "test" ]]; then EXTRAS="[test]"; fi
LOCAL="plugins/local"
if [[ "${1:-}" == "test" ]]; then LOCAL="plugins/local[lora]"; fi  # LoRA tests need peft
$PIP -e ".${EXTRAS}" -e "$LOCAL" -e plugins/tinker -e plugins/sagemaker -e plugins/slime
# The training-sessions SDK without the ~0.9 GB it declares (mlflow, pyarrow, ...);
# its clients need only boto3 and pydantic (see docs/backends/sagemaker.md).
# Installed last: once it is present, any later pip install that touches one of
# its declared dependencies prints "ERROR: pip's dependency resolver ...
# sagemaker-train requires mlflow ..., which is not installed" (a warning about
# the dependencies deliberately left out, not a failure; `pip check` says the same).
$PIP --no-deps "sagemaker-train==1.27.0"
