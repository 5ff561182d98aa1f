#!/usr/bin/env bash
# Load runs of the decision service against the do-nothing floor, in one run
# on this machine. Loopback only; every process started here is stopped here.
#
#   bash bench/rls.sh [seconds-per-run]      (default 10)
#   CS="64" KS="10000" bash bench/rls.sh 6   (only these callers and keys)
#   ROUNDS=5 CS=64 KS=10000 bash bench/rls.sh 8   (5 rounds; medians)
#   ALSO="b=/tmp/sluice-b" ROUNDS=3 CS=64 KS=10000 bash bench/rls.sh 6
#       (A/B: also run another sluice binary, on Redis, as "b-redis")
#   ALSOMEM="b=/tmp/sluice-b" NOREDIS=1 ROUNDS=3 CS=64 KS=10000 bash bench/rls.sh 6
#       (A/B on the memory store, as "b-memory"; NOREDIS=1 leaves Redis out)
#   COUNTING="batched approximate" ROUNDS=3 CS=64 KS="1 10000" bash bench/rls.sh 6
#       (also Sluice on Redis with bench/rules-MODE, as "sluice-redis-MODE")
#   SERVEFLAGS="--overload-off" ...   (extra flags for every sluice serve)
#   HTTP=1 ...   (POST /v1/check over HTTP/1.1 instead of gRPC, against the
#       floor's do-nothing HTTP handler)
#   FLOORCODEC=1 ...   (also the floor built with serve's codec, "floor-codec")
#   FLOORGOGC=400 ...   (also the floor with serve's garbage collector
#       setting, GOGC=400, as "floor-gogc400")
#   DOMAINS="bench bench-over" ...   (also the over-limit rules: every
#       request after a key's first is answered OVER_LIMIT; default "bench")
#
# Starts the floor, Sluice with the memory store and Sluice with Redis (on a
# redis-server started on a free port), then runs each case (C = 1, 16, 64
# callers, K = 1, 10000 keys) on the three in turn, ROUNDS times over (1 by
# default), so that the three see the same machine. Prints one JSON line per
# run and a Markdown table at the end: medians over the rounds, with the
# range of requests/s when there are several. "vs memory" is the median over
# the rounds of each round's requests/s against sluice-memory's in that
# round; "Redis reads/s" is the redis-server's read system calls per second,
# about the round trips of the one sluice process on it (never fewer).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/sluice" ./cmd/sluice
go build -o "$tmp/floor" ./bench/floor
go build -o "$tmp/rlsload" ./bench/rlsload

. bench/lib.sh

# systems: name gRPC-port server-pid store-pid HTTP-port
systems=()
port=$(freeport); fhport=$(freeport)
"$tmp/floor" -addr "127.0.0.1:$port" -http "127.0.0.1:$fhport" >/dev/null & pids+=($!)
systems+=("floor $port $! 0 $fhport")
if [ -n "${FLOORCODEC:-}" ]; then
	port=$(freeport)
	"$tmp/floor" -codec -addr "127.0.0.1:$port" >/dev/null & pids+=($!)
	systems+=("floor-codec $port $! 0 0")
fi
if [ -n "${FLOORGOGC:-}" ]; then
	port=$(freeport); fhport=$(freeport)
	GOGC=$FLOORGOGC "$tmp/floor" -addr "127.0.0.1:$port" -http "127.0.0.1:$fhport" >/dev/null & pids+=($!)
	systems+=("floor-gogc$FLOORGOGC $port $! 0 $fhport")
fi

gport=$(freeport); hport=$(freeport)
"$tmp/sluice" serve --rules bench/rules --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" ${SERVEFLAGS:-} >"$tmp/mem.log" 2>&1 & pids+=($!)
systems+=("sluice-memory $gport $! 0 $hport")
for a in ${ALSOMEM:-}; do
	gport=$(freeport); hport=$(freeport)
	"${a#*=}" serve --rules bench/rules --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" ${SERVEFLAGS:-} >"$tmp/${a%%=*}-mem.log" 2>&1 & pids+=($!)
	systems+=("${a%%=*}-memory $gport $! 0 $hport")
done

# onredis NAME BINARY [RULES]: BINARY serves the bench rules (or those of
# the directory RULES) on a redis-server of its own, as system NAME.
onredis() {
	local rport rpid gport hport
	rport=$(freeport)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null & pids+=($!)
	rpid=$!
	waitport "$rport"
	gport=$(freeport); hport=$(freeport)
	"$2" serve --rules "${3:-bench/rules}" --store redis --redis-addr "127.0.0.1:$rport" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" ${SERVEFLAGS:-} >"$tmp/$1.log" 2>&1 & pids+=($!)
	systems+=("$1 $gport $! $rpid $hport")
}
if [ -z "${NOREDIS:-}" ] && command -v redis-server >/dev/null; then
	onredis sluice-redis "$tmp/sluice"
	for a in ${ALSO:-}; do
		onredis "${a%%=*}-redis" "${a#*=}"
	done
	for m in ${COUNTING:-}; do
		onredis "sluice-redis-$m" "$tmp/sluice" "bench/rules-$m"
	done
fi
for s in "${systems[@]}"; do
	set -- $s
	waitport "$2"
done

results="$tmp/results.jsonl"
for _ in $(seq "${ROUNDS:-1}"); do
	for c in ${CS:-1 16 64}; do
		for k in ${KS:-1 10000}; do
			for d in ${DOMAINS:-bench}; do
				for s in "${systems[@]}"; do
					set -- $s
					port=$2 http=()
					if [ -n "${HTTP:-}" ]; then
						[ "$5" = 0 ] && continue
						port=$5 http=(-http)
					fi
					"$tmp/rlsload" "${http[@]}" -addr "127.0.0.1:$port" -c "$c" -k "$k" -domain "$d" -d "${DUR}s" -pid "$3" -store-pid "$4" -name "$1" -json | tee -a "$results"
				done
			done
		done
	done
done

python3 bench/rlstable.py "$results"
