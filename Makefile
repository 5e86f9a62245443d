# Apiary build. `make demo` and `make test` are the whole quickstart.
GO      ?= go
BIN     ?= bin/apiary
PKGS    ?= ./...
# The build stamp `apiary version` prints (internal/buildinfo).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X apiary.dev/apiary/internal/buildinfo.version=$(VERSION) -X apiary.dev/apiary/internal/buildinfo.commit=$(COMMIT)
# The image `make image` builds (FROM scratch: deploy/image/Dockerfile).
IMAGE   ?= apiary
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
# The Docker Compose federation (deploy/compose/): its project name.
COMPOSE_PROJECT ?= apiary
COMPOSE = docker-compose -p $(COMPOSE_PROJECT) -f deploy/compose/docker-compose.yml
# Tests run with the race detector off by default (2-core CI budget); `make race` runs it.
TESTFLAGS ?= -count=1 -timeout 9m

# The tests are split in two by top-level name: `make test` (kept under
# 10 min on 2 cores) runs every test of $(PKGS) except FAULT_TESTS, and
# `make test-fault` runs FAULT_TESTS, the long real-process fault and
# scenario tests (outages, partitions, kills with restarts, the bad-node
# tables, overload, the load-test scenarios), in FAULT_PKGS. Both go
# through `go test -skip/-run` with the one regexp built from FAULT_TESTS,
# so no test file changes and a new test lands in `make test` unless it is
# named here; a build tag would hide a test from `go test ./...`, vet and
# gopls unless the tag is set. `make test-split-check` (.ci/testsplit.go,
# run by .ci/run) fails if a test is in neither target or in both, or if a
# name here is no test of FAULT_PKGS. `.ci/run` runs both targets.
FAULT_PKGS ?= ./regional ./cmd/apiary ./loadtest
FAULT_TESTS ?= \
	TestBadNodeTable TestBadNodeQuarantineSurvivesCoordinatorKill TestBadNodeProbeRelease \
	TestBadNodeShareGuard TestBadNodeSpendsNoLastAttempt \
	TestRegionOutageKeepsRunningWork TestRegionOutageLongerThanLostAfter TestAgentPausedPastLease \
	TestRegionRestartedFromDisk TestOverloadLosesNoAttempt TestClientOnlyCoordinatorOutlivesEtcdLoss \
	TestAgentRestartKillsOrphanedChildren TestAgentRestartKillsCgroupLeftovers \
	TestRouterStartedLaterSeesRegion TestRegionEtcdFatalExitsNamingThePart \
	TestScenariosKeepPromises TestPartitionAgentThroughFaultHook TestOutageRegionKeepsRunningTasks
# The Docker fault tests (deploy/e2e: faults across the compose federation's
# container networks) run in `make test-docker`, which builds the image;
# `make test` skips them by name, as it does FAULT_TESTS.
DOCKER_PKGS ?= ./deploy/e2e
DOCKER_TESTS ?= TestComposeFederationFaults
empty :=
space := $(empty) $(empty)
FAULT_RE = ^($(subst $(space),|,$(strip $(FAULT_TESTS))))$$
DOCKER_RE = ^($(subst $(space),|,$(strip $(DOCKER_TESTS))))$$
SKIP_RE = ^($(subst $(space),|,$(strip $(FAULT_TESTS) $(DOCKER_TESTS))))$$



.PHONY: all deps build image compose-up compose-down test test-docker test-fault test-split-check race proto proto-check lint demo demo-tls bench bench-badnode bench-tls bench-shards bench-placement bench-scale loadtest-liveness clean

all: build

# Fetches every module that go.mod requires, the test-only ones (gonum,
# rapid) too, so that after `make build` or `make demo`, `make test` downloads
# nothing. Quick when the module cache has them already.
deps:
	$(GO) mod download

build: deps
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/apiary

# A static linux binary, CA certificates and an empty /tmp in an image FROM
# scratch: nothing is pulled (this machine can pull no image). Tagged
# $(IMAGE):$(VERSION) and $(IMAGE):latest.
image: deps
	rm -rf bin/image && mkdir -p bin/image/etc/ssl/certs bin/image/tmp
	chmod 1777 bin/image/tmp
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o bin/image/apiary ./cmd/apiary
	cp $(CA_BUNDLE) bin/image/etc/ssl/certs/ca-certificates.crt
	cp deploy/image/Dockerfile bin/image/Dockerfile
	docker build -q --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE):$(VERSION) -t $(IMAGE):latest bin/image
	@docker image inspect $(IMAGE):latest --format '$(IMAGE):$(VERSION) {{.Size}} bytes'
	docker run --rm $(IMAGE):latest version

test: build
	$(GO) test $(TESTFLAGS) -skip '$(SKIP_RE)' $(PKGS)

