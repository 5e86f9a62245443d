#!/bin/sh
# Makes the compose federation's CA, certificates and gossip key in
# deploy/compose/tls/NET_PREFIX/, the directory docker-compose.yml mounts
# for that APIARY_NET_PREFIX. Run by `make compose-up` with the host's
# apiary binary, as an operator would on an admin machine: the CA key never
# enters a container.
#
# usage: certs.sh APIARY_BINARY [NET_PREFIX]   (NET_PREFIX default 10.97)
#
# The coordinators' certificates carry IP SANs made from NET_PREFIX, so each
# prefix has a directory of its own: a second copy of the federation on
# another prefix (APIARY_NET_PREFIX, with COMPOSE_PROJECT) never mounts the
# first copy's certificates. Idempotent: a certificate is kept while the
# arguments it was made with (recorded beside it in .args/) are the ones
# below, and made again when they differ (or when the CA is new); the CA and
# the gossip key are kept once made. Prints the directory.
set -eu
apiary=$1
p=${2:-10.97}
case $p in
  *[!0-9.]* | *..* | .* | *. | *.*.*) ok=no ;;
  *.*) ok=yes ;;
  *) ok=no ;;
esac
for o in $(echo "$p" | tr . ' '); do
  [ "$o" -le 255 ] 2>/dev/null || ok=no
done
if [ "$ok" != yes ]; then
  echo "certs.sh: NET_PREFIX $p: must be the first two octets of an IPv4 address, e.g. 10.97 (APIARY_NET_PREFIX)" >&2
  exit 2
fi
dir=$(dirname "$0")/tls/$p
mkdir -p "$dir/.args"
chmod 0700 "$(dirname "$0")/tls" "$dir" "$dir/.args"
if [ ! -f "$dir/apiary-ca.pem" ]; then
  # A new CA: whatever certificates are here were signed by another one.
  rm -f "$dir"/*.pem "$dir"/.args/*
  "$apiary" tls ca create --dir "$dir" >/dev/null
fi
cert() { # file-stem, then the create flags
  stem=$1; shift
  args="$*"
  if [ -f "$dir/$stem.pem" ] && [ -f "$dir/.args/$stem" ] && [ "$(cat "$dir/.args/$stem")" = "$args" ]; then
    return 0
  fi
  rm -f "$dir/$stem.pem" "$dir/$stem-key.pem"
  # Quiet (apiary tls warns about every server certificate), but not on
  # failure.
  if ! out=$("$apiary" tls cert create --dir "$dir" "$@" 2>&1 >/dev/null); then
    echo "certs.sh: $stem: $out" >&2
    exit 1
  fi
  printf '%s\n' "$args" >"$dir/.args/$stem"
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
