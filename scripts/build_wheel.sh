#!/usr/bin/env bash
# `make wheel`: the wheel built from the sdist with zig cc against glibc
# MANYLINUX, tagged, checked, and only then moved to dist/ (why each step:
# docs/installing.md, "The wheel and the sdist").
# Usage: scripts/build_wheel.sh SDIST MANYLINUX VENV BUILD  (make passes them)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 4 ] || { echo "usage: $0 SDIST MANYLINUX VENV BUILD" >&2; exit 2; }
sdist=$1 manylinux=$2
venv=$(realpath -ms "$3") build=$(realpath -ms "$4")  # absolute; a venv's python stays a link
py=$venv/bin/python out=$build/wheel
set -x
rm -rf "$out" && mkdir -p "$out"
CC="$py -m ziglang cc -target x86_64-linux-gnu.${manylinux//_/.} -fno-sanitize=undefined" CFLAGS= LDFLAGS= \
    ZIG_GLOBAL_CACHE_DIR="$build/zig-cache" ZIG_LOCAL_CACHE_DIR="$build/zig-cache" \
    "$py" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir -w "$out" "$sdist"
"$py" -m wheel tags --remove --platform-tag "manylinux_${manylinux}_x86_64" "$out"/goddp-*.whl
PATH="$venv/bin:$PATH" "$py" scripts/check_wheel.py --max-manylinux 2_28 "$out"/goddp-*.whl
rm -f dist/goddp-*.whl dist/.goddp-*.stamp
mv "$out"/goddp-*.whl dist/
