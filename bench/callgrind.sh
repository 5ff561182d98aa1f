#!/usr/bin/env bash
# Instructions per decision over gRPC, counted by valgrind's callgrind: the
# same count for the same binary and requests whatever else the machine is
# doing, where requests/s on a shared machine swing by 10 %. Loopback only;
# every process started here is stopped here.
#
#   bash bench/callgrind.sh                 (C=16 callers, K=1000 keys)
#   C=64 K=1 N1=2000 N2=8000 bash bench/callgrind.sh
#   ALSO="main=/tmp/sluice-main" bash bench/callgrind.sh   (another sluice binary too)
#   DOMAIN=bench-over bash bench/callgrind.sh   (the over-limit rules)
#   HTTP=1 bash bench/callgrind.sh   (POST /v1/check against the floor's
#       do-nothing HTTP handler, instead of gRPC; no floor -codec)
#
# Each server runs under callgrind (GODEBUG=asyncpreemptoff=1 and no
# signals to it: callgrind trips over Go's signal handling, so the counts
# are taken with callgrind_control and the server is stopped with SIGKILL),
# with GOMAXPROCS=1: callgrind runs one thread at a time anyway, and with a
# second P the Go scheduler's spinning threads (looking for work while the
# other holds callgrind's lock) made a run's count up to 4× another's, more
# the busier the machine was.
# bench/rlsload sends it a warm-up of up to 2,000 requests and N1
# requests, the counts are dumped, then again with N2; the difference of
# the two dumps over N2 − N1 is what one request costs the server, start-up,
# connection set-up and warm-up cancelled out. Servers: the do-nothing
# floor with gRPC's default codec, the floor with serve's codec (-codec),
# and sluice serve on the memory store with the bench rules and
# --overload-off (under callgrind every latency is some fifty times what it
# is at full speed, and the overload guard would shed). Under
# callgrind everything runs on one thread about fifty times slower, so
# gRPC batches its writes differently than at full speed: compare the
# servers with each other, not with a profile of a real run. Callgrind
# counts the process's own instructions, not the kernel's: the sockets'
# system calls, the same for every server, are not in the counts.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-16}
K=${K:-1000}
DOMAIN=${DOMAIN:-bench}
N1=${N1:-2000}
N2=${N2:-6000}
tmp=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }

CGO_ENABLED=0 go build -o "$tmp/sluice" ./cmd/sluice
CGO_ENABLED=0 go build -o "$tmp/floor" ./bench/floor
go build -o "$tmp/rlsload" ./bench/rlsload

. bench/lib.sh

# run NAME CMD...: runs CMD (a server whose port under test, gRPC or
# HTTP, is written PORT) under callgrind and prints its row.
http=()
[ -n "${HTTP:-}" ] && http=(-http)
run() {
	local name=$1 out="$tmp/cg.out" port a b
	shift
	port=$(freeport)
	rm -f "$out"*
	GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out" "${@//PORT/$port}" >"$tmp/server.log" 2>&1 &
	pid=$!
	waitport "$port" 60 # under callgrind a server starts some fifty times slower
	callgrind_control -z "$pid" >/dev/null 2>&1
	"$tmp/rlsload" "${http[@]}" -addr "127.0.0.1:$port" -c "$C" -k "$K" -domain "$DOMAIN" -n "$N1" >/dev/null
	callgrind_control -d "$pid" >/dev/null 2>&1
	"$tmp/rlsload" "${http[@]}" -addr "127.0.0.1:$port" -c "$C" -k "$K" -domain "$DOMAIN" -n "$N2" >/dev/null
	callgrind_control -d "$pid" >/dev/null 2>&1
	kill -9 "$pid"
	wait "$pid" 2>/dev/null || true
	pid=
	a=$(awk '/^summary:/ {print $2}' "$out.1")
	b=$(awk '/^summary:/ {print $2}' "$out.2")
	printf '| %s | %s | %s | %.0f |\n' "$name" "$a" "$b" "$(echo "($b - $a) / ($N2 - $N1)" | bc -l)"
}

echo "C=$C K=$K DOMAIN=$DOMAIN N1=$N1 N2=$N2${HTTP:+ HTTP}"
echo "| server | instructions, warm-up + N1 | warm-up + N2 | per request |"
echo "| --- | ---: | ---: | ---: |"
if [ -n "${HTTP:-}" ]; then
	run "floor -http" "$tmp/floor" -addr 127.0.0.1:0 -http 127.0.0.1:PORT
	serve=(--grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:PORT)
else
	run floor "$tmp/floor" -addr 127.0.0.1:PORT
	run "floor -codec" "$tmp/floor" -codec -addr 127.0.0.1:PORT
	serve=(--grpc-addr 127.0.0.1:PORT --http-addr 127.0.0.1:0)
fi
run "sluice serve (memory)" "$tmp/sluice" serve --rules bench/rules "${serve[@]}" --overload-off
for a in ${ALSO:-}; do
	run "${a%%=*} (memory)" "${a#*=}" serve --rules bench/rules "${serve[@]}" --overload-off
done
