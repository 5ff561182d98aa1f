#!/usr/bin/env bash
# Load runs of the decision service against the do-nothing floor, in one run
# on this machine. Loopback only; every process started here is stopped here.
#
#   bash bench/rls.sh [seconds-per-run]      (default 10)
#   CS="64" KS="10000" bash bench/rls.sh 6   (only these callers and keys)
#
# Prints one JSON line per run and a Markdown table at the end. Runs: the
# floor, Sluice with the memory store and Sluice with Redis (a redis-server
# started on a free port), each at C = 1, 16, 64 callers and K = 1, 10000 keys.
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

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
waitport() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

results="$tmp/results.jsonl"
load() { # name port pid
	for c in ${CS:-1 16 64}; do
		for k in ${KS:-1 10000}; do
			"$tmp/rlsload" -addr "127.0.0.1:$2" -c "$c" -k "$k" -d "${DUR}s" -pid "$3" -name "$1" -json | tee -a "$results"
		done
	done
}

port=$(freeport)
"$tmp/floor" -addr "127.0.0.1:$port" >/dev/null & pids+=($!)
waitport "$port"
load floor "$port" "${pids[-1]}"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

gport=$(freeport); hport=$(freeport)
"$tmp/sluice" serve --rules bench/rules --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" >"$tmp/mem.log" 2>&1 & pids+=($!)
waitport "$gport"
load sluice-memory "$gport" "${pids[-1]}"
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

if command -v redis-server >/dev/null; then
	rport=$(freeport)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null & pids+=($!)
	waitport "$rport"
	gport=$(freeport); hport=$(freeport)
	"$tmp/sluice" serve --rules bench/rules --store redis --redis-addr "127.0.0.1:$rport" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" >"$tmp/redis.log" 2>&1 & pids+=($!)
	waitport "$gport"
	load sluice-redis "$gport" "${pids[-1]}"
fi

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
floor = {(r["callers"], r["keys"]): r for r in rows if r["name"] == "floor"}
print("\n| system | C | K | req/s | vs floor | p50 µs | p99 µs | p99.9 µs | server CPU µs/req | CPU vs floor |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    f = floor.get((r["callers"], r["keys"]))
    ratio = r["rps"] / f["rps"] if f else 0
    cpu = r.get("server_cpu_us_per_request", 0)
    fcpu = f.get("server_cpu_us_per_request", 0) if f else 0
    print(f'| {r["name"]} | {r["callers"]} | {r["keys"]} | {r["rps"]:.0f} | {ratio:.2f} | {r["p50_us"]:.0f} | {r["p99_us"]:.0f} | {r["p999_us"]:.0f} | {cpu:.1f} | {cpu / fcpu if fcpu else 0:.2f} |')
PY
