#!/usr/bin/env bash
# librdkafka's own producer benchmark, `rdkafka_performance` (its examples/rdkafka_performance.c),
# a reference row of benches/e2e.rs: built once from the librdkafka sources vendored in the
# cargo registry (rdkafka-sys, the version Cargo.lock pins) against the static librdkafka that
# rdkafka-sys built in this clone's target dir (the same library, configure flags and
# dependencies the bridge links), into a cache outside the clone ($WATCHBRIDGE_CACHE, default
# ~/.cache/watchbridge), in a dir named by the librdkafka version.
#
#   scripts/rdkafka-perf.sh install   build it if missing (a few seconds; runs
#                                     `cargo build -p rdkafka-sys` first if no librdkafka.a
#                                     was built yet)
#   scripts/rdkafka-perf.sh path      print the binary's path (installing it if missing)
#
# Needs gcc and the -dev packages librdkafka was configured with (`make setup` installs them:
# OpenSSL, Cyrus SASL, libcurl). Concurrent installs wait for the first (`install_once` of
# scripts/broker-lib.sh).
set -euo pipefail
# shellcheck source=scripts/broker-lib.sh
. "$(dirname "$0")/broker-lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
# rdkafka-sys's version as Cargo.lock pins it, e.g. 4.10.0+2.12.1 (librdkafka 2.12.1).
SYS_VERSION="$(awk '/^name = "rdkafka-sys"$/ {getline; gsub(/"/, "", $3); print $3; exit}' "$ROOT/Cargo.lock")"
[ -n "$SYS_VERSION" ] || { echo "no rdkafka-sys in $ROOT/Cargo.lock" >&2; exit 1; }
LIBRDKAFKA_VERSION="${SYS_VERSION#*+}"
DIR="$CACHE/rdkafka-perf-$LIBRDKAFKA_VERSION"
BIN="$DIR/rdkafka_performance"

installed() {
    [ -x "$BIN" ]
}

# The vendored sources' example, in the cargo registry.
example() {
    local c
    for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"rdkafka-sys-$SYS_VERSION"/librdkafka/examples/rdkafka_performance.c; do
        [ -f "$c" ] && { echo "$c"; return; }
    done
    echo "no rdkafka-sys-$SYS_VERSION sources in the cargo registry (${CARGO_HOME:-$HOME/.cargo}/registry/src); \`cargo fetch\` downloads them" >&2
    exit 1
}

# The newest build dir of rdkafka-sys (any profile) whose librdkafka is this version: its
# `out` holds the configured source tree (config.h, src/*.h) and src/librdkafka.a.
built_out() {
    local a out
    # shellcheck disable=SC2012
    for a in $(ls -t "$TARGET"/*/build/rdkafka-sys-*/out/src/librdkafka.a 2>/dev/null); do
        out="${a%/src/librdkafka.a}"
        if grep -q "^RDKAFKA_VERSION_STR=[[:space:]]*$LIBRDKAFKA_VERSION\$" "$out/Makefile.config" 2>/dev/null; then
            echo "$out"
            return
        fi
    done
}

build() {
    command -v gcc >/dev/null || { echo "building rdkafka_performance needs gcc" >&2; exit 1; }
    local source out libs zstd tmp
    source="$(example)"
    out="$(built_out)"
    if [ -z "$out" ]; then
        echo "no librdkafka $LIBRDKAFKA_VERSION built in $TARGET yet: cargo build --release -p rdkafka-sys" >&2
        (cd "$ROOT" && cargo build --release -p rdkafka-sys >&2)
        out="$(built_out)"
        [ -n "$out" ] || { echo "cargo built rdkafka-sys but no librdkafka.a of $LIBRDKAFKA_VERSION is in $TARGET" >&2; exit 1; }
    fi
    # The libraries librdkafka was configured to link (OpenSSL, SASL, curl, zstd, ...).
    libs="$(sed -n 's/^LIBS+=[[:space:]]*//p' "$out/Makefile.config")"
    # zstd is the zstd-sys crate's static build, beside rdkafka-sys's in the same profile
    # (the path Makefile.config names may be another clone's).
    # shellcheck disable=SC2012
    zstd="$(ls -t "${out%/rdkafka-sys-*/out}"/zstd-sys-*/out/libzstd.a 2>/dev/null | head -n1)"
    echo "building rdkafka_performance (librdkafka $LIBRDKAFKA_VERSION, $out/src/librdkafka.a) into $DIR" >&2
    mkdir -p "$CACHE"
    tmp="$(mktemp -d "$CACHE/rdkafka-perf-build.XXXXXX")"
    # shellcheck disable=SC2086
    gcc -O2 -I"$out/src" -I"$out" "$source" -o "$tmp/rdkafka_performance" \
        "$out/src/librdkafka.a" ${zstd:+-L"$(dirname "$zstd")"} $libs >&2
    rm -rf "$DIR"
    mv "$tmp" "$DIR"
}

install() {
    install_once "rdkafka-perf-$LIBRDKAFKA_VERSION" installed build
}

case "${1:-}" in
    install) install ;;
    path) install; echo "$BIN" ;;
    *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
