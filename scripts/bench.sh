#!/usr/bin/env bash
# `make bench` (after `make build`): the regional benchmarks of issue 2
# (drain, submit, failover) against real `apiary` subprocesses on loopback,
# then the placement benchmark if scripts/bench-placement.sh exists.
# Results: loadtest/results/regional-<date>/ (CSV per trial + summary.md).
# Environment: APIARY_BIN (default bin/apiary), BENCH_OUT, BENCH_ARGS (extra
# flags for apiary-bench, e.g. "-only failover -failover-trials 5").
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${APIARY_BIN:-bin/apiary}"
OUT="${BENCH_OUT:-loadtest/results/regional-$(date +%Y-%m-%d)}"
if [ ! -x "$BIN" ]; then
	CGO_ENABLED=0 go build -o "$BIN" ./cmd/apiary
fi
rc=0
# shellcheck disable=SC2086
go run ./loadtest/bench/cmd/apiary-bench -bin "$BIN" -out "$OUT" ${BENCH_ARGS:-} || rc=$?
if [ -f scripts/bench-placement.sh ]; then
	bash scripts/bench-placement.sh || rc=$?
fi
exit $rc
