#!/usr/bin/env bash
# `make loadtest-liveness` (after `make build`): issue 20's liveness
# scenarios of `apiary loadtest failover`, with small trial counts, on real
# processes on loopback (about 4 minutes on 2 cores):
#   partition-agent: an agent's gRPC traffic cut for 3 s (lease 1 s) through
#     its --fault-file, then healed;
#   outage-region: every coordinator of a 3-coordinator region SIGKILLed for
#     20 s with the agents up, then restarted at once.
# Each run writes loadtest/results/<timestamp>-<scenario>/ (README.md with
# the figures and how they were taken, liveness.csv, result.json, ...) and
# exits 1 if the verifier found a violation.
# Environment: APIARY_BIN (default bin/apiary), LT_RESULTS (default
# loadtest/results), LIVENESS_PARTITION_TRIALS (default 3),
# LIVENESS_OUTAGE_TRIALS (default 2), LIVENESS_OUTAGE (default 20s).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${APIARY_BIN:-bin/apiary}"
OUT="${LT_RESULTS:-loadtest/results}"
if [ ! -x "$BIN" ]; then
	CGO_ENABLED=0 go build -o "$BIN" ./cmd/apiary
fi
rc=0
"$BIN" loadtest failover --scenario partition-agent --trials "${LIVENESS_PARTITION_TRIALS:-3}" --results-dir "$OUT" || rc=$?
"$BIN" loadtest failover --scenario outage-region --trials "${LIVENESS_OUTAGE_TRIALS:-2}" --outage "${LIVENESS_OUTAGE:-20s}" --results-dir "$OUT" || rc=$?
exit $rc
