# tokenserver: see `make help`.
SHELL := /bin/bash
GO ?= go
BIN := bin
# Generators and linters are pinned by tool directives in tools/go.mod, a
# module of their own so that their dependencies stay out of the project's.
TOOL := $(GO) tool -modfile=tools/go.mod
PROTO_SRC := proto/tokenserver/v1/tokenserver.proto
# The Raft log and snapshot formats (messages only, no services).
PROTO_RAFT_SRC := proto/tokenserver/raft/v1/entries.proto
# Node-to-node services (bucket handoff, durable replicas).
PROTO_PEER_SRC := proto/tokenserver/peer/v1/handoff.proto proto/tokenserver/peer/v1/replica.proto

.PHONY: help build run test test-unit test-multiprocess vet bench figures cluster cluster-stop proto proto-check proto-tools lint tidy-check vuln clean

help: ## Show the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build tokenserver and tokenctl into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

run: build ## Run a single node with the defaults (gRPC 127.0.0.1:7070, HTTP 127.0.0.1:7072).
	$(BIN)/tokenserver

test: vet proto-check test-unit test-multiprocess ## vet, proto freshness, unit tests with -race, multi-process tests.

vet: ## go vet and gofmt.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

test-unit: ## Unit and in-process tests with the race detector.
	$(GO) test -race -count=1 -timeout 15m ./...

test-multiprocess: build ## Tests that start real tokenserver processes on 127.0.0.1.
	TOKENSERVER_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 15m -parallel 4 -tags multiprocess ./test/...

bench: ## Benchmarks (figures for the notes, never assertions).
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/bucket/ ./internal/shard/
	bash scripts/bench-e2e.sh

figures: build ## Measured figures on real processes (failover times, forwarding and write latency).
	TOKENSERVER_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 30m -tags 'multiprocess figures' -run Figures -v ./test/ 2>&1 | grep -E 'FIGURE|^(ok|FAIL|---)'

cluster: build ## Start a 3-node cluster on 127.0.0.1 (state in .cluster/).
	bash scripts/cluster.sh start

cluster-stop: ## Stop the cluster that `make cluster` started.
	bash scripts/cluster.sh stop

lint: vet tidy-check ## golangci-lint (depguard import rules, errorlint, staticcheck, revive), go vet, gofmt, go mod tidy.
	$(TOOL) golangci-lint run ./...

tidy-check: ## Fail if go.mod or go.sum need `go mod tidy`.
	$(GO) mod tidy -diff

vuln: ## govulncheck (needs its vulnerability database over the network; not part of make test).
	$(TOOL) govulncheck ./...

proto-tools:
	@mkdir -p $(BIN)
	$(GO) build -modfile=tools/go.mod -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

proto: proto-tools ## Regenerate the committed Go code from proto/ (needs protoc).
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative,require_unimplemented_servers=true \
		$(PROTO_SRC) $(PROTO_PEER_SRC)
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=proto --go_opt=paths=source_relative \
		$(PROTO_RAFT_SRC)

proto-check: ## Fail if the committed generated code is stale.
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(MAKE) -s proto-tools >/dev/null; \
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=$$tmp --go_opt=paths=source_relative \
		--go-grpc_out=$$tmp --go-grpc_opt=paths=source_relative,require_unimplemented_servers=true \
		$(PROTO_SRC) $(PROTO_PEER_SRC) && \
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=$$tmp --go_opt=paths=source_relative \
		$(PROTO_RAFT_SRC) && \
	diff -ru -I '^//[[:space:]]*- protoc ' -I '^//[[:space:]]*protoc ' $$tmp/tokenserver proto/tokenserver --exclude='*.proto' --exclude='wire.go' && echo "proto: generated code is up to date (the protoc version comment aside)"

# Go native fuzz targets as package:Target; `make test` runs their seed
# corpora (testdata/fuzz included), `make fuzz` fuzzes each for FUZZTIME.
FUZZTIME ?= 30s
FUZZ_TARGETS := \
	./internal/bucket:FuzzInvariants ./internal/bucket:FuzzSlidingLog \
	./internal/rule:FuzzValidate ./internal/rule:FuzzRuleJSON ./internal/rule:FuzzRequestNames \
	./internal/rulepb:FuzzFromProto ./internal/rulefile:FuzzParseRules \
	./internal/grant:FuzzParseGrant ./internal/shard:FuzzAcquire \
	./internal/raftfsm:FuzzDecodeEntry ./internal/raftfsm:FuzzRestore

.PHONY: fuzz
fuzz: ## Fuzz every target for FUZZTIME (default 30s); a find is written to the package's testdata/fuzz: commit it as a seed.
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg 2>&1 | awk '/elapsed: .*execs/ {last = $$0; next} /elapsed/ {next} {print} END {print last}'; \
	done

clean: ## Remove build output.
	rm -rf $(BIN)
