#!/usr/bin/env bash
# Placement benchmarks (issue 3): trace quality over seeds 42-51 for both
# Alibaba task files, and engine throughput on 1k/10k/100k synthetic nodes.
# Raw `go test -bench` output goes to placement/bench-results/; the figures
# are summarised by hand in placement/BENCHMARKS.md.
# Single-core numbers: GOMAXPROCS=1 (the engine is single-threaded anyway).
set -euo pipefail
cd "$(dirname "$0")/.."
out=placement/bench-results
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
export GOMAXPROCS=1
{
  echo "# $(go version) $(uname -sm) nproc=$(nproc) commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)"
  APIARY_BENCH_SEEDS="${APIARY_BENCH_SEEDS:-42-51}" \
    go test ./placement/sim -run '^$' -bench 'Quality|SharePacking' -benchtime 1x -timeout 60m
} | tee "$out/quality-$stamp.txt"
{
  echo "# $(go version) $(uname -sm) nproc=$(nproc) commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)"
  go test ./placement -run '^$' -bench 'Throughput|SmallBatch' -benchtime "${APIARY_BENCH_TIME:-10x}" -count "${APIARY_BENCH_COUNT:-5}" -timeout 60m
} | tee "$out/throughput-$stamp.txt"
