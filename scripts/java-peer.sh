#!/usr/bin/env bash
# The peer of benches/vs_java.rs: the watchbridge job written with the plain Kafka Java client
# (bench/java/NaiveBridge.java), compiled once against the client jars of the Apache Kafka
# install (scripts/kafka.sh: kafka-clients, Jackson, lz4, slf4j-simple; pinned there) into the
# cache outside the clone ($WATCHBRIDGE_CACHE, default ~/.cache/watchbridge), in a dir named
# by the source's hash, so an edited source gets a fresh build and never a stale one.
#
#   scripts/java-peer.sh install     compile it if missing
#   scripts/java-peer.sh classpath   print the class path to run it with (`java -cp … NaiveBridge`)
#
# Needs Java 17+ (javac). Concurrent installs wait for the first (`install_once` of
# scripts/broker-lib.sh, as the brokers' scripts do).
set -euo pipefail
# shellcheck source=scripts/broker-lib.sh
. "$(dirname "$0")/broker-lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOURCE="$ROOT/bench/java/NaiveBridge.java"
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
# The client's jars, and only those (the broker's are in the same dir).
JARS=(kafka-clients jackson-databind jackson-core jackson-annotations lz4-java zstd-jni snappy-java slf4j-api slf4j-simple)

jars() {
    local libs cp="" jar name
    libs="$("$ROOT/scripts/kafka.sh" path)"
    for name in "${JARS[@]}"; do
        jar="$(ls "$libs/$name"-[0-9]*.jar 2>/dev/null | head -n1)"
        if [ -z "$jar" ]; then
            echo "no $name jar in $libs (the Apache Kafka install)" >&2
            exit 1
        fi
        cp="$cp${cp:+:}$jar"
    done
    echo "$cp"
}

hash="$(sha256sum "$SOURCE" | cut -c1-12)"
DIR="$CACHE/java-peer-$hash"

installed() {
    [ -f "$DIR/.complete" ]
}

# Into a temp dir, then moved into place: never a half-compiled dir that runs would trust.
compile() {
    local cp tmp
    cp="$(jars)"
    tmp="$(mktemp -d "$CACHE/java-peer-build.XXXXXX")"
    javac -Xlint:all -Werror -d "$tmp/classes" -cp "$cp" "$SOURCE" >&2
    touch "$tmp/.complete"
    rm -rf "$DIR"
    mv "$tmp" "$DIR"
}

install() {
    installed && return
    command -v javac >/dev/null || {
        echo "the Java benchmark peer needs javac (Java 17+; Debian: apt-get install openjdk-17-jdk-headless)" >&2
        exit 1
    }
    install_once "java-peer-$hash" installed compile
}

case "${1:-}" in
    install) install ;;
    classpath) install; echo "$DIR/classes:$(jars)" ;;
    *) echo "usage: $0 install|classpath" >&2; exit 2 ;;
esac
