#!/usr/bin/env bash
# `make bench`: every benchmark in release mode, one after the other (they would disturb
# each other's figures), each section written to bench/results/<bench>.md, then
# bench/RESULTS.md assembled from them: a header (machine, versions, command, date), one
# summary table of every target (the `<!-- summary: … -->` lines the benches print), and
# the sections. The summary table is printed at the end.
#
#   scripts/bench.sh                 all benches
#   scripts/bench.sh e2e vs_python   only these (the others' sections stay as they were)
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(engine scale restore recovery_cost e2e vs_python vs_java guarantee object_store)
if [ "$#" -gt 0 ]; then BENCHES=("$@"); else BENCHES=("${ALL[@]}"); fi

mkdir -p bench/results
started=$(date +%s)
for bench in "${BENCHES[@]}"; do
    echo "== cargo bench --bench $bench" >&2
    # Into a temp file first: a bench that fails leaves its last good section in place.
    began=$(date +%s)
    cargo bench --bench "$bench" >"bench/results/$bench.md.new"
    mv "bench/results/$bench.md.new" "bench/results/$bench.md"
    # When and on what each section was measured (sections may come from different runs).
    echo "$bench: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty 2>/dev/null || echo '?'), load average before $(cut -d' ' -f1 /proc/loadavg), $(($(date +%s) - began)) s" \
        >"bench/results/$bench.stamp"
done
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
    echo "- sections measured (bench: date, commit, machine load before, time taken):"
    for bench in "${ALL[@]}"; do
        [ -f "bench/results/$bench.stamp" ] && echo "  - $(cat "bench/results/$bench.stamp")"
    done
    echo
    echo "Each figure is a ratio or a rate measured within one run of its bench, median and"
    echo "spread over repeated runs where the bench repeats; the sections below say how. These"
    echo "machines are small and shared: a section whose CPU table shows other work busy was"
    echo "disturbed."
    echo
    echo "## Summary"
    echo
    echo "| figure | measured | target | |"
    echo "|---|---|---|---|"
    for bench in "${ALL[@]}"; do
        [ -f "bench/results/$bench.md" ] || continue
        sed -n 's/^<!-- summary: \(.*\) -->$/| \1 |/p' "bench/results/$bench.md"
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
