#!/usr/bin/env bash
# `make bench` (after `make build`): the regional benchmarks of issue 2
# (drain, submit, failover) and of issue 20's serf LAN pool (agentfail,
# serfcpu, ownerdetect) against real `apiary` subprocesses on loopback,
# then the load-test suite (issue 5), then the placement benchmark if
# scripts/bench-placement.sh exists. LT_TRIALS sets the failover trials.
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
# Issue 5's standard suite: steady open-loop load, a rate sweep on a
# 3-coordinator region, and each failover scenario (apiary loadtest writes
# loadtest/results/<timestamp>-<scenario>/ per run).
LT_RESULTS="${LT_RESULTS:-loadtest/results}"
LT_TRIALS="${LT_TRIALS:-20}"
"$BIN" loadtest run --rate 200 --duration 20s --results-dir "$LT_RESULTS" || rc=$?
for rate in 250 500 1000 1500 2000; do
	"$BIN" loadtest run --coordinators 3 --rate "$rate" --duration 10s --task-sleep 50ms --agents 4 --slots 64 --results-dir "$LT_RESULTS" || rc=$?
done
for sc in kill-scheduler kill-agent; do
	"$BIN" loadtest failover --scenario "$sc" --trials "$LT_TRIALS" --rate 50 --results-dir "$LT_RESULTS" || rc=$?
done
for sc in pause-scheduler pause-agent kill-region; do
	"$BIN" loadtest failover --scenario "$sc" --trials 5 --rate 50 --results-dir "$LT_RESULTS" || rc=$?
done
# Issue 20's liveness scenarios (partition-agent, outage-region 20 s).
LIVENESS_PARTITION_TRIALS="${LIVENESS_PARTITION_TRIALS:-10}" LIVENESS_OUTAGE_TRIALS="${LIVENESS_OUTAGE_TRIALS:-5}" \
	APIARY_BIN="$BIN" LT_RESULTS="$LT_RESULTS" bash scripts/loadtest-liveness.sh || rc=$?
if [ -f scripts/bench-placement.sh ]; then
	bash scripts/bench-placement.sh || rc=$?
fi
# Issue 16's control-plane scale measures (make bench-scale; hours at the
# default 1M task records: SCALE_ARGS="-million-top 100000" shortens it).
# shellcheck disable=SC2086
go run ./loadtest/bench/cmd/apiary-bench -bin "$BIN" -out "loadtest/results/scale-$(date +%Y-%m-%d)" \
	-only throughput,fleet10k,million,drain-noop ${SCALE_ARGS:-} || rc=$?
exit $rc
