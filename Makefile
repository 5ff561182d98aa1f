# Sluice's everyday commands. `make` alone lists them.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# Extra flags for `go test` in `make test`, e.g. TESTFLAGS='-run Foo -v'.
TESTFLAGS ?=
# Benchmarks: which ones, for how long, and where the results go.
BENCH ?= .
BENCHTIME ?= 200ms
BENCHCOUNT ?= 1
BENCH_OUT ?= bench.txt
# How long each fuzz target runs in `make fuzz`.
FUZZTIME ?= 10s
# `make staticcheck` runs it through `go run` at this pinned version (nothing
# to install). It is not part of `make lint`: on a cold build cache it took
# 5m17s here (2m56s of CPU). .ci/run calls it; with a warm cache it takes
# seconds.
STATICCHECK_VERSION ?= v0.8.2
# `make proto` generates the Go messages of proto/ (Sluice's own API,
# sluice.v1) with buf and protoc-gen-go, both through `go run`: buf at
# this pinned version, protoc-gen-go at go.mod's google.golang.org/protobuf.
# internal/coord's TestGeneratedCode reads this line, regenerates into a
# temporary directory and fails when the checked-in code differs.
BUF_VERSION ?= v1.75.0
# `make vuln` runs govulncheck, pinned, against a database
# built offline from the golang.org/x/vulndb module (vuln.go.dev is not
# reachable here); .ci/vuln.sh pins both versions (GOVULNCHECK_VERSION,
# VULNDB_VERSION in the environment override them). VULNDB: a database
# URL to use instead, e.g. https://vuln.go.dev where it is reachable.
VULNDB ?=

# Tests that need real components (Redis, ...) find them on PATH; .ci/run
# installs them. Pass CI=true so that such tests fail instead of skipping
# when a component is missing.
export CI

# Integration needs: add a tool that some test runs (e.g. redis-server) to
# TEST_TOOLS; `make test` then checks that it is on PATH when CI=true, and
# warns otherwise. Add services that must run before the tests to the
# test-setup recipe.
TEST_TOOLS ?= redis-server chromium ip nft

# `make image` pushes the checked image here when set: any destination
# `buildah push` takes, e.g. oci-archive:sluice.tar or
# containers-storage:localhost/sluice:dev.
IMAGE_DEST ?=

.PHONY: help test test-long test-setup faults bench fuzz lint staticcheck vuln serve image proto

help: ## list the targets (the default)
	@echo 'Usage: make <target> [VAR=value ...]'
	@echo
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'
	@echo
	@echo 'Variables: GO, TESTFLAGS, BENCH, BENCHTIME, BENCHCOUNT, BENCH_OUT, FUZZTIME, IMAGE_DEST, VULNDB, CI'

test-setup: # integration needs of `make test`
	@for tool in $(TEST_TOOLS); do \
		if ! command -v "$$tool" >/dev/null 2>&1; then \
			if [ "$${CI:-}" = true ]; then \
				echo "make test: $$tool is not on PATH; .ci/run installs it" >&2; exit 1; \
			fi; \
			echo "make test: warning: $$tool is not on PATH; the tests that need it skip" >&2; \
		fi; \
	done

# Tests that hold bounds in real time, most across several OS processes
# (lease's published example and its Redis hand-overs, the ingestion demo,
# draining at 2,000 records a second and its restarts, the counting modes'
# accuracy across processes, semaphores across processes): beside other
# packages' tests they measure the machine's load, not Sluice. Each starts
# with longtest.Run(t), which skips it unless SLUICE_TEST_LONG is set:
# `make test` leaves them out, `make test-long` runs them alone, one
# package at a time. LONG names every one of them (internal/longtest's
# test checks it against the code).
LONG := ^(TestBoundedMemory|TestBudgetsSharedExample|TestCluster|TestCountingAccuracy|TestCountingManyKeys|TestCountingProcesses|TestDemoChargesExample|TestDemoIngestExample|TestDemoIngestKill|TestDemoIngestKillSources|TestFairOrderAcrossProcesses|TestKillDrainer|TestNATSRestart|TestPublishedExampleProcesses|TestRandom429Partitions|TestRate|TestRealProcesses|TestRedisColdStart|TestRedisFreedCapacity|TestSemaphoreProcesses|TestSemaphoreRoundTrips|TestSemaphoreScenarioFigures|TestSinkWideQuota|TestThrottledDBRealTime|TestWeightedAcrossProcesses)$$
LONG_PKGS := ./cmd/sluice/ ./concurrency/ ./drain/jsdrain/ ./httplimit/ ./lease/ ./redisstore/

test: test-setup ## run every test but the real-time ones, with the race detector (CI=true: missing tools fail)
	$(GO) test -race -timeout=20m $(TESTFLAGS) ./...

test-long: test-setup ## run the real-time tests across processes, alone, one package at a time
	SLUICE_TEST_LONG=1 $(GO) test -race -p 1 -timeout=40m -run '$(LONG)' $(TESTFLAGS) $(LONG_PKGS)

# The fault scenarios (internal/faultnet): hosts as network namespaces, as
# root. `make test` runs a subset once (they skip when not root, outside
# CI); `make faults` runs them all alone (SLUICE_TEST_FAULTS=1 lets the
# rest run), verbose, FAULTS_COUNT runs of each, printing the rows of
# docs/faults.md (the whole output goes to faults.txt).
FAULTS_COUNT ?= 1
faults: test-setup ## run the fault scenarios between network namespaces (root), printing docs/faults.md's rows
	SLUICE_TEST_FAULTS=1 $(GO) test -race -p 1 -count=$(FAULTS_COUNT) -timeout=15m -run '^TestFault' -v $(TESTFLAGS) ./internal/faultnet/ | \
		tee faults.txt | grep -E '^(--- |ok|FAIL|PASS)|faults\.md \|'

bench: ## run the benchmarks (BENCH, BENCHTIME) and write them to BENCH_OUT (bench.txt)
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) ./... | tee $(BENCH_OUT)
	@echo "benchmarks written to $(BENCH_OUT)"

fuzz: ## run every fuzz target of every package for FUZZTIME each
	@for pkg in $$($(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do \
		list=$$($(GO) test -list '^Fuzz' "$$pkg"); \
		for target in $$(grep '^Fuzz' <<<"$$list" || true); do \
			echo "fuzz: $$pkg $$target for $(FUZZTIME)"; \
			$(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZTIME) "$$pkg"; \
		done; \
	done

lint: ## gofmt -l must print nothing; go vet
	@unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt -l: these files need gofmt -w:" >&2; echo "$$unformatted" >&2; exit 1; \
	fi
	$(GO) vet ./...

staticcheck: ## staticcheck (pinned; slow on a cold cache, so not in lint)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

vuln: ## govulncheck (pinned), offline database from golang.org/x/vulndb; exit 3: findings, 4: skipped
	GO='$(GO)' VULNDB='$(VULNDB)' .ci/vuln.sh

proto: ## regenerate internal/coord/sluicev1 from proto/ (buf and protoc-gen-go, pinned, through go run)
	$(GO) run github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION) generate proto --template proto/buf.gen.yaml

serve: ## run sluice serve (the embedded in-memory default)
	$(GO) run ./cmd/sluice serve

image: ## build the container image with buildah, check that it serves /readyz (IMAGE_DEST keeps it)
	GO='$(GO)' deploy/container/build.sh $(IMAGE_DEST)
