# watchbridge — the commands in the README. Everything they need is installed by `make setup`,
# which the other targets run first.

CARGO ?= cargo

.PHONY: setup build demo test test-kafka lint bench-smoke bench bench-peer-install broker broker-install chaos chaos-short chaos-shared-keys

# Debian packages the build needs: rdkafka's `ssl` feature links OpenSSL, `gssapi` Cyrus SASL
# and `curl` libcurl (OAUTHBEARER/OIDC), each found by pkg-config; and the tests': a
# Prometheus server (/usr/bin/prometheus) that tests/prometheus.rs starts on a free loopback
# port (where services may start, the package also starts its own daemon on :9090; the tests
# never use it), and a Compose client, `docker-compose` (1.29), whose
# `config -q` validates deploy/docker-compose.yml in tests/ops_files.rs (no Docker engine
# needed; that test fails where no Compose client is installed).
# MIT Kerberos for tests/secured.rs's GSSAPI login: a KDC of the test's own (krb5kdc,
# kdb5_util: krb5-kdc; kadmin.local: krb5-admin-server), kinit, which librdkafka runs for its
# tickets (krb5-user), and Cyrus SASL's GSSAPI plugin (libsasl2-modules-gssapi-mit).
DEB_PACKAGES = libssl-dev libsasl2-dev libcurl4-openssl-dev pkg-config prometheus docker-compose \
	krb5-kdc krb5-admin-server krb5-user libsasl2-modules-gssapi-mit

# The Rust toolchain comes with the machine; rustfmt and clippy are rustup components.
# Missing Debian packages are installed with apt-get (as root, else through sudo), without
# their recommended packages (Prometheus would bring its node exporter).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@if command -v dpkg >/dev/null; then \
		missing=; \
		for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then \
			if [ "$$(id -u)" = 0 ]; then sudo=; \
			elif command -v sudo >/dev/null; then sudo=sudo; \
			else echo "missing Debian packages:$$missing; install them as root"; exit 1; fi; \
			echo "installing Debian packages:$$missing"; \
			$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
		fi; \
	fi
	@# Apache Kafka, the second test broker (scripts/kafka.sh), runs on Java 17+ and its jars
	@# are fetched with Maven; the Java peer of the vs_java benchmark (bench/java/) is compiled
	@# with javac, hence the JDK. The machine's own are used where there are some.
	@if ! { command -v java && command -v javac && command -v mvn; } >/dev/null && command -v apt-get >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
		echo "installing Debian packages: openjdk-17-jdk-headless maven"; \
		$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven; \
	fi
	@# The Python benchmark (bench/python/, smoke-run by make test), the Avro interop tests'
	@# tool (tests/python/, tests/avro_interop.rs) and the object-store tests' S3 server (moto,
	@# tests/moto/, tests/pollers_object_store.rs) each make a venv (scripts/python-venv.sh), so
	@# python3 needs its venv module: Debian's python3-venv, unless a python3 of its own has it.
	@# Their packages are all wheels from PyPI (no compiler or -dev package needed).
	@if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && command -v apt-get >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
		echo "installing Debian packages: python3 python3-venv"; \
		$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv; \
	fi

# The Kafka-protocol brokers the Kafka tests run against (docs/brokers.md), installed once
# into a cache outside the clone: Tansu, built from crates.io (about 10 minutes the first
# time), and Apache Kafka, its jars fetched from Maven Central with `mvn` (about 30 s, 54 MB;
# it runs on Java 17+; both come with the machine, `setup` installs them from Debian where
# they don't). Later runs reuse both.
broker-install: setup
	scripts/tansu.sh install
	scripts/kafka.sh install

# A broker in the foreground on 127.0.0.1:9092, for running the bridge against a real broker
# by hand: Tansu (TANSU_PORT to change the port), or Apache Kafka with BROKER=kafka
# (KAFKA_PORT; its controller listens on the port after it).
# (BROKER also picks the broker of `make chaos`; the tests read WATCHBRIDGE_TEST_BROKER.)
BROKER ?= $(or $(WATCHBRIDGE_TEST_BROKER),tansu)
# (Each script installs its broker first if it must.)
broker: setup
	@case "$(BROKER)" in \
		tansu|kafka) ;; \
		*) echo "BROKER=$(BROKER): not a test broker; use tansu (the default) or kafka"; exit 2 ;; \
	esac
	scripts/$(BROKER).sh run

build: setup
	$(CARGO) build --release

# The real bridge end to end in one process, nothing to set up: an embedded Kafka broker, a
# local HTTP API of growing per-user feeds, a live view of what reaches the output topic, and
# a summary that checks it (about 25 s; Ctrl-C ends it early).
demo: build
	./target/release/watchbridge demo

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	@# The library's documentation: every public item documented (`#![deny(missing_docs)]`)
	@# and every link resolved.
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

