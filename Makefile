# Apiary build. `make demo` and `make test` are the whole quickstart.
GO      ?= go
BIN     ?= bin/apiary
PKGS    ?= ./...
# Tests run with the race detector off by default (2-core CI budget); `make race` runs it.
TESTFLAGS ?= -count=1 -timeout 9m

.PHONY: all deps build test race proto proto-check lint demo demo-tls bench bench-badnode bench-tls loadtest-liveness clean

all: build

# Fetches every module that go.mod requires, the test-only ones (gonum,
# rapid) too, so that after `make build` or `make demo`, `make test` downloads
# nothing. Quick when the module cache has them already.
deps:
	$(GO) mod download

build: deps
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/apiary

test: build
	$(GO) test $(TESTFLAGS) $(PKGS)

race:
	$(GO) test -race $(TESTFLAGS) $(PKGS)

# Regenerates api/ with buf run as a Go tool (tools/go.mod keeps its
# dependencies apart from the server's).
proto:
	$(GO) tool -modfile=tools/go.mod buf lint
	$(GO) tool -modfile=tools/go.mod buf generate

# Fails if the committed generated code differs from what `make proto` makes.
proto-check: proto
	git diff --exit-code -- api/

lint:
	$(GO) vet $(PKGS)
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

demo: build
	./scripts/demo.sh

# The demo with mutual TLS on every process (apiary dev --tls).
demo-tls: build
	DEMO_TLS=1 ./scripts/demo.sh

bench: build
	./scripts/bench.sh

# Issue 11's bad-node benchmark (one bad agent of four against a healthy
# control, 5 trials per setup, a few minutes); results in loadtest/results/.
bench-badnode: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/badnode-$$(date +%F) -only badnode

# Issue 19's cost of mutual TLS + role checks: SubmitJob and RegisterNode,
# plaintext against mTLS, 3 alternating runs each (about 1.5 minutes).
bench-tls: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/tlscost-$$(date +%F) -only tlscost

# Issue 20's liveness load tests (partition-agent, outage-region) with small
# trial counts, about 4 minutes; results in loadtest/results/. Not part of
# `make test` (short versions of both are, in ./loadtest).
loadtest-liveness: build
	./scripts/loadtest-liveness.sh

clean:
	rm -rf bin
