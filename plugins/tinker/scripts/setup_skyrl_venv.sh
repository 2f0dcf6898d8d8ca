#!/usr/bin/env bash
# Create (or refresh) the virtual environment of the SkyRL tx Tinker-API server
# that the `skyrl` test tier starts on 127.0.0.1.
#
# Why a separate venv: SkyRL tx (PyPI `skyrl`) needs Python >= 3.12, JAX and its
# own transformers/tinker pins; tracerl runs on Python 3.11. Only the server runs
# here; the tests run in tracerl's environment and reach it over HTTP. The venv
# lives at <repo>/.venv-skyrl (git-ignored by .venv*/); TRACERL_SKYRL_VENV moves it.
#
# Idempotent: an existing venv whose `skyrl` is the pinned release and imports
# is kept; pass --force to rebuild. The Python: $SKYRL_PYTHON_BIN, else the first
# of python3.12 / python3.13 on PATH, else a pyenv-installed 3.12 or 3.13.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${TRACERL_SKYRL_VENV:-$ROOT/.venv-skyrl}"
SKYRL_VERSION=0.4.0
# The server's own pins (what the tier was last verified with): JAX runs on CPU.
PINS=("skyrl[tinker,jax]==$SKYRL_VERSION" "jax==0.12.0.1" "jaxlib==0.12.0.1" "flax==0.12.12" "optax==0.2.8" "transformers==5.16.1"
    # skyrl 0.4.0 imports aiohttp (skyrl.tinker.extra) without declaring it
    "aiohttp")

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
fi

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$SKYRL_VERSION" <<'PYEOF' 2>/dev/null
import sys, importlib.metadata as m
assert m.version("skyrl") == sys.argv[1], m.version("skyrl")
import jax, skyrl.tinker.api  # noqa: F401
PYEOF
then
    echo "SkyRL tx venv ready: $VENV"
    exit 0
fi

find_python() {
    local candidate
    for candidate in "${SKYRL_PYTHON_BIN:-}" python3.12 python3.13; do
        if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
            command -v "$candidate"
            return
        fi
    done
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3; do
        if [[ -x "$candidate" ]]; then
            echo "$candidate"
            return
        fi
    done
    return 1
}
PY="$(find_python)" || {
    echo "SkyRL tx needs Python >= 3.12 (none found: set SKYRL_PYTHON_BIN)" >&2
    exit 1
}

echo "building SkyRL tx venv at $VENV with $("$PY" --version) (a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}"
"$VENV/bin/python" -c "import importlib.metadata as m, jax; print('SkyRL tx', m.version('skyrl'), 'jax', jax.__version__, 'ready in', '$VENV')"
