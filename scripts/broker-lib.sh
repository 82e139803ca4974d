# Sourced by scripts/tansu.sh and scripts/kafka.sh: what the two test brokers' scripts
# share.
#
#   install_once NAME INSTALLED INSTALL
#       install something into the cache outside the clone ($CACHE) once, however many
#       callers ask at the same time
#
# Returns at once if the function INSTALLED succeeds. Else one install at a time: a second
# caller (another clone, a parallel `make`, a test binary) waits on a lock file in the cache
# (flock) for the first, then finds it installed; the first runs the function INSTALL, which
# must build into a temp dir and move the result into place, so that an interrupted install
# never leaves a half one that later runs would trust.
#
#   free_port
#       print a loopback port free now
#
#   wait_listening NAME PORT DIR SECONDS
#       wait until the broker NAME started in the background (pid in DIR/NAME.pid, log in
#       DIR/NAME.log) listens on 127.0.0.1:PORT, then print that address; exit 1 with its
#       log if it dies first or does not listen within SECONDS
#
#   stop_started NAME DIR
#       stop the broker NAME started in DIR (SIGTERM to the pid in DIR/NAME.pid)

install_once() {
    local name="$1" installed="$2" install="$3"
    if "$installed"; then
        return
    fi
    mkdir -p "$CACHE"
    exec 9>"$CACHE/$name.lock"
    if ! flock -n 9; then
        echo "waiting for another install of $name to finish" >&2
        flock 9
    fi
    if ! "$installed"; then
        "$install"
    fi
    # Unlock, and keep the lock's fd out of a broker that `start` runs in the background.
    exec 9>&-
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_listening() {
    local name="$1" port="$2" dir="$3" seconds="$4"
    for _ in $(seq 1 $((seconds * 10))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "127.0.0.1:$port"
            return
        fi
        if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
            echo "$name exited; its log:" >&2
            cat "$dir/$name.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "$name did not listen on 127.0.0.1:$port within $seconds s; log in $dir/$name.log" >&2
    exit 1
}

stop_started() {
    local name="$1" dir="$2"
    if [ -f "$dir/$name.pid" ]; then
        kill "$(cat "$dir/$name.pid")" 2>/dev/null || true
        rm -f "$dir/$name.pid"
    fi
}
