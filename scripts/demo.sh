#!/usr/bin/env bash
# make demo: start a local federation with `apiary dev` (two regions, each one
# coordinator with embedded etcd and two agents, all real processes on
# loopback), run the examples, print what happened, and stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/apiary}
work=$(mktemp -d -t apiary-demo-XXXX)
ready="$work/ready.json"
"$BIN" dev --data-dir "$work/data" --ready-file "$ready" >"$work/dev.log" 2>&1 &
dev=$!
cleanup() {
  kill -TERM "$dev" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

for _ in $(seq 1 600); do
  [ -s "$ready" ] && break
  kill -0 "$dev" 2>/dev/null || { echo "apiary dev exited:"; cat "$work/dev.log"; exit 3; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "apiary dev not ready after 60 s:"; cat "$work/dev.log"; exit 3; }
cat "$work/dev.log"
eu=$(sed -n '/"eu-west"/{n;s/.*"addr": "\([^"]*\)".*/\1/p}' "$ready")
us=$(sed -n '/"us-east"/{n;s/.*"addr": "\([^"]*\)".*/\1/p}' "$ready")
echo
echo "== nodes of eu-west"
"$BIN" node list --addr "$eu"

pass=0; fail=0
run() { # run NAME ADDR FILE EXPECTED_EXIT
  local name=$1 addr=$2 file=$3 want=$4 out code
  echo
  echo "== $name: apiary job run $file --wait  (region at $addr)"
  set +e
  out=$("$BIN" job run "$file" --wait --addr "$addr" 2>&1)
  code=$?
  set -e
  echo "$out" | sed 's/^/   /' | tail -n 25
  if [ "$code" = "$want" ]; then
    echo "   -> exit $code (as expected)"; pass=$((pass+1))
  else
    echo "   -> exit $code, expected $want"; fail=$((fail+1))
  fi
}
run "hello"               "$eu" examples/hello.yaml 0
run "20-way fan-out"      "$eu" examples/fanout.yaml 0
run "retry then succeed"  "$eu" examples/retry.yaml 0
run "constraints"         "$eu" examples/constrained.yaml 0
run "eu data in eu-west"  "$eu" examples/eu-pinned.yaml 0
run "eu data refused by us-east" "$us" examples/eu-pinned.yaml 2

echo
echo "== jobs in eu-west"
"$BIN" job list --addr "$eu"
echo
echo "demo: $pass as expected, $fail not"
[ "$fail" = 0 ]
