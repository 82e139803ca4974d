#!/usr/bin/env bash
# The Python environment of the benchmarks written in Python (bench/python/): a venv with
# exactly bench/python/requirements.txt, created once and reused, in the cache outside the
# clone ($WATCHBRIDGE_CACHE, default ~/.cache/watchbridge), named by the requirements'
# hash, so a changed pin gets a fresh venv and never a half-updated one.
#
#   scripts/python-venv.sh        create it if missing; print its python's path (stdout)
#
# Needs python3 with its venv module (Debian: python3-venv); the packages come from PyPI.
# Concurrent calls wait for the first (flock on a file in the cache), like scripts/tansu.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/bench/python/requirements.txt"
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
PYTHON3="${PYTHON3:-python3}"

if ! command -v "$PYTHON3" >/dev/null 2>&1; then
    echo "python3 is required for the Python benchmark (bench/python/) but was not found;" \
        "install it (Debian: apt-get install python3 python3-venv) or set PYTHON3" >&2
    exit 1
fi
if ! "$PYTHON3" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "$PYTHON3 has no working venv module (Debian: apt-get install python3-venv)" >&2
    exit 1
fi

hash="$(sha256sum "$REQUIREMENTS" | cut -c1-12)"
VENV="$CACHE/python-venv-$hash"
PY="$VENV/bin/python"

# `.complete` is written last: a venv without it (an interrupted install) is rebuilt.
if [ ! -e "$VENV/.complete" ]; then
    mkdir -p "$CACHE"
    exec 9>"$CACHE/python-venv.lock"
    if ! flock -n 9; then
        echo "waiting for another install of the Python venv to finish" >&2
        flock 9
    fi
    if [ ! -e "$VENV/.complete" ]; then
        echo "creating the Python venv $VENV (once) from bench/python/requirements.txt" >&2
        rm -rf "$VENV"
        "$PYTHON3" -m venv "$VENV" >&2
        "$PY" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2
        touch "$VENV/.complete"
    fi
    exec 9>&-
fi
echo "$PY"
