# Common tasks. `make` or `make help` lists them.
.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## run the tests against a real PostgreSQL, with the race detector (what CI runs)
	go test -race -count=1 -p 1 -timeout 40m ./...

ci: ## run CI locally: start PostgreSQL if needed, gofmt, vet, tests, examples
	bash .ci/run

fmt: ## format the code
	gofmt -w .

vet: ## go vet
	go vet ./...

bench: ## pgoutbox's benchmark program, workload W=W1..W5 (MODE=bitmap|counter|offset for a PUB_SUB topic)
	cd bench && go run ./cmd/pgoutbox -workload $(or $(W),W2) $(if $(MODE),-mode $(MODE))

peers: ## pgoutbox beside raw pgx, River and Watermill-SQL, every workload, 3 runs (bench/README.md)
	bash bench/run.sh

router-bench: ## router overhead against direct HTTP calls (no-op and 2 ms receivers)
	go test -run '^$$' -bench 'Deliver' -benchtime 20000x ./router

.PHONY: help test ci fmt vet bench peers router-bench
