#!/usr/bin/env bash
# Builds Sluice's container image with buildah (no daemon, no base image
# pulled, nothing run inside the build) and checks it: the image's own
# binary, from the image's root filesystem, as the image's user and with
# the image's environment, must serve /readyz and /healthz, then stop
# cleanly on SIGTERM.
#
#   deploy/container/build.sh                      build and check, keep nothing
#   deploy/container/build.sh oci-archive:sluice.tar   ... and push the image there
#   deploy/container/build.sh containers-storage:localhost/sluice:dev
#
# The argument is any destination `buildah push` takes. The image is built
# in a throwaway store (vfs driver, under a temporary directory) which is
# removed at the end, whatever happens. Runs as root (CI does); as another
# user it re-runs itself under `buildah unshare`, and the check then runs
# the binary as that user instead of the image's.
#
# Environment: GO (default go), BUILDAH (default buildah).
set -euo pipefail
cd "$(dirname "$0")/../.."

GO=${GO:-go}
BUILDAH=${BUILDAH:-buildah}
dest=${1:-}

if [ "$(id -u)" != 0 ] && [ -z "${_SLUICE_UNSHARED:-}" ]; then
	exec env _SLUICE_UNSHARED=1 "$BUILDAH" unshare "$0" "$@"
fi

work=$(mktemp -d)
b=("$BUILDAH" --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
serve_pid=
cleanup() {
	if [ -n "$serve_pid" ]; then
		kill -KILL "$serve_pid" 2>/dev/null || true
	fi
	"${b[@]}" rm --all >/dev/null 2>&1 || true
	"${b[@]}" rmi --all --force >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

step() { printf 'image: %s (%ds)\n' "$*" "$SECONDS"; }

# The build context: the static binary, the rules, the CA certificates.
ctx=$work/context
mkdir -p "$ctx/rules" "$ctx/certs"
step "building the static binary"
# As cmd/sluice's tests build it (buildSluice), so that after `make test`
# only the link is left to do; -s -w drops the symbol table.
CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$ctx/sluice" ./cmd/sluice
cp examples/rules/*.yaml "$ctx/rules/"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$ctx/certs/"
else
	echo "image: warning: no /etc/ssl/certs/ca-certificates.crt; the image has no CA certificates (--redis-tls needs --redis-tls-ca)" >&2
fi

step "building the image"
image=localhost/sluice:check
"${b[@]}" build --quiet --layers=false -f deploy/container/Containerfile -t "$image" "$ctx" >/dev/null
size=$("${b[@]}" images --format '{{.Size}}' "$image")
echo "image: $image, $size"

# What a runtime would run: the entrypoint and command, as the user, with
# the environment, all read from the image.
cfg() { "${b[@]}" inspect --type image --format "$1" "$image"; }
user=$(cfg '{{.OCIv1.Config.User}}')
mapfile -t envs < <(cfg '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
mapfile -t argv < <(cfg '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}{{range .OCIv1.Config.Cmd}}{{println .}}{{end}}' | sed '/^$/d')
[ "$user" = 65532:65532 ] || { echo "image: user is '$user', want 65532:65532" >&2; exit 1; }
[ "${argv[*]}" = "/sluice serve" ] || { echo "image: runs '${argv[*]}', want '/sluice serve'" >&2; exit 1; }

container=$("${b[@]}" from --quiet "$image")
root=$("${b[@]}" mount "$container")
chroot_bin=$(command -v chroot)
as=()
if [ -z "${_SLUICE_UNSHARED:-}" ]; then
	as=(--userspec="$user")
fi
# The command line that runs a program of the image as the image would.
in_image=(env -i "${envs[@]}" "$chroot_bin" "${as[@]}" "$root")

step "checking the image's rules"
"${in_image[@]}" /sluice rules validate /etc/sluice/rules

# Listen on loopback ports the kernel picks (flags win over the image's
# SLUICE_*_ADDR, which listen on every interface) and learn them from the
# start-up log record.
step "starting the image's serve"
# exec all the way down (env, chroot): the coprocess's pid is serve's.
coproc serve { exec 2>&1; exec "${in_image[@]}" "${argv[@]}" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0; }
serve_pid=$serve_PID
exec {log}<&"${serve[0]}"
up=
while IFS= read -r -t 60 line <&"$log"; do
	printf 'serve: %s\n' "$line"
	case $line in *'"msg":"sluice serving"'*)
		up=$line
		break
		;;
	esac
done
[ -n "$up" ] || { echo "image: serve did not log 'sluice serving' within 60s" >&2; exit 1; }
http=$(grep -o '"http":"[^"]*"' <<<"$up" | cut -d'"' -f4)

# GET path on serve's HTTP listener; prints the status line.
get() {
	local fd status
	exec {fd}<>"/dev/tcp/${http%:*}/${http##*:}"
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" "$http" >&"$fd"
	IFS= read -r -t 10 status <&"$fd" || true
	exec {fd}<&-
	printf '%s' "${status%$'\r'}"
}
for path in /readyz /healthz; do
	status=$(get "$path")
	echo "image: GET $path: $status"
	case $status in "HTTP/1.0 200 "* | "HTTP/1.1 200 "*) ;; *)
		echo "image: GET $path on the image's serve: '$status', want 200" >&2
		exit 1
		;;
	esac
done

step "stopping serve (SIGTERM to pid $serve_pid)"
kill -TERM "$serve_pid"
while IFS= read -r -t 30 line <&"$log"; do printf 'serve: %s\n' "$line"; done
rc=0
wait "$serve_pid" || rc=$?
serve_pid=
[ "$rc" = 0 ] || { echo "image: serve exited $rc after SIGTERM, want 0" >&2; exit 1; }
"${b[@]}" umount "$container" >/dev/null

if [ -n "$dest" ]; then
	step "pushing to $dest"
	"${b[@]}" push --quiet "$image" "$dest"
fi
step "image OK ($size)"
