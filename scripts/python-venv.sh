#!/usr/bin/env bash
# A Python environment of the project: a venv with exactly one requirements file, created
# once and reused, in the cache outside the clone ($WATCHBRIDGE_CACHE, default
# ~/.cache/watchbridge), named by the requirements' hash, so a changed pin gets a fresh venv
# and never a half-updated one. The default is the benchmarks written in Python
# (bench/python/requirements.txt); the tests' Python tools have their own
# (tests/python/requirements.txt).
#
#   scripts/python-venv.sh [REQUIREMENTS]   create it if missing; print its python's path (stdout)
#
# REQUIREMENTS is a path, absolute or relative to the clone (default
# bench/python/requirements.txt). The bench venv keeps its name, python-venv-<hash>; another
# file's is python-venv-<dir>-<hash> (e.g. python-venv-tests-python-<hash>).
#
# Needs python3 with its venv module (Debian: python3-venv); the packages come from PyPI.
# Concurrent calls wait for the first (flock on a file in the cache), like scripts/tansu.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEFAULT_REQUIREMENTS="bench/python/requirements.txt"
REQUIREMENTS_ARG="${1:-$DEFAULT_REQUIREMENTS}"
case "$REQUIREMENTS_ARG" in
    /*) REQUIREMENTS="$REQUIREMENTS_ARG" ;;
    *) REQUIREMENTS="$ROOT/$REQUIREMENTS_ARG" ;;
esac
if [ ! -f "$REQUIREMENTS" ]; then
    echo "no requirements file $REQUIREMENTS" >&2
    exit 2
fi
# A name for the venv: none for the default (its historical name), else the file's
# directory relative to the clone, slashes made dashes.
REQUIREMENTS_REL="${REQUIREMENTS#"$ROOT"/}"
case "$REQUIREMENTS_REL" in
    "$DEFAULT_REQUIREMENTS") LABEL= ;;
    *) LABEL="$(dirname "$REQUIREMENTS_REL" | tr -c 'A-Za-z0-9_.\n' '-' | sed 's/^-*//')-" ;;
esac
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
PYTHON3="${PYTHON3:-python3}"

if ! command -v "$PYTHON3" >/dev/null 2>&1; then
    echo "python3 is required for $REQUIREMENTS_REL but was not found;" \
        "install it (Debian: apt-get install python3 python3-venv) or set PYTHON3" >&2
    exit 1
fi
if ! "$PYTHON3" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "$PYTHON3 has no working venv module (Debian: apt-get install python3-venv)" >&2
    exit 1
fi

hash="$(sha256sum "$REQUIREMENTS" | cut -c1-12)"
VENV="$CACHE/python-venv-$LABEL$hash"
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
        echo "creating the Python venv $VENV (once) from $REQUIREMENTS_REL" >&2
        rm -rf "$VENV"
        "$PYTHON3" -m venv "$VENV" >&2
        "$PY" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2
        touch "$VENV/.complete"
    fi
    exec 9>&-
fi
echo "$PY"
