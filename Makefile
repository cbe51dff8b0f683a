# Catena's build. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

BIN        ?= bin
GO         ?= go
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    := -s -w -X main.version=$(VERSION)
TOOLS_DIR  := $(CURDIR)/bin/tools
PKGS       := ./...
# Fuzzing budget per target in `make test` (CI runs it briefly).
# A count, not a duration: with a duration Go's fuzzing coordinator can fail
# a run that found nothing with "context deadline exceeded" when the deadline
# races a busy worker (go.dev/issue/75804; seen in CI with 0 execs/s for the
# last seconds while a new input was minimised). About 10 s of either target
# on 2 cores.
FUZZTIME   ?= 30000x

PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
CONTROLLER_GEN_VERSION     := v0.23.0
CONTROLLER_GEN             := $(TOOLS_DIR)/controller-gen-$(CONTROLLER_GEN_VERSION)

# What `make generate` and `make manifests` write; `make verify` fails when
# regenerating changes any of it. The Helm chart's CRDs and its ClusterRole's
# rules are copies that `make manifests` makes of config/crd/bases and
# config/rbac/role.yaml.
GENERATED  := rpc/catenapb api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac \
              charts/catena/crds charts/catena/files/manager-role.yaml

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: dev
dev: build ## Run the local all-in-one (3 replicas, ingestion on 127.0.0.1:7070, stream "demo").
	$(BIN)/catena dev --data-dir .catena-dev

