#!/usr/bin/env bash
# `make test-torch`'s venv: torch VERSION from PyPI and the rest of
# requirements-dev.txt in VENV (docs/installing.md#torch-releases).
# Usage: scripts/torch_venv.sh VERSION VENV  (PYTHON: the venv's interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
torch=${1:-} venv=${2:-}
[ -n "$torch" ] && [ -n "$venv" ] || { echo "usage: make test-torch TORCH=x.y.z (a torch release on PyPI, e.g. 2.14.1)"; exit 2; }
py=$venv/bin/python
set -x
test -x "$py" || "${PYTHON:-python3}" -m venv "$venv"
"$py" -m pip install -q --upgrade pip
grep -v '^torch==' requirements-dev.txt > "$venv/requirements.txt"
"$py" -m pip install -q "torch==$torch" -r "$venv/requirements.txt"
"$py" -c 'import sys, torch; v = torch.__version__.split("+")[0]; sys.exit(0 if v == sys.argv[1] else f"installed torch {v}, not {sys.argv[1]}")' "$torch"
