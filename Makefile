# watchbridge — the commands in the README. Everything they need is installed by `make setup`,
# which the other targets run first.

CARGO ?= cargo

.PHONY: setup build demo test lint bench-smoke bench

# The Rust toolchain comes with the machine; rustfmt and clippy are rustup components.
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy

build: setup
	$(CARGO) build --release

# The main job. Until the Kafka runtime lands (issue 4) this is the engine on simulated feeds.
demo: build
	./target/release/watchbridge demo

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

# Proves the benchmark still runs, with tiny sizes; not a performance measurement.
bench-smoke: setup
	BENCH_SMOKE=1 $(CARGO) bench --bench engine

test: lint bench-smoke
	$(CARGO) test

# The real figures: 1,000,000 watches. Takes a minute or two.
bench: setup
	$(CARGO) bench --bench engine