.PHONY: generate
generate: $(TOOLS_DIR)/protoc-gen-go $(TOOLS_DIR)/protoc-gen-go-grpc $(CONTROLLER_GEN) ## Regenerate protobuf and gRPC code, and the API's DeepCopy methods.
	@hack/ensure-protoc.sh
	PATH=$(TOOLS_DIR):$$PATH protoc -I rpc/proto \
	  --go_out=. --go_opt=module=github.com/catena-streams/catena \
	  --go-grpc_out=. --go-grpc_opt=module=github.com/catena-streams/catena \
	  rpc/proto/catena/v1/catena.proto rpc/proto/catena/v1/aggregator.proto
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs (config/crd/bases) and the operator's RBAC (config/rbac) from api/ and controllers/.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./controllers/..." \
	  output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	rm -f charts/catena/crds/*.yaml
	cp config/crd/bases/*.yaml charts/catena/crds/
	cp config/rbac/role.yaml charts/catena/files/manager-role.yaml

.PHONY: fmt
fmt: ## Format Go code.
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: ## Run go vet and check formatting.
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: verify
verify: ## Fail when generated files are stale (regenerates them, then compares).
	@sum() { { find $(GENERATED) -type f 2>/dev/null || true; } | LC_ALL=C sort | xargs -r sha256sum; }; \
	before=$$(sum); \
	$(MAKE) --no-print-directory generate manifests; \
	after=$$(sum); \
	if [ "$$before" != "$$after" ]; then \
	  diff <(echo "$$before") <(echo "$$after") >&2 || true; \
	  echo "generated files were stale and are now regenerated: review and commit them (make generate manifests)" >&2; \
	  exit 1; \
	fi

##@ Build

.PHONY: build
build: ## Build bin/catena and bin/catenactl.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/catena ./cmd/catena
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/catenactl ./cmd/catenactl

##@ Test

.PHONY: test
test: build lint verify envtest-assets chart-check ## Run unit, integration, fault and envtest API tests, and a short fuzz run.
	KUBEBUILDER_ASSETS=$$(hack/k8s-binaries.sh | tail -1) HELM=$$(hack/helm.sh | tail -1) $(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(MAKE) --no-print-directory test-journal
	$(GO) test -run='^$$' -fuzz=FuzzDecodeBatch -fuzztime=$(FUZZTIME) ./replica/partlog/
	$(GO) test -run='^$$' -fuzz=FuzzScanObject -fuzztime=$(FUZZTIME) ./aggregator/

.PHONY: test-journal
test-journal: ## Run the replica server's tests again with every replica keeping a journal (docs/journal.md).
	CATENA_TEST_JOURNAL=1 $(GO) test -race -count=1 -timeout 15m ./replica/server/

.PHONY: envtest-assets
envtest-assets: ## Build (once, cached per version outside the checkout) kube-apiserver, etcd and kubectl for envtest, and cert-manager's controllers.
	hack/k8s-binaries.sh
	hack/cert-manager/build.sh

.PHONY: helm
helm: ## Build (once, cached per version outside the checkout) helm for chart-check and envtest.
	hack/helm.sh

.PHONY: chart-check
chart-check: ## Lint and render the Helm chart
	@helm=$$(hack/helm.sh | tail -1); \
	"$$helm" lint --strict charts/catena; \
	"$$helm" template catena charts/catena --namespace catena-system --include-crds >/dev/null; \
	"$$helm" template catena charts/catena --namespace catena-system --include-crds \
	  --set replicaCount=2,image.repository=registry.example.com/catena,image.tag=v0.0.1 \
	  --set serviceAccount.create=false,serviceAccount.name=catena-operator,leaderElection.enabled=false \
	  --set metrics.service.enabled=false,logVerbosity=2,priorityClassName=system-cluster-critical \
	  --set nodeSelector.kubernetes\\.io/os=linux,operandImagePullSecrets={regcred} >/dev/null; \
	echo "chart-check: charts/catena lints and renders"

.PHONY: test-faults
test-faults: build ## Run the fault-injection campaign for CATENA_FAULT_DURATION (default 5m; a short one runs in make test).
	CATENA_FAULT_DURATION=$${CATENA_FAULT_DURATION:-5m} $(GO) test -race -count=1 -timeout 60m -run TestFaultCampaign -v ./test/integration/

.PHONY: test-faults-journal
test-faults-journal: build ## The fault-injection campaign with every replica keeping a journal (--journal).
	CATENA_FAULT_JOURNAL=1 CATENA_FAULT_DURATION=$${CATENA_FAULT_DURATION:-5m} $(GO) test -race -count=1 -timeout 60m -run TestFaultCampaign -v ./test/integration/

.PHONY: bench
bench: build ## Run catenactl bench against a fresh catena dev (prints records/s, MiB/s, latency), then keyed over 256 partitions and the ratio (RECORDS, WIDE_PARTITIONS).
	hack/bench.sh

.PHONY: bench-compare
bench-compare: build ## Run the same produce workloads against Catena and a 3-node NATS JetStream (built from the module proxy), alternating; print the table (COMPARE_RECORDS, COMPARE_ROUNDS).
	cd test/bench && $(GO) run ./compare -catena $(CURDIR)/$(BIN)/catena -nats-server "$$($(CURDIR)/hack/nats-peer.sh server | tail -1)" -nats "$$($(CURDIR)/hack/nats-peer.sh cli | tail -1)" \
	  -records $${COMPARE_RECORDS:-200000} -rounds $${COMPARE_ROUNDS:-2} -out $(CURDIR)/$(BIN)/bench-compare.md

.PHONY: bench-catchup
bench-catchup: ## Measure a replacement's copy outside the chain: MiB/s, and producer p99 before and during; the joiner's log on the chain's disk, then under CATENA_CATCHUP_JOINER_DIR (/dev/shm: a disk of its own) (CATENA_CATCHUP_MIB, CATENA_CATCHUP_RATE, CATENA_CATCHUP_CPUPROFILE).
	CATENA_CATCHUP_JOINER_DIR= $(GO) test -run='^$$' -bench=BenchmarkCatchUp -benchtime=1x ./replica/server/
	CATENA_CATCHUP_JOINER_DIR=$${CATENA_CATCHUP_JOINER_DIR:-/dev/shm} $(GO) test -run='^$$' -bench=BenchmarkCatchUp -benchtime=1x ./replica/server/

.PHONY: bench-restore
bench-restore: ## Restore an aggregation shard of 1M keys (snapshot + 2 increments) with a real catena aggregator against catena dev: time to state-ready, replay rate (CATENA_RESTORE_KEYS, CATENA_RESTORE_REPLAY).
	$(GO) test -run='^$$' -bench=BenchmarkAggregatorRestore -benchtime=1x ./test/integration/
	$(GO) test -run='^$$' -bench=BenchmarkRestoreInMemory -benchtime=3x -benchmem ./aggregator/

.PHONY: bench-operator
bench-operator: build envtest-assets ## Fail over 8, 64 and 256 chains on pools of 3 and 6 real replicas through the operator against a real API server: time to reorder (first, p50, last), to whole again, API writes (CATENA_BENCH_REPLICAS, CATENA_BENCH_CHAINS).
	CATENA_BENCH_OPERATOR=1 KUBEBUILDER_ASSETS=$$(hack/k8s-binaries.sh | tail -1) $(GO) test -v -count=1 -timeout 60m ./test/envtest/ -ginkgo.label-filter=bench

.PHONY: bench-micro
bench-micro: ## Run Go micro-benchmarks of the storage and chain paths.
	$(GO) test -run='^$$' -bench=. -skip=BenchmarkCatchUp -benchmem ./replica/...

##@ Tools

$(TOOLS_DIR)/protoc-gen-go:
	GOBIN=$(TOOLS_DIR) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS_DIR)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS_DIR) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Versioned file name, so that changing CONTROLLER_GEN_VERSION reinstalls it.
$(CONTROLLER_GEN):
	GOBIN=$(TOOLS_DIR) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(TOOLS_DIR)/controller-gen $@

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)

##@ End to end (a real Kubernetes of three nodes: hack/knode on this machine, or kind when it is on PATH)

# The image the cluster runs: a tag derived from git, never latest, so that
# pods use the imported image (imagePullPolicy IfNotPresent) and no registry.
IMAGE_REPO     ?= catena
# Evaluated once per make run (VERSION is re-run at each use), so that the
# image built, imported and installed carry the same tag.
ifeq ($(origin IMAGE_TAG),undefined)
IMAGE_TAG      := $(subst +,-,$(VERSION))
endif
IMAGE          ?= $(IMAGE_REPO):$(IMAGE_TAG)
CATENA_NS      ?= catena-system
# The kubeconfig of the test cluster; `make demo` uses $KUBECONFIG instead
# when it is set and reachable.
CLUSTER_KUBECONFIG = $(shell hack/knode/cluster.sh kubeconfig)
HELM_INSTALL = "$$(hack/helm.sh | tail -1)" upgrade --install catena charts/catena \
	  --namespace $(CATENA_NS) --create-namespace --wait --timeout 5m \
	  --set image.repository=$(IMAGE_REPO),image.pullPolicy=IfNotPresent --set-string image.tag=$(IMAGE_TAG) $(HELM_EXTRA)
# Extra helm flags for deploy-local. The e2e suite shortens the node-loss
# grace so that its drain spec moves a replica within a minute.
HELM_EXTRA     ?=
E2E_HELM_EXTRA := --set nodeLoss.grace=45s

.PHONY: cluster-up
cluster-up: ## Bring up the test cluster, CATENA_KNODE_NODES nodes (default 3; builds its binaries once, 10-20 min cold; about 30 s warm).
	hack/knode/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Tear the test cluster down completely (safe to run twice).
	hack/knode/cluster.sh down

.PHONY: image
image: build ## Build the image $(IMAGE) from bin/ without Docker and import it into the test cluster's node.
	hack/knode/cluster.sh image $(IMAGE)

.PHONY: deploy-local
deploy-local: ## Install (or upgrade) the operator from charts/catena with $(IMAGE) into the test cluster.
	KUBECONFIG=$(CLUSTER_KUBECONFIG) $(HELM_INSTALL)

.PHONY: test-e2e
test-e2e: ## Cluster up, image, helm install, the test/e2e suite, cluster down (also when the suite fails).
	@start=$$(date +%s); status=0; \
	{ $(MAKE) --no-print-directory cluster-up && $(MAKE) --no-print-directory image deploy-local IMAGE_TAG=$(IMAGE_TAG) HELM_EXTRA="$(E2E_HELM_EXTRA)" && \
	  KUBECONFIG=$(CLUSTER_KUBECONFIG) CATENA_E2E_IMAGE=$(IMAGE) CATENA_E2E_RELEASE_NAMESPACE=$(CATENA_NS) \
	  CATENA_E2E_CTR="$$(hack/knode/cluster.sh ctr)" CATENA_E2E_NODES="$$(hack/knode/cluster.sh nodes-cmd)" HELM="$$(hack/helm.sh | tail -1)" \
	  KUBECTL="$$(hack/knode/cluster.sh kubectl)" \
	  $(GO) test -tags e2e -count=1 -timeout 40m -v ./test/e2e/... -ginkgo.v; } || status=$$?; \
	$(MAKE) --no-print-directory cluster-down || status=1; \
	echo "test-e2e: exit $$status after $$(( $$(date +%s) - start ))s"; exit $$status

.PHONY: demo
demo: build ## Catena on Kubernetes: cluster (or $KUBECONFIG), image, operator, a Stream and an Aggregation, a failover to watch; runs until make demo-down.
	IMAGE=$(IMAGE) IMAGE_REPO=$(IMAGE_REPO) IMAGE_TAG=$(IMAGE_TAG) CATENA_NS=$(CATENA_NS) hack/knode/demo.sh

.PHONY: demo-down
demo-down: ## Remove what make demo made (and the test cluster, when the demo brought it up).
	CATENA_NS=$(CATENA_NS) hack/knode/demo.sh down
