.DEFAULT_GOAL := help
GO ?= go
GOLANGCI_LINT_VERSION ?= v2.15.0

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The race detector's runtime sleeps a second at the exit of each test
# binary (atexit_sleep_ms, 1000 by default), a second a package spent idle.
# Races are still reported as they happen and fail the package; GORACE in
# the environment adds to this or overrides it.

.PHONY: test
test: ## install or start what the tests need (scripts/test-deps), then run every test with the race detector, against a real PostgreSQL (TEST_DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster)
	@scripts/test-deps
	GORACE="atexit_sleep_ms=0 $$GORACE" $(GO) test -race -count=1 ./...

# Ctrl-C in a terminal interrupts its foreground process group. go run would
# exit 1 on it, and make, interrupted too, would end with it; so the demo is
# built, then run with job control on (set -m) when there is a terminal: the
# shell gives the demo a process group of its own and the terminal's
# foreground, Ctrl-C reaches the demo alone, and make exits with its status.
.PHONY: demo
demo: build ## deliver sample webhooks and mail to receivers in the process, on a throwaway PostgreSQL (or DATABASE_URL)
	@if [ -t 0 ]; then set -m; fi; bin/pgdispatch demo

.PHONY: bench
bench: ## run the default benchmark set (about 3 minutes) on a throwaway PostgreSQL, or DATABASE_URL
	$(GO) run ./cmd/pgdispatch bench

.PHONY: soak
soak: ## run writers and a worker for 10 minutes and report the jobs table's size and dead rows; then the fault suite, 2 minutes a scenario
	RETAIN_DONE=1m SWEEP_INTERVAL=10s $(GO) run ./cmd/pgdispatch bench --scenario soak
	log=$$(mktemp); E2E_DURATION=2m $(GO) test -count=1 -timeout 60m -v ./e2e/ >$$log 2>&1; status=$$?; \
		grep -E '^(---|ok|FAIL)|summary' $$log; echo "full output: $$log"; exit $$status

.PHONY: build
build: ## build bin/pgdispatch
	$(GO) build -o bin/pgdispatch ./cmd/pgdispatch

.PHONY: fuzz
fuzz: ## fuzz the payload parsers for 30 s each
	$(GO) test -run '^$$' -fuzz FuzzPayloadDuration -fuzztime 30s ./executors/
	for p in httpcallback rabbitmq email; do $(GO) test -run '^$$' -fuzz FuzzValidate -fuzztime 30s ./executors/$$p/ || exit 1; done

.PHONY: lint
lint: ## gofmt, go vet and golangci-lint
	@test -z "$$(gofmt -l .)" || (gofmt -l .; echo "gofmt: the files above need formatting"; exit 1)
	$(GO) vet ./...
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run ./...
