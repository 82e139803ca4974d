#!/usr/bin/env bash
# `make bench`: every benchmark in release mode, one after the other (they would disturb
# each other's figures), each section written to bench/results/<bench>.md, then
# bench/RESULTS.md assembled from them: a header (machine, versions, command, date), one
# summary table of every target (the `<!-- summary: … -->` lines the benches print), and
# the sections. The summary table is printed at the end.
#
#   scripts/bench.sh                 all benches
#   scripts/bench.sh e2e vs_python   only these (the others' sections stay as they were)
#
# Honest figures only:
# - A dirty tree is refused: a recorded figure must be rebuildable from its commit.
#   `BENCH_DIRTY=1` runs anyway, printing each section to the terminal and recording
#   nothing (for trying a change).
# - Before each section the bench waits (up to 3 minutes) for the machine's 1-minute load
#   average to fall below `BENCH_MAX_LOAD` (default: half the cores); the load before and
#   during (sampled every 5 s: mean and max, the bench's own processes included) goes in
#   the section's stamp, and a section that began above it is marked **disturbed** there
#   and in the summary.
# - Every run of a section is appended to bench/results/log.md (date, commit, loads, and
#   its summary lines), which is never rewritten: RESULTS.md shows the last run of each
#   section, the log every run before it.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(engine scale restore recovery_cost e2e vs_python vs_java guarantee object_store)
if [ "$#" -gt 0 ]; then BENCHES=("$@"); else BENCHES=("${ALL[@]}"); fi

# (The results themselves do not count: recording one section must not refuse the next.)
dirty=$(git status --porcelain -- . ':!bench/results' ':!bench/RESULTS.md' 2>/dev/null || echo '?')
if [ -n "$dirty" ] && [ "${BENCH_DIRTY:-}" != 1 ]; then
    echo "bench: the tree has uncommitted changes; figures must come from a commit. Commit them, or run with BENCH_DIRTY=1 to see figures without recording them:" >&2
    echo "$dirty" >&2
    exit 2
fi
# The commit the figures come from (`describe --dirty` would also count the results
# themselves, which the check above leaves out).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
[ -n "$dirty" ] && commit="$commit-dirty"
max_load=${BENCH_MAX_LOAD:-$(awk -v c="$(nproc)" 'BEGIN {print c / 2}')}
load1() { cut -d' ' -f1 /proc/loadavg; }
above() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a > b)}'; }

mkdir -p bench/results
started=$(date +%s)
for bench in "${BENCHES[@]}"; do
    # Wait for a quiet machine (the previous section's processes, other work), a while.
    waited=0
    while above "$(load1)" "$max_load" && [ "$waited" -lt 180 ]; do
        [ "$waited" = 0 ] && echo "bench: load average $(load1) above $max_load; waiting up to 3 min before $bench" >&2
        sleep 10
        waited=$((waited + 10))
    done
    before=$(load1)
    echo "== cargo bench --bench $bench (load average $before)" >&2
    # The load during the section, sampled every 5 s until it ends.
    samples=$(mktemp)
    (while sleep 5; do load1 >>"$samples"; done) &
    sampler=$!
    began=$(date +%s)
    if [ -n "$dirty" ]; then
        status=0
        cargo bench --bench "$bench" || status=$?
        kill "$sampler" 2>/dev/null || true
        rm -f "$samples"
        [ "$status" = 0 ] || exit "$status"
        echo "bench: $bench not recorded (BENCH_DIRTY=1, tree at $commit)" >&2
        continue
    fi
    # Into a temp file first: a bench that fails leaves its last good section in place.
    status=0
    cargo bench --bench "$bench" >"bench/results/$bench.md.new" || status=$?
    kill "$sampler" 2>/dev/null || true
    during=$(awk '{s += $1; if ($1 > m) m = $1} END {if (NR) printf "mean %.2f, max %.2f", s / NR, m; else print "not sampled"}' "$samples")
    rm -f "$samples"
    [ "$status" = 0 ] || exit "$status"
    mv "bench/results/$bench.md.new" "bench/results/$bench.md"
    disturbed=""
    if above "$before" "$max_load"; then
        disturbed=" — **disturbed**: load average $before at its start, above $max_load"
    fi
    # When and on what each section was measured (sections may come from different runs).
    stamp="$bench: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, load average before $before, during $during, $(($(date +%s) - began)) s$disturbed"
    echo "$stamp" >"bench/results/$bench.stamp"
    {
        echo "- $stamp"
        sed -n 's/^<!-- summary: \(.*\) -->$/  | \1 |/p' "bench/results/$bench.md"
    } >>bench/results/log.md
done
[ -n "$dirty" ] && exit 0
elapsed=$(($(date +%s) - started))

cores=$(nproc)
model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
ram=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1024 / 1024}' /proc/meminfo)
tansu=$(scripts/tansu.sh path)

{
    echo "# watchbridge benchmarks"
    echo
    echo "- command: \`make bench\` (\`scripts/bench.sh\`; the last invocation ran ${BENCHES[*]} in ${elapsed} s)"
    echo "- machine: $cores cores, $model, $ram"
    echo "- versions: $(rustc -V), $("$tansu" --version 2>/dev/null || echo tansu)"
    echo "- sections measured (bench: date, commit, machine load average before and during, time taken; every earlier run in [results/log.md](results/log.md)):"
    for bench in "${ALL[@]}"; do
        [ -f "bench/results/$bench.stamp" ] && echo "  - $(cat "bench/results/$bench.stamp")"
    done
    echo
    echo "Each figure is a ratio or a rate measured within one run of its bench, over runs that"
    echo "alternate the cases compared, with a 95% interval where the bench says one (else the"
    echo "median and the range of its runs); the sections below say how. These machines are"
    echo "small and shared: a section that began with the load average above ${max_load} is"
    echo "marked disturbed, its rows too, and a section's CPU table shows other work busy."
    echo
    echo "## Summary"
    echo
    echo "| figure | measured | target | |"
    echo "|---|---|---|---|"
    for bench in "${ALL[@]}"; do
        [ -f "bench/results/$bench.md" ] || continue
        # A disturbed section's rows say so in their verdict column.
        if grep -q 'disturbed' "bench/results/$bench.stamp" 2>/dev/null; then
            sed -n 's/^<!-- summary: \(.*\) -->$/| \1 (disturbed) |/p' "bench/results/$bench.md"
        else
            sed -n 's/^<!-- summary: \(.*\) -->$/| \1 |/p' "bench/results/$bench.md"
        fi
    done
    for bench in "${ALL[@]}"; do
        [ -f "bench/results/$bench.md" ] || continue
        echo
        # Sections start at level 2; the summary lines are already in the table above.
        grep -v '^<!-- summary:' "bench/results/$bench.md"
    done
} >bench/RESULTS.md

# The summary table, to the terminal.
awk '/^## Summary/ {on = 1} on && /^\|/ {print; seen = 1; next} seen {exit}' bench/RESULTS.md
echo "written to bench/RESULTS.md (sections in bench/results/)" >&2
