# Shell helpers of bench/'s scripts, which source this file from the
# repository's root.

# freeport prints a TCP port free on 127.0.0.1 at the time of asking.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# waitport PORT [SECONDS] waits until something listens on 127.0.0.1:PORT,
# at most SECONDS (default 10), and fails saying so if nothing does.
waitport() {
	for _ in $(seq $((${2:-10} * 20))); do
		(echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "port $1 never opened" >&2
	return 1
}
