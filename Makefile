# Tally — developer and CI tasks (GNU make). `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO          ?= go
GOPATH_BIN  := $(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin
STRIPE_MOCK := $(GOPATH_BIN)/stripe-mock
PKGS        ?= ./...
TESTFLAGS   ?=
BENCHFLAGS  ?=
CMDS        := server migrate billingctl stripesim
DB_NAME     ?= tally
IMAGE       ?= tally

# Fuzz targets (no database needed), each as package:target, and how many inputs each
# runs: FUZZTIME in `make fuzz`, FUZZTIME_TEST in `make test`. Counts (Nx), not durations:
# with a duration, Go 1.26's fuzz coordinator can report its own deadline as a failure
# ("context deadline exceeded", no crasher; golang/go#75804, fixed in Go 1.27) when a
# loaded machine starves the workers at the end. New inputs that crash land in
# <package>/testdata/fuzz/<target>/: commit them with the fix.
FUZZ_TARGETS     := ./internal/api/ingest:FuzzUsageEventDecode ./internal/api/ingest:FuzzUsageEventBatchDecode \
                    ./internal/api/ingest:FuzzStripeWebhook ./internal/api/jsonobj:FuzzObjectKeys
FUZZTIME         ?= 100000x
FUZZTIME_TEST    ?= 3000x
FUZZMINIMIZETIME ?= 10s

# fuzz-run runs every fuzz target for $(1), one `go test -fuzz` each.
define fuzz-run
	for pkg_target in $(FUZZ_TARGETS); do \
	  pkg="$${pkg_target%%:*}"; target="$${pkg_target#*:}"; \
	  echo "fuzz: $$target ($$pkg) for $(1)" >&2; \
	  $(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(1) -fuzzminimizetime=$(FUZZMINIMIZETIME) "$$pkg"; \
	done
endef

.PHONY: help test fuzz scale bench chaos failover ha ha-up ha-down vet lint build run migrate docker clean distclean tools pg pg-stop psql

help: ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  %-10s %s\n", $$1, $$2 }'

test: ## go test -race against a real Postgres (+ stripe-mock), then each fuzz target for FUZZTIME_TEST (3,000 inputs); vet is in make lint
	bash scripts/ensure-tools.sh
	admin_url="$$(bash scripts/ensure-postgres.sh)"; \
	echo "make test: Postgres admin URL $$admin_url" >&2; \
	TALLY_TEST_ADMIN_DATABASE_URL="$$admin_url" STRIPE_MOCK_BIN="$(STRIPE_MOCK)" PROMTOOL_BIN="$(GOPATH_BIN)/promtool" HELM_BIN="$(GOPATH_BIN)/helm" OAPI_CODEGEN_BIN="$(GOPATH_BIN)/oapi-codegen" CHROMIUM_BIN="$$(command -v chromium)" CGO_ENABLED=1 \
	  $(GO) test -race -vet=off -count=1 -timeout 9m $(TESTFLAGS) $(PKGS)
	$(call fuzz-run,$(FUZZTIME_TEST))

fuzz: ## run each fuzz target (usage events, batches, Stripe webhooks) for FUZZTIME (100,000 inputs); no database needed
	$(call fuzz-run,$(FUZZTIME))

scale: ## 1,000 customers x 1 period closed at once against the simulator: one PaymentIntent each, amounts = ledger sums
	admin_url="$$(bash scripts/ensure-postgres.sh)"; \
	TALLY_TEST_ADMIN_DATABASE_URL="$$admin_url" TALLY_SCALE_CUSTOMERS=1000 \
	  $(GO) test -count=1 -run 'TestChargeManyCustomers' -v ./internal/jobs/

bench: ## raw baselines, then Tally over HTTP, in one run: a table of ratios, exit 1 on a missed target (BENCHFLAGS=--short, --write-docs, ...)
	admin_url="$$(bash scripts/ensure-postgres.sh)"; \
	TALLY_TEST_ADMIN_DATABASE_URL="$$admin_url" $(GO) run ./tools/bench $(BENCHFLAGS)

chaos: ## the long fault-injection run: real replicas, faults everywhere, independent check (SEED=n to reproduce; CHAOSFLAGS=--pgbouncer)
	bash scripts/ensure-postgres.sh >/dev/null
	$(GO) run ./tools/chaos $(if $(SEED),--seed $(SEED)) $(CHAOSFLAGS)

failover: ## failover drill: replication stalled, primary killed, standby promoted; async then sync, no double charge (SEED=n)
	bash scripts/ensure-postgres.sh >/dev/null
	status=0; \
	$(GO) run ./tools/chaos --failover $(if $(SEED),--seed $(SEED)) || status=1; \
	$(GO) run ./tools/chaos --failover --sync $(if $(SEED),--seed $(SEED)) || status=1; \
	exit $$status

ha: ## pg_auto_failover: the chaos run (sync; the primary's node killed twice, a switchover), then the async failover drill (SEED=n)
	bash scripts/ensure-postgres.sh >/dev/null
	status=0; \
	$(GO) run ./tools/chaos --ha $(if $(SEED),--seed $(SEED)) || status=1; \
	$(GO) run ./tools/chaos --failover --ha $(if $(SEED),--seed $(SEED)) || status=1; \
	exit $$status

ha-up: ## a pg_auto_failover formation on loopback (.tmp/ha: monitor, primary, synchronous secondary; HAFLAGS=--async); prints its multi-host URL
	bash scripts/ensure-postgres.sh >/dev/null
	bash scripts/ha.sh up $(HAFLAGS)

ha-down: ## stop the pg_auto_failover formation (its data stays in .tmp/ha; scripts/ha.sh destroy deletes it)
	bash scripts/ha.sh down

vet: ## go vet
	$(GO) vet $(PKGS)

lint: ## gofmt, go vet, go mod tidy -diff, golangci-lint (.golangci.yml), shellcheck; CI runs it before make test
	bash scripts/ensure-tools.sh lint
	unformatted="$$(find . \( -path ./.git -o -path ./.tmp -o -path ./bin -o -path ./vendor \) -prune \
	  -o -name '*.go' -print0 | xargs -0 -r gofmt -l)"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt -l reports unformatted files:" >&2; echo "$$unformatted" >&2; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) mod tidy -diff
	$(GOPATH_BIN)/golangci-lint run $(PKGS)
	shellcheck -x scripts/*.sh scripts/lib/*.sh .ci/run

build: ## build all binaries into bin/
	mkdir -p bin
	$(GO) build -trimpath -o bin/ $(addprefix ./cmd/,$(CMDS))

run: ## local dev stack: Postgres, migrations, dev API key, stripesim, server (scripts/run-dev.sh)
	bash scripts/run-dev.sh

migrate: ## ensure Postgres + database $(DB_NAME), then migrate up
	mkdir -p .tmp/bin
	$(GO) build -o .tmp/bin/migrate ./cmd/migrate
	db_url="$$(bash scripts/ensure-db.sh $(DB_NAME))"; \
	DATABASE_URL="$$db_url" .tmp/bin/migrate up

docker: ## docker build -t $(IMAGE) .
	docker build -t $(IMAGE) .

tools: ## install stripe-mock into $(GOPATH_BIN)
	bash scripts/ensure-tools.sh

pg: ## ensure a Postgres is available and print its admin URL
	@bash scripts/ensure-postgres.sh

pg-stop: ## stop the private Postgres cluster (.tmp/pg), if running
	bash scripts/stop-postgres.sh

psql: ## psql into the dev database
	db_url="$$(bash scripts/ensure-db.sh $(DB_NAME))"; \
	psql "$$db_url"

clean: ## remove build outputs (keeps the private Postgres data)
	rm -rf bin .tmp/bin coverage* *.out *.test

distclean: clean ## also stop and delete the private Postgres cluster and .tmp/
	bash scripts/stop-postgres.sh --purge
	rm -rf .tmp
