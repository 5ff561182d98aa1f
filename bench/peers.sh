#!/usr/bin/env bash
# Sluice beside its peers on this machine, in the same rounds: gubernator
# (github.com/gubernator-io/gubernator/v2, its GLOBAL behaviour being its
# counterpart of approximate counting) and envoyproxy/ratelimit on Redis.
# A manual benchmark, not part of make test. Loopback only; every process
# started here is stopped here, by PID.
#
#   bash bench/peers.sh [seconds-per-run]     (default 6)
#   ROUNDS=3 C=64 K=10000 ACCDUR=5 bash bench/peers.sh 6
#   PEERS_GOPATH=/tmp/peers-gopath bash bench/peers.sh   (keep the peers'
#       module cache there between runs instead of a fresh one)
#   NOSLUICEACC=1 ...   (leave out Sluice's in-process accuracy test)
#   SYNCWAIT=25ms ...   (gubernator's GLOBAL sync interval, GlobalSyncWait;
#       by default gubernator's, 100 ms; Sluice reconciles every 25 ms)
#
# Their code is fetched through the Go module proxy only (GOPROXY without
# "direct", checked against the checksum database), into a GOPATH of its
# own, and nothing of it is kept in this repository:
#   - gubernator v2.13.0 is a dependency of bench/peers, a module of its
#     own (Sluice's go.mod gains nothing): "peers node" serves one
#     gubernator daemon with a static peer list, "peers load" is rlsload's
#     loop (bench/loadrun) over GetRateLimits, "peers accuracy" is
#     redisstore's TestCountingAccuracy in gubernator's terms;
#   - envoyproxy/ratelimit has no tagged release on the proxy (the script
#     prints "go list -m -versions"), so it is built at the pseudo-version
#     RATELIMIT_VERSION, by default the one the proxy resolves "latest" to
#     on 2026-12-04, with go install; if that fails, the script says so and
#     goes on without it. internal/faultnet's TestFaultRTTPeer builds the
#     same pseudo-version (its ratelimitVersion: change both together).
#
# Throughput: C callers, K keys, a limit no run reaches, DUR seconds per
# run, ROUNDS rounds, each round every system in turn: the do-nothing floor,
# sluice serve on the memory store and with bench/rules-approximate on a
# redis-server of its own, gubernator as one node and as a cluster of 4
# (calls spread over the nodes in turn, Behavior GLOBAL; CPU is the 4
# nodes' summed), and envoyproxy/ratelimit on a redis-server of its own.
# The table's last two columns are against sluice-redis-approximate in the
# same rounds. Then the accuracy of GLOBAL on the cluster (4 callers per node, one key,
# 1,000/s, offered 4×, ACCDUR seconds; even, skewed 90 % to a node that does
# not own the key, and skewed to the owner; LEAKY_BUCKET with burst 200 —
# Sluice's GCRA rule — and TOKEN_BUCKET, whose window holds the limit and
# takes no burst), with BATCHING beside it as the harness's check, and
# Sluice's own TestCountingAccuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-6}
C=${C:-64}
K=${K:-10000}
ACCDUR=${ACCDUR:-5}
RATELIMIT_VERSION=${RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	chmod -R u+w "$tmp" 2>/dev/null || true # the module cache is read-only
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "# $(date -u +%FT%TZ) $(uptime)"
go build -o "$tmp/sluice" ./cmd/sluice
go build -o "$tmp/floor" ./bench/floor
go build -o "$tmp/rlsload" ./bench/rlsload

# The peers' builds: the module proxy only, a GOPATH of their own.
peersenv=(env GOPATH="${PEERS_GOPATH:-$tmp/gopath}" GOPROXY=https://proxy.golang.org GOFLAGS=-buildvcs=false GOWORK=off GOTOOLCHAIN=local GOBIN="$tmp/bin")
(cd bench/peers && "${peersenv[@]}" go build -o "$tmp/peers" .)
echo "# gubernator: $(cd bench/peers && "${peersenv[@]}" go list -m -f '{{.Path}} {{.Version}}' github.com/gubernator-io/gubernator/v2)"
ratelimit=
echo "# go list -m -versions github.com/envoyproxy/ratelimit (no version: no tag): $(cd "$tmp" && "${peersenv[@]}" go list -m -versions github.com/envoyproxy/ratelimit 2>&1)"
echo "# go list -m github.com/envoyproxy/ratelimit@latest: $(cd "$tmp" && "${peersenv[@]}" go list -m github.com/envoyproxy/ratelimit@latest 2>&1)"
if (cd "$tmp" && "${peersenv[@]}" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$RATELIMIT_VERSION") >"$tmp/ratelimit-build.log" 2>&1; then
	ratelimit="$tmp/bin/service_cmd"
	echo "# envoyproxy/ratelimit $RATELIMIT_VERSION built"
else
	echo "# envoyproxy/ratelimit $RATELIMIT_VERSION did not build from the module proxy; left out:"
	grep -v '^go: downloading' "$tmp/ratelimit-build.log" | sed 's/^/#   /'
fi

. bench/lib.sh
redis() { # redis: starts a redis-server on a free port; sets rport, rpid
	rport=$(freeport)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null & pids+=($!)
	rpid=$!
	waitport "$rport"
}

# systems: name kind address(es) server-pid(s) store-pid; kind rls is
# driven by rlsload, kind guber by peers load.
systems=()
port=$(freeport)
"$tmp/floor" -addr "127.0.0.1:$port" >/dev/null & pids+=($!)
systems+=("floor rls 127.0.0.1:$port $! 0")
gport=$(freeport); hport=$(freeport)
"$tmp/sluice" serve --rules bench/rules --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" >"$tmp/mem.log" 2>&1 & pids+=($!)
systems+=("sluice-memory rls 127.0.0.1:$gport $! 0")
redis
gport=$(freeport); hport=$(freeport)
"$tmp/sluice" serve --rules bench/rules-approximate --store redis --redis-addr "127.0.0.1:$rport" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" >"$tmp/approx.log" 2>&1 & pids+=($!)
systems+=("sluice-redis-approximate rls 127.0.0.1:$gport $! $rpid")

# guber NAME N: a gubernator cluster of N nodes, each told of all of them.
guber() {
	local addrs=() gpids=() list i
	for _ in $(seq "$2"); do addrs+=("127.0.0.1:$(freeport)"); done
	list=$(IFS=,; echo "${addrs[*]}")
	for i in "${!addrs[@]}"; do
		"$tmp/peers" node -grpc "${addrs[$i]}" -http "127.0.0.1:$(freeport)" -peers "$list" -sync-wait "${SYNCWAIT:-0}" >"$tmp/$1-$i.log" 2>&1 & pids+=($!)
		gpids+=($!)
	done
	systems+=("$1 guber $list $(IFS=,; echo "${gpids[*]}") 0")
}
guber gubernator-1 1
guber gubernator-4 4
cluster=${systems[-1]}

if [ -n "$ratelimit" ]; then
	redis
	mkdir -p "$tmp/rl/ratelimit/config"
	cat >"$tmp/rl/ratelimit/config/bench.yaml" <<-'EOF'
	# bench/rules/bench.yaml's rule in envoyproxy/ratelimit's terms: one
	# counter per address, a limit no run reaches.
	domain: bench
	descriptors:
	  - key: remote_address
	    rate_limit: {unit: second, requests_per_unit: 1000000000}
	EOF
	gport=$(freeport)
	env RUNTIME_ROOT="$tmp/rl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$rport" \
		HOST=127.0.0.1 PORT="$(freeport)" GRPC_HOST=127.0.0.1 GRPC_PORT="$gport" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(freeport)" \
		"$ratelimit" >"$tmp/ratelimit.log" 2>&1 & pids+=($!)
	systems+=("envoy-ratelimit rls 127.0.0.1:$gport $! $rpid")
fi

for s in "${systems[@]}"; do
	set -- $s
	for a in ${3//,/ }; do waitport "${a##*:}"; done
done

results="$tmp/results.jsonl"
for _ in $(seq "${ROUNDS:-3}"); do
	for s in "${systems[@]}"; do
		set -- $s
		case $2 in
		rls) "$tmp/rlsload" -addr "$3" -c "$C" -k "$K" -d "${DUR}s" -pid "$4" -store-pid "$5" -name "$1" -json ;;
		guber) "$tmp/peers" load -addrs "$3" -pids "$4" -c "$C" -k "$K" -d "${DUR}s" -name "$1" -json ;;
		esac | tee -a "$results"
	done
done
echo "# $(uptime)"
python3 bench/rlstable.py "$results" sluice-redis-approximate

echo
echo "# gubernator's accuracy on $(echo "$cluster" | cut -d' ' -f1), ${ACCDUR}s each"
set -- $cluster
for algo in leaky token; do
	"$tmp/peers" accuracy -addrs "$3" -algorithm "$algo" -shape even -global=false -d "${ACCDUR}s"
	for shape in even skewed skewed-owner; do
		"$tmp/peers" accuracy -addrs "$3" -algorithm "$algo" -shape "$shape" -d "${ACCDUR}s"
	done
done
echo "# $(uptime)"

if [ -z "${NOSLUICEACC:-}" ]; then
	echo
	echo "# Sluice's accuracy: go test -run TestCountingAccuracy -v ./redisstore/"
	go test -count=1 -run 'TestCountingAccuracy$' -v ./redisstore/ | grep -E 'admitted|--- (PASS|FAIL|SKIP)|^(ok|FAIL)'
	echo "# $(uptime)"
fi
