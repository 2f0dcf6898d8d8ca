#!/usr/bin/env bash
# Create (or refresh) the dedicated virtual environment for the verl plugin.
#
# Why a separate venv: verl 0.9.1 caps transformers < 5.11 while the rest of
# tracerl runs on transformers 5.24 in the system Python. verl must never be
# installed there. The venv lives at <repo>/.venv-verl (git-ignored by .venv*/).
#
# Idempotent: an existing venv whose `import verl` reports 0.9.1, whose
# editable installs point at this checkout and which was installed from the
# current pyproject.toml files (their hash is kept in the venv) is kept; pass
# --force to rebuild.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${TRACERL_VERL_VENV:-$ROOT/.venv-verl}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
fi

# The dependencies the venv was installed from: a change (a new dependency of core) reinstalls.
DEPS_HASH="$(cat "$ROOT/pyproject.toml" "$ROOT/plugins/local/pyproject.toml" "$ROOT/plugins/verl/pyproject.toml" | sha256sum | cut -d' ' -f1)"
STAMP="$VENV/.tracerl-deps"

if [[ -x "$VENV/bin/python" ]] && [[ "$(cat "$STAMP" 2>/dev/null)" == "$DEPS_HASH" ]] \
    && "$VENV/bin/python" - "$ROOT" <<'PYEOF' 2>/dev/null
import sys, pathlib
import verl, tracerl_verl, tracerl_local, core
assert verl.__version__ == "0.9.1", verl.__version__
root = pathlib.Path(sys.argv[1]).resolve()
for mod in (tracerl_verl, tracerl_local, core):
    assert root in pathlib.Path(mod.__file__).resolve().parents, mod.__file__
PYEOF
then
    echo "verl venv ready: $VENV"
    exit 0
fi

echo "building verl venv at $VENV (about 3 minutes, 1.6 GB)"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
# The CPU build of torch first, so verl's dependency resolution keeps it.
# (On this project's machines pip's find-links serve the local CPU wheel.)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e "$ROOT" -e "$ROOT/plugins/local" -e "$ROOT/plugins/verl[test]"
echo "$DEPS_HASH" > "$STAMP"
"$VENV/bin/python" -c "import verl, tracerl_verl; print('verl', verl.__version__, 'ready in', '$VENV')"
