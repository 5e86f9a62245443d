#!/bin/sh
# Makes the compose federation's CA, certificates and gossip key in
# deploy/compose/tls/ (idempotent: files that exist are kept). Run by
# `make compose-up` with the host's apiary binary, as an operator would on
# an admin machine: the CA key never enters a container.
#
# usage: certs.sh APIARY_BINARY [NET_PREFIX]   (NET_PREFIX default 10.97)
set -eu
apiary=$1
p=${2:-10.97}
dir=$(dirname "$0")/tls
mkdir -p "$dir"
chmod 0700 "$dir"
[ -f "$dir/apiary-ca.pem" ] || "$apiary" tls ca create --dir "$dir" >/dev/null
cert() { # file-stem, then the create flags
  stem=$1; shift
  [ -f "$dir/$stem.pem" ] || "$apiary" tls cert create --dir "$dir" "$@" >/dev/null 2>&1
}
for i in 1 2 3; do
  cert eu-west-region-c$i --role region --region eu-west --id c$i --dns eu-west-$i --ip "$p.1.1$i" --ip "$p.0.1$i"
  cert us-east-region-c$i --role region --region us-east --id c$i --dns us-east-$i --ip "$p.2.1$i" --ip "$p.0.2$i"
done
for i in 1 2; do
  cert global-router-router-$i --role router --id router-$i --dns router-$i
  cert eu-west-agent-eu-west-n$i --role agent --region eu-west --id eu-west-n$i
  cert us-east-agent-us-east-n$i --role agent --region us-east --id us-east-n$i
done
cert global-client-cli --role client
[ -f "$dir/gossip.env" ] || echo "APIARY_GOSSIP_KEY=$("$apiary" keygen)" >"$dir/gossip.env"
# The containers run as root and read the files through a read-only bind
# mount; the host keeps them 0600/0700.
echo "$dir"
