#!/usr/bin/env bash
# make demo: start a local federation with `apiary dev` (a global router and
# two regions, eu-west/eu and us-east/us, each one coordinator with embedded
# etcd and two agents, all real processes on loopback, joined in a serf WAN
# pool), run the examples through the global router, replay the first 300
# pods of the Alibaba GPU trace as real `sleep` jobs, print a summary, stop.
# make demo-tls (DEMO_TLS=1) runs the same with `apiary dev --tls`: mutual TLS
# on every process and etcd, the CLI with the client certificate; ACLs on in
# every region, the CLI with the management token apiary dev bootstrapped.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/apiary}
TRACE=${TRACE:-../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv}
work=$(mktemp -d -t apiary-demo-XXXX)
ready="$work/ready.json"
devflags=()
[ "${DEMO_TLS:-0}" = 1 ] && devflags=(--tls)
"$BIN" dev ${devflags[@]+"${devflags[@]}"} --data-dir "$work/data" --ready-file "$ready" >"$work/dev.log" 2>&1 &
dev=$!
cleanup() {
  kill -TERM "$dev" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

for _ in $(seq 1 900); do
  [ -s "$ready" ] && break
  kill -0 "$dev" 2>/dev/null || { echo "apiary dev exited:"; cat "$work/dev.log"; exit 3; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "apiary dev not ready after 90 s:"; cat "$work/dev.log"; exit 3; }
cat "$work/dev.log"
global=$(sed -n 's/.*"global_addr": "\([^"]*\)".*/\1/p' "$ready")
eu=$(sed -n '/"eu-west"/{n;s/.*"addr": "\([^"]*\)".*/\1/p}' "$ready")
us=$(sed -n '/"us-east"/{n;s/.*"addr": "\([^"]*\)".*/\1/p}' "$ready")
# Each dev agent's share of this host; the replay scales pods to it.
agent_cpu=$(sed -n 's/.*"agent_cpu_millis": \([0-9]*\).*/\1/p' "$ready")
agent_mem=$(sed -n 's/.*"agent_memory_mb": \([0-9]*\).*/\1/p' "$ready")
export APIARY_ADDR=$global
if [ "${DEMO_TLS:-0}" = 1 ]; then
  # The client certificate apiary dev --tls made (its ready file names it).
  APIARY_CACERT=$(sed -n 's/.*"ca": "\([^"]*\)".*/\1/p' "$ready")
  APIARY_CLIENT_CERT=$(sed -n 's/.*"cert": "\([^"]*\)".*/\1/p' "$ready")
  APIARY_CLIENT_KEY=$(sed -n 's/.*"key": "\([^"]*\)".*/\1/p' "$ready")
  export APIARY_CACERT APIARY_CLIENT_CERT APIARY_CLIENT_KEY
  echo
  echo "== mutual TLS: without the client certificate the router refuses the CLI"
  set +e
  out=$(env -u APIARY_CACERT -u APIARY_CLIENT_CERT -u APIARY_CLIENT_KEY "$BIN" job list 2>&1)
  code=$?
  set -e
  echo "   $out"
  if [ "$code" != 3 ]; then echo "   -> exit $code, expected 3"; exit 1; fi
  # ACLs: the management token apiary dev bootstrapped (its ready file names
  # the file that holds it).
  token_file=$(sed -n 's/.*"acl_token_file": "\([^"]*\)".*/\1/p' "$ready")
  [ -s "$token_file" ] || { echo "apiary dev --tls wrote no management token (acl_token_file in $ready)"; exit 1; }
  echo
  echo "== ACLs: with the certificate but without a token the regions refuse the CLI (through the router)"
  set +e
  out=$(env -u APIARY_TOKEN "$BIN" job list 2>&1)
  code=$?
  set -e
  echo "$out" | sed 's/^/   /'
  if [ "$code" != 2 ] || ! echo "$out" | grep -q "APIARY_TOKEN"; then echo "   -> exit $code, expected 2 with the APIARY_TOKEN hint"; exit 1; fi
  APIARY_TOKEN=$(cat "$token_file")
  export APIARY_TOKEN
  echo
  echo "== ACLs: the management token (apiary acl token self)"
  "$BIN" acl token self
fi
echo
echo "== regions, as the global router at $global sees them (serf WAN pool)"
"$BIN" region list
echo
echo "== nodes of eu-west"
"$BIN" node list --addr "$eu"

pass=0; fail=0
run() { # run NAME FILE EXPECTED_EXIT [REGION_EXPECTED] [ADDR]
  local name=$1 file=$2 want=$3 region=${4:-} addr=${5:-$global} out code
  echo
  echo "== $name: apiary job run $file --wait  (via $addr)"
  set +e
  out=$("$BIN" job run "$file" --wait --addr "$addr" 2>&1)
  code=$?
  set -e
  echo "$out" | sed 's/^/   /' | tail -n 25
  if [ "$code" != "$want" ]; then
    echo "   -> exit $code, expected $want"; fail=$((fail+1)); return
  fi
  if [ -n "$region" ] && ! echo "$out" | grep -Eq "^Region: +$region "; then
    echo "   -> exit $code, but not in region $region"; fail=$((fail+1)); return
  fi
  echo "   -> exit $code (as expected)${region:+, ran in $region}"; pass=$((pass+1))
}
run "hello"                         examples/hello.yaml 0
run "20-way fan-out"                examples/fanout.yaml 0
run "retry then succeed"            examples/retry.yaml 0
run "constraints"                   examples/constrained.yaml 0
run "eu personal data -> eu-west"   examples/eu-pinned.yaml 0 eu-west
run "us personal data -> us-east"   examples/us-only.yaml 0 us-east
run "restricted data: no region may run it" examples/restricted.yaml 2
run "direct to us-east, eu data: the region re-checks the policy" examples/eu-pinned.yaml 2 "" "$us"

echo
echo "== jobs in every region (ListJobs fans out through the router)"
"$BIN" job list

echo
echo "== replay: first 300 pods of $TRACE through the global router"
if [ -f "$TRACE" ]; then
  "$BIN" demo-replay --trace "$TRACE" --n 300 --span 45s --wait-limit 80s \
    --agent-cpu-millis "$agent_cpu" --agent-memory-mb "$agent_mem" || fail=$((fail+1))
  echo
  "$BIN" region list
else
  echo "   trace file not found; skipped"
fi
echo
echo "demo: $pass as expected, $fail not"
[ "$fail" = 0 ]
