#!/usr/bin/env bash
# Runs govulncheck (pinned; built into the cache below, not installed on
# PATH) on every package of the module, against a vulnerability database.
#
# The database: vuln.go.dev, govulncheck's default, is not reachable from
# our machines or CI (only the Go module proxy is), so by default it is
# built here, offline, from the Go module golang.org/x/vulndb at a pinned
# version: its data/osv holds the OSV entry of every Go vulnerability
# report, and its own cmd/indexdb writes from them the v1 database that
# govulncheck reads with -db file://. The database is as fresh as that
# version: move VULNDB_VERSION forward (`go list -m golang.org/x/vulndb@latest`)
# to take new reports. It is built once per version, under
# $XDG_CACHE_HOME/sluice-vulndb (default ~/.cache).
#
# Environment:
#   GO                   go (default go)
#   GOVULNCHECK_VERSION  golang.org/x/vuln version (default below)
#   VULNDB_VERSION       golang.org/x/vulndb version (default below)
#   VULNDB               a database URL to use instead, e.g.
#                        https://vuln.go.dev where it is reachable
#
# Exit status: 0 no vulnerability reachable from Sluice's code; 3 some
# (govulncheck's own status; they are listed); 4 skipped: no database
# could be had (said on stderr, never silently); anything else, an error.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
GOVULNCHECK_VERSION=${GOVULNCHECK_VERSION:-v1.10.0}
VULNDB_VERSION=${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}
VULNDB=${VULNDB:-}

skip() {
	echo "govulncheck: SKIPPED: $*" >&2
	exit 4
}

if [ -z "$VULNDB" ]; then
	cache="${XDG_CACHE_HOME:-$HOME/.cache}/sluice-vulndb/$VULNDB_VERSION"
	if [ ! -f "$cache/index/db.json" ]; then
		echo "govulncheck: building the database from golang.org/x/vulndb@$VULNDB_VERSION"
		dir=$("$GO" mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" 2>&1 |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p') || true
		if [ -z "$dir" ] || [ ! -d "$dir/data/osv" ]; then
			skip "golang.org/x/vulndb@$VULNDB_VERSION could not be downloaded from the module proxy, so there is no vulnerability database to check against"
		fi
		rm -rf "$cache.tmp"
		mkdir -p "$(dirname "$cache")"
		if ! "$GO" run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$dir/data/osv" -out "$cache.tmp"; then
			rm -rf "$cache.tmp"
			skip "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION could not build the database"
		fi
		rm -rf "$cache"
		mv "$cache.tmp" "$cache"
	fi
	VULNDB="file://$cache"
fi

# Installed into a directory of its own, not run through `go run`, which
# turns every failing exit status into 1: govulncheck's 3 must come through.
bin="${XDG_CACHE_HOME:-$HOME/.cache}/sluice-vulndb/govulncheck-$GOVULNCHECK_VERSION"
if [ ! -x "$bin/govulncheck" ]; then
	GOBIN="$bin" "$GO" install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"
fi
echo "govulncheck $GOVULNCHECK_VERSION, database $VULNDB"
"$bin/govulncheck" -db "$VULNDB" ./...