# The vs_java benchmark's peer, the watchbridge job on the plain Kafka Java client
# (bench/java/NaiveBridge.java), compiled once into the cache against the client jars of the
# Apache Kafka install (scripts/java-peer.sh; a few seconds).
bench-peer-install: broker-install
	scripts/java-peer.sh install

# Proves the benchmarks still run, with tiny sizes; not a performance measurement. The e2e
# one runs against the test broker (Tansu), vs_java, guarantee and recovery_cost against
# Apache Kafka, hence broker-install first. Built in the dev profile, which the tests' build
# shares: an optimised build of its own would cost `make test` a second compile of every
# crate (`make bench` measures in the bench profile).
BENCH_SMOKE_BENCHES = engine scale restore recovery_cost e2e vs_python vs_java guarantee object_store
bench-smoke: setup broker-install bench-peer-install
	for b in $(BENCH_SMOKE_BENCHES); do BENCH_SMOKE=1 $(CARGO) bench --profile dev --bench $$b || exit 1; done

# Every test on Tansu (the default test broker), then the tests that use a broker again on
# Apache Kafka (test-kafka; docs/brokers.md). How the time splits, measured on the 2-core
# machine, test binaries built and brokers installed (quiet machine; in brackets with other
# builds running, load 6-12):
#   on Tansu   ~3.2 min [3.9]: cargo test 150 s [185] (bridge 42 s, watermarks 22 s,
#              prometheus 14 s, avro 13 s, unit tests 11 s, brokers 11 s, cli 11 s,
#              avro_interop 10 s, ops 7 s, kafka_broker 3 s, the rest < 1 s; the Avro
#              tests' Python venv is made once, ~30 s), chaos-short 38 s [39],
#              chaos-shared-keys ~63 s (issue 51)
#   on Kafka   ~3 min [4]: the broker test binaries 135 s [166] (each starts its own
#              Kafka: 8-20 s of JVM start; repartition ~25 s more, long_lived ~25 s), compaction 50 s [62]
#   on three Kafka nodes ~5 min: replicated ~60 s, offline_partition ~30 s, ownership
#              ~60 s, chaos-short in exactly_once and in recovery ~150 s each (node
#              kills and pauses)
# (make test took 2,118 s in all on 2026-12-07 on a clean clone, the build of every crate
# included: lint 215 s, bench-smoke 423 s (scale 83, vs_java 99, guarantee 44), on Tansu
# 690 s with both chaos-short runs, on Kafka 785 s of which chaos-short on three nodes
# 297 s; the dev profile keeps line tables only, so linking ~40 test and bench binaries is
# 3x quicker than with full debug info)
# plus lint and bench-smoke (dev profile), and once per machine the installs: Tansu ~10 min
# (a cargo build; ~60 min beside other builds), Kafka ~25 s (jars from Maven Central).
test: lint broker-install bench-smoke
	WATCHBRIDGE_TEST_BROKER=tansu $(CARGO) test
	$(MAKE) chaos-short BROKER=tansu
	@# Once more with an output topic of another partition count: outputs placed by key and
	@# told apart by their `wb-id` header (the default, as many partitions, needs none).
	WATCHBRIDGE_TEST_BROKER=tansu CHAOS_OUTPUT_PARTITIONS=6 $(CHAOS_SHORT)
	@# Once more with every input on two partitions: through the repartition topic (~60 s).
	$(MAKE) chaos-shared-keys BROKER=tansu
	$(MAKE) test-kafka

# The test binaries that use a broker, each run on Apache Kafka (one Kafka per binary, ~10 s
# to start): the fixture's own tests, what differs between the brokers (brokers.rs), the
# bridge, watermarks, operations and Prometheus tests (with WATCHBRIDGE_GUARANTEE=auto,
# which picks exactly_once on Kafka), who owns a watch (ownership.rs: a zombie in the
# recovery mode), the library examples (examples.rs, ~18 s), and the topics the bridge
# creates (topics.rs; with WATCHBRIDGE_TEST_BROKER=kafka3 on a three-node cluster); then compaction.rs and exactly_once.rs, which only Kafka can run (its log
# cleaner, its transactions), the tests that need three Kafka nodes, and the short fault test on three nodes in both modes, each with a zombie
# episode and a broker pause under load. (lifecycle.rs, the start and stop with the brokers
# away, runs on Tansu only in `make test`: on Kafka each of its tests starts a Kafka of its
# own, ~100 s; `WATCHBRIDGE_TEST_BROKER=kafka cargo test --test lifecycle` runs it there.)
KAFKA_TESTS = kafka_broker brokers bridge watermarks ops prometheus ownership examples topics upgrades repartition long_lived
test-kafka: setup
	scripts/kafka.sh install
	WATCHBRIDGE_TEST_BROKER=kafka $(CARGO) test $(KAFKA_TESTS:%=--test %)
	WATCHBRIDGE_TEST_BROKER=kafka $(CARGO) test --test compaction --test exactly_once -- --ignored
	@# On three nodes (issue 46; ~10 s to start a cluster per binary): a follower paused
	@# under a failed delivery (replicated.rs, ~60 s), an offline output partition
	@# (offline_partition.rs, ~30 s), a revocation that gives up on a stalled output leader
	@# (ownership.rs, ~60 s; on one node that test skips itself).
	WATCHBRIDGE_TEST_BROKER=kafka3 $(CARGO) test --test replicated --test offline_partition -- --include-ignored
	WATCHBRIDGE_TEST_BROKER=kafka3 $(CARGO) test --test ownership -- a_revocation_that_gives_up
	@# The fault test's short form on three Kafka nodes with node episodes (a node killed,
	@# paused, its leadership moved), in exactly_once then recovery (~2.5 min each).
	$(MAKE) chaos-short BROKER=kafka3

