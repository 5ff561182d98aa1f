#!/usr/bin/env bash
# Strict and batched counting through sluice serve on two saturated keys
# (bench/RESULTS.md §22): one GCRA rule of 1,000 a second (burst 200) per
# key, counted strict or batched, on a redis-server of its own; rlsload's
# C callers (closed loop) ask the two keys in turn, far more than the rule
# allows. Prints rlsload's line per run: p50, p99, errors (a refusal of
# serve's overload guard under --shed-answer unavailable is one), and
# OVER_LIMIT answers. Loopback only; everything started here is stopped here.
#
#   bash bench/saturated.sh [seconds-per-run]     (default 5)
#   C=128 ROUNDS=3 bash bench/saturated.sh 5
#   ALSO=/tmp/sluice-old bash bench/saturated.sh  (also another binary, as "b")
#   ONLYALSO=1 ALSO=/tmp/sluice-old ...         (only that binary: one without --shed-answer)
#   SERVEFLAGS="--shed-answer unavailable" ...
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
. bench/lib.sh
go build -o "$tmp/sluice" ./cmd/sluice
go build -o "$tmp/rlsload" ./bench/rlsload
for mode in strict batched; do
	mkdir -p "$tmp/rules-$mode"
	cat >"$tmp/rules-$mode/sat.yaml" <<YAML
domain: sat
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 200, algorithm: gcra, counting: $mode}
YAML
done
rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null & pids+=($!)
waitport "$rport"
bins=("new=$tmp/sluice")
[ -n "${ONLYALSO:-}" ] && bins=()
[ -n "${ALSO:-}" ] && bins+=("b=$ALSO")
for round in $(seq "${ROUNDS:-1}"); do
	for b in "${bins[@]}"; do
		for mode in strict batched; do
			gport=$(freeport); hport=$(freeport)
			"${b#*=}" serve --rules "$tmp/rules-$mode" --store redis --redis-addr "127.0.0.1:$rport" \
				--redis-prefix "r$round${b%%=*}$mode:" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" ${SERVEFLAGS:-} >"$tmp/serve.log" 2>&1 &
			spid=$!
			waitport "$gport"
			"$tmp/rlsload" -addr "127.0.0.1:$gport" -c "${C:-64}" -k 2 -domain sat -d "${DUR}s" -pid "$spid" -name "${b%%=*}-$mode"
			kill "$spid"; wait "$spid" 2>/dev/null || true
		done
	done
done
