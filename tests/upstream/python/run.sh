#!/usr/bin/env bash
# Runs smoke.py (upstream's Python SDK against our system) in a virtualenv of its own.
#
#   VENV_DIR  where the virtualenv lives (default: target/upstream-python-venv under the
#             repository root); reused while requirements.txt is unchanged
#   PYTHON    interpreter that creates it (default: python3; 3.11 or newer)
#
# Everything else in the environment (KUBECONFIG, SANDBOX_*, CI, PATH for kubectl) is passed
# to smoke.py unchanged; see README.md.
#
#   run.sh --prepare   only makes (or checks) the virtualenv, for a run that has no network
#                      later (the end-to-end suite's control-plane tier)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../../.." && pwd)"
venv="${VENV_DIR:-$repo_root/target/upstream-python-venv}"
case "$venv" in
  /*) ;;
  *) venv="$repo_root/$venv" ;;
esac
python="${PYTHON:-python3}"
requirements="$here/requirements.txt"
stamp="$venv/.requirements.sha256"

if ! command -v "$python" >/dev/null 2>&1; then
  echo "run.sh: $python not found; install Python 3.11 or newer (or set PYTHON)" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "run.sh: $("$python" -V 2>&1) is too old: k8s-agent-sandbox needs Python 3.11 or newer (set PYTHON)" >&2
  exit 1
fi

want="$("$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$requirements")"
have="$(cat "$stamp" 2>/dev/null || true)"
if [[ "$want" != "$have" || ! -x "$venv/bin/python" ]]; then
  echo "run.sh: creating the virtualenv $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$python" -m venv "$venv"; then
    rm -rf "$venv"
    echo "run.sh: '$python -m venv' failed; on Debian/Ubuntu install the venv module:" >&2
    echo "        sudo apt-get install python3-venv   (or python3.X-venv for your version)" >&2
    exit 1
  fi
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$venv"
    echo "run.sh: the virtualenv has no pip (ensurepip missing); install python3-venv" >&2
    exit 1
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input -r "$requirements"
  # Written last: an interrupted install is redone next time.
  echo "$want" >"$stamp"
fi

if [[ "${1:-}" == "--prepare" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
exec "$venv/bin/python" "$here/smoke.py"