# The long fault and scenario tests (see FAULT_TESTS above): about 7 min of
# test time in three packages, run one package at a time (-p 1): they
# measure timing under faults and load they make themselves (the overload
# test saturates both cores with its own tasks), and another package's
# fault test beside them is load they did not make (with -p 2 on a VM slow
# at spawning, TestOverloadLosesNoAttempt lost leases to it).
test-fault: build
	$(GO) test $(TESTFLAGS) -p 1 -run '$(FAULT_RE)' $(FAULT_PKGS)

test-split-check:
	$(GO) run .ci/testsplit.go -test-pkgs '$(PKGS)' -test-skip '$(SKIP_RE)' -fault-pkgs '$(FAULT_PKGS)' -fault-run '$(FAULT_RE)' \
		-docker-pkgs '$(DOCKER_PKGS)' -docker-run '$(DOCKER_RE)'

# The fault tests across container networks (deploy/e2e) against the
# compose federation, on their own project, subnets (10.98.0-2.0/24) and
# ports (7200-7281); about 6 min. Skipped, saying why, when no Docker daemon
# answers. APIARY_E2E_TRIALS=5 APIARY_E2E_RESULTS=DIR repeat the partition
# cases and keep each recovery time (the closing note's figures).
test-docker: image
	APIARY_E2E_DOCKER=1 $(GO) test $(TESTFLAGS) -timeout 30m -v -run '$(DOCKER_RE)' $(DOCKER_PKGS)

# Every test (both halves above), with the race detector.
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

# A two-region federation with mutual TLS in containers (README, "Docker
# Compose"): the image, the certificates (made on the host, in
# deploy/compose/tls/$APIARY_NET_PREFIX/: the coordinators' IPs are the
# prefix's, and the compose file mounts that directory), then up and
# healthy. COMPOSE_PROJECT=NAME APIARY_NET_PREFIX=10.96 APIARY_PORT_PREFIX=71
# runs a second copy beside the first.
compose-up: image build
	./deploy/compose/certs.sh $(BIN) $${APIARY_NET_PREFIX:-10.97}
	$(COMPOSE) up -d
	./deploy/compose/wait-healthy.sh $(COMPOSE_PROJECT) 180

# Stops and removes the containers, networks and volumes (the data).
compose-down:
	$(COMPOSE) down -v --remove-orphans

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

# Issue 19's cost of mutual TLS + role checks and of ACL tokens: SubmitJob and RegisterNode,
# plaintext against mTLS and mTLS + ACLs, 3 alternating runs each (about 2.5 minutes).
bench-tls: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/tlscost-$$(date +%F) -only tlscost

# Sharded ownership: SIGKILL of one of three shard owners (20 trials: first
# dispatch in its shards, the survivors' dispatch gaps) and the drain with 1
# against 3 owners (3 rounds, alternating; plan conflicts from /metrics);
# about 7 minutes; results in loadtest/results/shards-<date>/.
bench-shards: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/shards-$$(date +%F) -only shards

# Issue 13's placement measurements: an urgent task's submission to RUNNING
# in a full region (committed preemption) against the same with one slot
# free, 20 alternating trials each, with 1 and with 3 coordinators; and the
# stage-2 input bytes moved with data locality on against off (10
# alternating runs each, a fresh region per run); about 4 minutes; results
# in loadtest/results/placement-<date>/. PLACEMENT_ARGS adds flags, e.g.
# PLACEMENT_ARGS="-preempt-coordinators 1 -locality-runs 5".
bench-placement: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/placement-$$(date +%F) -only preempt,locality $(PLACEMENT_ARGS)

# Issue 16's control-plane scale measures (loadtest/bench/doc.go): end-to-end
# tasks/s on 1,000 simulated agents with etcd's batched-write ceiling in the
# same run, 10,000 simulated agents (heartbeats, restart and re-registration
# storms), task records to 1M (submit and etcd Txn latency, RSS, DB size,
# failover at the top) and the 2,000-task drain on exec against noop agents
# beside the spawn floor. Hours at the 1M default: SCALE_ARGS="-million-top
# 100000" for a shorter run. Results in loadtest/results/scale-<date>/.
bench-scale: build
	$(GO) run ./loadtest/bench/cmd/apiary-bench -bin $(BIN) -out loadtest/results/scale-$$(date +%F) -only throughput,fleet10k,million,drain-noop $(SCALE_ARGS)

# Issue 20's liveness load tests (partition-agent, outage-region) with small
# trial counts, about 4 minutes; results in loadtest/results/. Not part of
# `make test`: short versions of both are in `make test-fault` (./loadtest).
loadtest-liveness: build
	./scripts/loadtest-liveness.sh

clean:
	rm -rf bin
