#!/usr/bin/env bash
# The test broker: Tansu, a Kafka-protocol broker (crates.io `tansu`), pinned.
#
#   scripts/tansu.sh install   build it once into a cache outside the clone (~10 min), else reuse
#   scripts/tansu.sh path      print the binary's path (installing it if missing)
#   scripts/tansu.sh start DIR start one on a free loopback port, storage in DIR; prints
#                              `127.0.0.1:PORT` once it answers; its pid is in DIR/tansu.pid
#   scripts/tansu.sh stop DIR  stop the one started in DIR
#   scripts/tansu.sh run       run one in the foreground on 127.0.0.1:$TANSU_PORT (default
#                              9092), data kept in $TANSU_DATA (default $CACHE/tansu-data)
#
# The cache is $WATCHBRIDGE_CACHE (default ~/.cache/watchbridge); set TANSU_BIN to use a
# binary of your own. Concurrent installs wait for the first (flock on a file in the cache).
# The Rust test fixture (tests/support/kafka.rs) starts its own broker; it only uses `path`.
set -euo pipefail

TANSU_VERSION=0.6.0
# Storage engines built in: `libsql` for `sqlite://` (what the tests use: it survives a
# broker crash), `dynostore` for `memory://` (what `make bench` measures throughput on: with
# SQLite the broker, not the client, is the limit). The features are part of the cache path,
# so a build with other features is never mistaken for this one.
TANSU_FEATURES=libsql,dynostore
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
ROOT="$CACHE/tansu-$TANSU_VERSION-${TANSU_FEATURES//,/-}"
BIN="${TANSU_BIN:-$ROOT/bin/tansu}"
# shellcheck source=scripts/broker-lib.sh
. "$(dirname "$0")/broker-lib.sh"

installed() {
    [ -x "$BIN" ]
}

build() {
    echo "installing tansu $TANSU_VERSION into $ROOT (once; about 10 minutes)" >&2
    local tmp
    tmp="$(mktemp -d "$CACHE/tansu-build.XXXXXX")"
    cargo install tansu --version "$TANSU_VERSION" --locked --features "$TANSU_FEATURES" \
        --root "$tmp/root" --target-dir "$tmp/target" >&2
    mkdir -p "$ROOT/bin"
    mv "$tmp/root/bin/tansu" "$ROOT/bin/tansu.partial"
    mv "$ROOT/bin/tansu.partial" "$ROOT/bin/tansu"
    rm -rf "$tmp"
}

install() {
    if [ -n "${TANSU_BIN:-}" ] && ! installed; then
        echo "TANSU_BIN=$TANSU_BIN is not an executable file" >&2
        exit 1
    fi
    install_once "tansu-$TANSU_VERSION" installed build
}

start() {
    local dir="$1"
    install
    mkdir -p "$dir"
    local port
    port="$(free_port)"
    (cd "$dir" && exec "$BIN" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine "sqlite://tansu.db" >"$dir/tansu.log" 2>&1) &
    echo $! >"$dir/tansu.pid"
    wait_listening tansu "$port" "$dir" 10
}

run() {
    install
    local port="${TANSU_PORT:-9092}"
    local data="${TANSU_DATA:-$CACHE/tansu-data}"
    mkdir -p "$data"
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is in use (is a broker already running?); set TANSU_PORT to another" >&2
        exit 1
    fi
    echo "Tansu (Kafka protocol) on 127.0.0.1:$port, data in $data; Ctrl-C stops it" >&2
    cd "$data"
    exec "$BIN" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine "sqlite://tansu.db"
}

case "${1:-}" in
    install) install ;;
    path) install; echo "$BIN" ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop_started tansu "${2:?usage: $0 stop DIR}" ;;
    run) run ;;
    *) echo "usage: $0 install|path|start DIR|stop DIR|run" >&2; exit 2 ;;
esac
