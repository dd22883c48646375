# Meterline. `make test` is the whole suite against a real Kafka broker and a
# real ClickHouse, both started (and stopped) by the project's own scripts.
# `go test -short ./...` is the fast loop and needs no service.

GO              ?= go
KAFKA_PORT      ?= 9092
CLICKHOUSE_PORT ?= 9000
# The whole suite must fit CI's budget with room to spare.
TEST_TIMEOUT    ?= 40m
# Set KEEP_SERVICES=1 to leave Kafka and ClickHouse running after the tests.
KEEP_SERVICES   ?=

export KAFKA_PORT CLICKHOUSE_PORT

.PHONY: all build test test-short test-race docs-check chaos bench-failover vet fuzz services-start services-stop clean

all: build

# The version `meterline version` and meterline_build_info report: the
# checkout's `git describe`, when it is a git checkout.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build:
	$(GO) build -ldflags "-X github.com/meterline/meterline/internal/service.version=$(VERSION)" -o bin/meterline ./cmd/meterline

vet:
	$(GO) vet ./...

test-short:
	$(GO) test -short ./...

# The fast loop's tests of the concurrent packages under Go's race detector
# (docs/testing.md, The race detector), one package at a time. Not part of
# `make test`. RACE_SKIP names the tests whose checks the race detector's
# instrumentation defeats (allocation bounds: sync.Pool drops items at
# random under -race; a bound on the live heap: the detector adds to
# every allocation).
RACE_PACKAGES ?= ./internal/stream ./dedup ./aggregator ./sink ./ingest ./internal/session ./internal/kafka ./internal/cli ./producer ./entitlements ./internal/demo
RACE_SKIP     ?= ^(TestDeepDataCostsLittle|TestLargeDataCostsLittle|TestUncompressedHeaderBatches)$$
test-race:
	$(GO) test -race -short -count=1 -p 1 -timeout 30m -skip '$(RACE_SKIP)' $(RACE_PACKAGES)

# Starts both services, runs vet and every test with the integration
# variables set, and stops the services even when a test fails. Fails if any
# integration test skipped.
test:
	@bash scripts/test.sh

# The commands of README.md and docs/, run against both services (started and
# stopped as for `make test`) by internal/docscheck, which `make test` runs
# with the rest of the suite.
docs-check:
	@PACKAGES=./internal/docscheck bash scripts/test.sh

# The long run of internal/clustertest (docs/testing.md gives its duration):
# the whole pipeline on a cluster of three brokers, every broker fault three
# times at a higher rate, and a rebalance storm of over a minute. `make test`
# runs the short version.
chaos:
	@PACKAGES=./internal/clustertest METERLINE_TEST_CHAOS=long TEST_TIMEOUT=60m bash scripts/test.sh

# The failover benchmark (docs/benchmarks.md): a dedup partition of
# FAILOVER_KEYS keys (each count in turn), its owner killed with SIGKILL,
# with and without a standby replica; the table goes to the test log.
FAILOVER_KEYS ?= 5000000,20000000
bench-failover:
	@GOFLAGS=-tags=failoverbench PACKAGES=./internal/standbytest METERLINE_FAILOVER_BENCH=$(FAILOVER_KEYS) TEST_TIMEOUT=60m bash scripts/test.sh

# Every fuzz target, FUZZTIME each (scripts/fuzz.sh).
fuzz:
	@GO=$(GO) bash scripts/fuzz.sh

services-start:
	deploy/local/kafka.sh start
	deploy/local/clickhouse.sh start

services-stop:
	-deploy/local/kafka.sh stop
	-deploy/local/clickhouse.sh stop

clean:
	rm -rf bin
