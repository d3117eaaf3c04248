# Weir's developer entry points. `make demo` and `make test` need root.
GO       ?= go
BIN      ?= bin
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
BUF      := $(GO) run github.com/bufbuild/buf/cmd/buf@v1.47.2
CONTROLLER_GEN := $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Every compile here (the binaries, vet and staticcheck, the tests, the
# tools go run builds, the binaries the labs and the images build) uses the
# flags the shipped binaries are built with (deploy/container/
# build-images.sh): static, without cgo, paths trimmed. One set of flags is
# one compile of the dependencies on a new machine, not one per set: go vet
# after the images' build takes 64 s instead of 238 s cold.
export CGO_ENABLED ?= 0
export GOFLAGS ?= -trimpath

PREFIX   ?= /usr/local
SYSTEMD  ?= /etc/systemd/system

# go test's own limit for one package. Above any package's cold time
# with a margin (test/e2e, every namespace lab in turn, is the longest:
# about 12 minutes alone, 15.5 on a machine busy with other builds), and
# said here so that nothing rests on go test's 10-minute default.
TEST_TIMEOUT ?= 25m

.PHONY: all build test unit race lint generate api-baseline check-generated demo deps testdeps test-cold test-upstream fuzz clean install images

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/weir-server ./server/cmd/weir-server
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/weir-agent ./agent/cmd/weir-agent
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/weir-speaker ./lbtier/cmd/weir-speaker
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/lbctl ./lbctl

deps:
	./scripts/install-deps.sh

# Everything: lint, generated code up to date, unit and lab tests (with
# every fuzz target's seed corpus). Fuzzing itself is make fuzz.
test: deps lint check-generated testdeps
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# The unit and real-apiserver tests under the race detector (it needs
# cgo): opt-in, about 8 minutes on two cores.
race: testdeps
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./server/... ./agent/... ./internal/... ./lbctl/... ./lbtier/... ./datapath

# Kubernetes' own network e2e specs (test/e2e/network of the release
# test/kubeapi builds) on two lab clusters, one served by kube-proxy and
# one by Weir: fails for any spec kube-proxy passes and Weir does not, and
# writes the side-by-side table to UPSTREAM_REPORT. Opt-in: over an hour
# on two cores. make test runs the [Conformance] Service specs on Weir.
UPSTREAM_REPORT ?= $(CURDIR)/upstream-results.md
test-upstream: deps testdeps
	WEIR_UPSTREAM=1 WEIR_UPSTREAM_REPORT=$(UPSTREAM_REPORT) $(GO) test -count=1 -timeout 180m -v -run '^TestUpstreamSideBySide$$' ./test/kubecluster

# Every fuzz target for FUZZTIME each (make fuzz FUZZTIME=10m).
FUZZTIME ?= 1m
fuzz:
	GO=$(GO) scripts/fuzz.sh $(FUZZTIME)

# Only the tests, without lint (quicker while iterating).
unit: testdeps
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# Heavy test dependencies (the real kube-apiserver), built once per machine
# before the tests rather than inside a test's clock.
testdeps:
	$(GO) run ./test/cmd/testdeps

# CI on a brand-new machine: a fresh clone of HEAD with empty Go caches and
# no per-machine test caches. Run it before resolving anything that touches
# the build or the tests.
test-cold:
	scripts/test-cold.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(BUF) lint
	$(BUF) breaking --against proto/baseline.binpb

# The gRPC API's code (buf), and the Kubernetes API's deep copies and
# CustomResourceDefinitions (controller-gen) from server/kubernetes/api,
# for the plain manifests and the Helm chart.
generate:
	$(BUF) generate
	$(CONTROLLER_GEN) object crd paths=./server/kubernetes/api/... output:crd:dir=./deploy/kubernetes/crds
	cp deploy/kubernetes/crds/*.yaml deploy/helm/weir/crds/
	cp deploy/monitoring/weir-alerts.yaml deploy/monitoring/grafana-dashboard.json deploy/helm/weir/files/

# The API of the last release (a tag; CHANGELOG.md): make lint fails on a
# change that would break a client of it (buf breaking). Refresh at each
# release: make api-baseline RELEASE=vX.Y.Z.
RELEASE ?= v0.1.0
api-baseline:
	rm -rf $(BIN)/release-api && mkdir -p $(BIN)/release-api
	git archive $(RELEASE) proto buf.yaml buf.gen.yaml | tar -x -C $(BIN)/release-api
	cd $(BIN)/release-api && $(BUF) build -o $(CURDIR)/proto/baseline.binpb

# Fails when the committed generated code differs from what buf generates.
check-generated: generate
	@git diff --exit-code -- proto/ server/kubernetes/api/ deploy/kubernetes/crds/ deploy/helm/weir/crds/ deploy/helm/weir/files/ || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/ server/kubernetes/api/ deploy/kubernetes/crds/ deploy/helm/weir/crds/ deploy/helm/weir/files/)" || { echo "generated files are not committed: run make generate and commit"; exit 1; }

demo: deps
	$(GO) run ./test/cmd/demo

# Container images for deploy/kubernetes, without pulling any base image:
# see deploy/container/README.md.
images:
	deploy/container/build-images.sh

# Bare-metal install: binaries, hardened units, example configuration (kept
# when one is already there).
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSTEMD) $(DESTDIR)/etc/weir
	install -m 0755 $(BIN)/weir-server $(BIN)/weir-agent $(BIN)/weir-speaker $(BIN)/lbctl $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 deploy/systemd/weir-server.service deploy/systemd/weir-agent.service deploy/systemd/weir-speaker.service $(DESTDIR)$(SYSTEMD)/
	[ -e $(DESTDIR)/etc/weir/weir-server.env ] || install -m 0644 deploy/systemd/weir-server.env.example $(DESTDIR)/etc/weir/weir-server.env
	[ -e $(DESTDIR)/etc/weir/weir-agent.env ] || install -m 0644 deploy/systemd/weir-agent.env.example $(DESTDIR)/etc/weir/weir-agent.env
	[ -e $(DESTDIR)/etc/weir/weir-speaker.env ] || install -m 0644 deploy/systemd/weir-speaker.env.example $(DESTDIR)/etc/weir/weir-speaker.env

clean:
	rm -rf $(BIN)
