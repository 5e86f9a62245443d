#!/bin/sh
# Waits until every container of compose project $1 is healthy (at most $2
# seconds, default 180); on timeout prints each container's state and the
# last log lines of the unhealthy ones, and exits 1.
set -u
project=$1
limit=${2:-180}
file=$(dirname "$0")/docker-compose.yml
end=$(( $(date +%s) + limit ))
while :; do
  ids=$(docker-compose -p "$project" -f "$file" ps -q)
  bad=""
  for id in $ids; do
    st=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id")
    [ "$st" = healthy ] || bad="$bad $id"
  done
  if [ -n "$ids" ] && [ -z "$bad" ]; then
    echo "all $(echo $ids | wc -w) containers of $project are healthy"
    exit 0
  fi
  if [ "$(date +%s)" -ge "$end" ]; then
    echo "not healthy after ${limit}s:" >&2
    for id in $bad; do
      docker inspect -f '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id" >&2
      docker logs --tail 15 "$id" >&2 2>&1
    done
    exit 1
  fi
  sleep 2
done
