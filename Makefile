# kaas — Kafka-wire-compatible broker. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO        ?= go
BIN       ?= bin/kaas
# Flags for `make run`; override e.g. `make run KAAS_ARGS="--listeners=127.0.0.1:9093 ..."`.
KAAS_ARGS ?= --listeners=127.0.0.1:9092 --data.dir=./data --metrics.addr=127.0.0.1:9644 \
             --broker.id=0 --auto.create.topics.enable=true --num.partitions=1 --log.level=info
# The end-to-end package (Java tools, kcat, python, kill -9). It runs without -race: the broker
# under test is a separate, non-race binary anyway, and the race detector only slows the
# harness's own client code. Everything else runs with -race.
E2E_PKG   := ./cmd/kaas
TEST_TIMEOUT ?= 20m
# Extra flags for go test, e.g. `make test TESTFLAGS=-v` or `TESTFLAGS='-run TestTopicsCLI'`.
TESTFLAGS ?=
# Seconds of real fuzzing per target for `make fuzz` (fuzz-short only replays seed corpora).
FUZZTIME  ?= 10s
KAFKA_LIB := bench/.kafka-lib

.PHONY: help build run run-cluster deps test test-unit test-e2e vet fuzz-short fuzz tools bench clean

help:
	@echo "targets: build run run-cluster deps test test-unit test-e2e vet fuzz-short fuzz tools bench clean"

build:
	$(GO) build -o $(BIN) ./cmd/kaas

run: build
	mkdir -p data
	./$(BIN) $(KAAS_ARGS)

# A real etcd (Debian's etcd-server, see `make deps`) and three brokers on 127.0.0.1:9092-9094
# sharing ./data-cluster/vol; Ctrl-C drains the brokers, then stops etcd. deploy/local/run-cluster.sh
# says more (extra broker flags: KAAS_CLUSTER_ARGS="--log.level=debug").
run-cluster: build
	KAAS_BIN=$(BIN) GO=$(GO) deploy/local/run-cluster.sh

# Java tools are needed by the e2e tests; fetching is a no-op when bench/.kafka-lib is current.
tools:
	bench/kafka-tools.sh fetch

# Everything `make test` needs beyond Go, Java, Maven and python3 (kcat, python3-confluent-kafka
# via apt when missing, Go modules, the Kafka Java tools); see .ci/deps. Quick when present.
deps:
	.ci/deps

vet:
	$(GO) vet ./...

test: deps vet test-unit test-e2e

# All packages but the e2e one, with the race detector.
test-unit:
	pkgs=$$($(GO) list ./... | grep -v '/cmd/kaas$$' || true); \
	if [[ -n "$$pkgs" ]]; then $(GO) test -race -timeout $(TEST_TIMEOUT) $(TESTFLAGS) $$pkgs; fi
	# storage again with the other settings of log.preallocate (the run above has it on) and
	# log.wal.enable (on above): production default (WAL on, preallocate off), then the WAL off
	# (per-partition fsync) with preallocate on and off. Without the race detector: the run above
	# has it, and these check behaviour under other settings (-race made them 6 of make test's
	# ~28 minutes on 2 cores).
	KAAS_TEST_PREALLOCATE=0 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./storage
	KAAS_TEST_WAL=0 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./storage
	KAAS_TEST_WAL=0 KAAS_TEST_PREALLOCATE=0 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./storage

test-e2e: tools
	$(GO) test -timeout $(TEST_TIMEOUT) $(TESTFLAGS) $(E2E_PKG)

# Seed corpora only (plain `go test` replays them too; this runs nothing else).
fuzz-short:
	$(GO) test -run '^Fuzz' $$($(GO) list ./... | grep -v '/cmd/kaas$$')

# Real fuzzing, FUZZTIME per target (go test -fuzz takes one package and one target at a time).
fuzz:
	for pkg in $$($(GO) list ./... | grep -v '/cmd/kaas$$'); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

# Side-by-side benchmark against Apache Kafka (bench/README.md); takes long, never part of `test`.
# e.g. `make bench BENCH_ARGS="--rounds 3 S1 S4"` or `BENCH_ARGS=--quick`.
BENCH_ARGS ?=
bench:
	bench/run $(BENCH_ARGS)

clean:
	rm -rf bin data data-cluster
	find . -name '*.test' -type f -delete