# The fault test (issue 6): SIGKILLs the bridge at random moments (CHAOS_KILLS, default 10)
# while it watches CHAOS_USERS (default 20) growing HTTP feeds, runs two instances and kills
# one, crashes and restarts the broker, then compares the output topic with the ground truth
# and prints one `chaos:` summary line (lost, duplicated, expected, restarts, ...); fails
# unless every expected output is there exactly once with its event time and no watermark
# went back. About 100 s plus the build. `make test` runs a short form (chaos-short: 3
# kills, still with the two-instance kill and the broker restart) on each broker, and once
# more on Tansu with CHAOS_OUTPUT_PARTITIONS=6 (an output topic of another partition count
# than the input's: outputs placed by key, with `wb-id`); BROKER=kafka runs either on
# Apache Kafka, BROKER=kafka3 on three replicated Kafka nodes with node episodes (a node
# killed, paused, its leadership moved; docs/brokers.md, "Replicated clusters").
# On Apache Kafka (kafka, kafka3) each runs once per mode, exactly_once then recovery
# (CHAOS_GUARANTEES); Tansu has no transactions, so there `auto` (it takes recovery).
CHAOS_KILLS ?= 10
CHAOS_USERS ?= 20
CHAOS_SHARED_KEYS ?= 0
CHAOS_GUARANTEES ?= $(if $(filter kafka kafka3,$(BROKER)),exactly_once recovery,auto)
chaos: broker-install
	for g in $(CHAOS_GUARANTEES); do \
	  WATCHBRIDGE_TEST_BROKER=$(BROKER) CHAOS_GUARANTEE=$$g CHAOS_KILLS=$(CHAOS_KILLS) CHAOS_USERS=$(CHAOS_USERS) CHAOS_SHARED_KEYS=$(CHAOS_SHARED_KEYS) $(CARGO) test --test chaos -- --ignored --nocapture || exit 1; \
	done

CHAOS_SHORT = CHAOS_KILLS=3 CHAOS_USERS=8 $(CARGO) test --test chaos -- --ignored --nocapture
chaos-short:
	$(MAKE) chaos CHAOS_KILLS=3 CHAOS_USERS=8

# The fault test whose inputs share watch keys across input partitions (issue 51): each
# user's input on two partitions under two record keys, WATCHBRIDGE_WATCH_KEY set, so the
# inputs go through the repartition topic; the same kills, zombie and broker episodes, the
# same verdict (each output once, no watermark back). Short form, on BROKER.
chaos-shared-keys:
	$(MAKE) chaos CHAOS_KILLS=3 CHAOS_USERS=8 CHAOS_SHARED_KEYS=1

# The real figures, written to bench/RESULTS.md (one summary table of every target, then a
# section per bench, kept in bench/results/) and the summary printed: the engine with
# 1,000,000 watches (memory, no-op polls/s, poll start lateness), the whole bridge's memory
# per watch and per seen output, restoring 100,000 watches x 100 seen outputs, what a
# partition's recovery reads back after its neighbours wrote 1,000,000 outputs (recovery_cost,
# on Apache Kafka), end-to-end throughput against a plain producer on Tansu, and the same
# job written in Python with confluent-kafka (its venv is made once by
# scripts/python-venv.sh), and the same job on the plain Kafka Java client against Apache
# Kafka, with a SIGKILL and restart of each (vs_java; castorm's Kafka Connect HTTP source,
# the peer first meant, is not on Maven Central). About 75 minutes (73 minutes of sections on 2026-12-07). A dirty tree is refused
# (BENCH_DIRTY=1 prints without recording); scripts/bench.sh says how load is handled.
# `make bench BENCHES="e2e vs_python"` runs some of them.
BENCHES ?=
bench: setup broker-install bench-peer-install
	scripts/bench.sh $(BENCHES)
