#!/usr/bin/env bash
# The second test broker: Apache Kafka itself (a KRaft node, broker and controller in one
# JVM; or a cluster of N such nodes with a static quorum), pinned, from Maven Central. Tansu
# (scripts/tansu.sh) is the default test broker; WATCHBRIDGE_TEST_BROKER=kafka makes the tests
# use one node, WATCHBRIDGE_TEST_BROKER=kafka3 three replicated ones (docs/brokers.md).
#
#   scripts/kafka.sh install    fetch its jars once into a cache outside the clone (~30 s,
#                               54 MB), else reuse them
#   scripts/kafka.sh path       print the jar dir (installing it if missing); `classpath`
#                               prints the class path to give `java -cp`
#   scripts/kafka.sh start DIR  start one on free loopback ports, config and data in DIR;
#                               prints `127.0.0.1:PORT` once it listens; its pid is in
#                               DIR/kafka.pid
#   scripts/kafka.sh stop DIR   stop the one started in DIR
#   scripts/kafka.sh serve DIR PORT CONTROLLER_PORT [NODE VOTERS CLUSTER_ID]
#                               write DIR/server.properties, format DIR/data unless it was,
#                               and exec the broker in the foreground (what `start` and `run`
#                               do; the Rust fixture runs this under its watchdog). With NODE
#                               (its node.id), VOTERS (`1@127.0.0.1:C1,2@127.0.0.1:C2,...`,
#                               every node's controller) and CLUSTER_ID (the same for every
#                               node): one node of a cluster of as many nodes as VOTERS
#                               names, whose topics get replication factor min(3, nodes) and
#                               min.insync.replicas min(2, nodes), the internal ones too
#   scripts/kafka.sh serve-secured DIR PORT CONTROLLER_PORT SSL MTLS SASL_SSL SASL_PLAINTEXT
#                               `serve`, for a node secured as a production cluster is: the
#                               standard authorizer (no ACL, no access) and a listener for
#                               each kind of client security: PLAINTEXT on PORT (the tests'
#                               own admin door: its anonymous principal is a super user),
#                               SSL (TLS with a private CA), MTLS (TLS with client
#                               certificates; the principal is the certificate's CN),
#                               SASL_SSL and SASL_PLAINTEXT (SCRAM-SHA-512 and PLAIN, and
#                               OAUTHBEARER where KAFKA_OIDC_JWKS_URL names the keys that
#                               sign the JWTs, GSSAPI where KAFKA_KRB5_KEYTAB holds the key
#                               of KAFKA_KRB5_PRINCIPAL of KAFKA_KRB5_CONF's realm). TLS files: DIR/pki/{ca.pem,server.pem,
#                               server.key} (PEM; the key PKCS#8, unencrypted). SASL users
#                               (SCRAM ones made at format time): admin (a super user) and
#                               bridge, passwords admin-secret and bridge-secret; bridge has
#                               no ACL: a test grants what it means to test
#   scripts/kafka.sh start-cluster DIR N
#                               start N nodes (DIR/node-1 ...) on free loopback ports; prints
#                               the bootstrap list `127.0.0.1:P1,127.0.0.1:P2,...` once each
#                               listens; `stop DIR` stops them all
#   scripts/kafka.sh run        run one in the foreground on 127.0.0.1:$KAFKA_PORT (default
#                               9092), data kept in $KAFKA_DATA (default $CACHE/kafka-data)
#
# The cache is $WATCHBRIDGE_CACHE (default ~/.cache/watchbridge); set KAFKA_LIBS to a dir of
# Kafka jars of your own. Needs Java 17+ and Maven (`mvn`, for the download only). Concurrent
# installs wait for the first (flock on a file in the cache). The Rust test fixture
# (tests/support/broker_process.rs) starts its own broker with `serve`.
set -euo pipefail
# Filled for serve-secured: its four ports, and extra arguments of the storage tool's format
# and of the JVM.
SECURED=()
FORMAT_EXTRA=()
JVM_EXTRA=()

KAFKA_VERSION=4.1.1
# Kafka 4.1's slf4j-api is 1.7.36: a 2.x binding would not bind (and it would log nothing).
SLF4J_VERSION=1.7.36
CACHE="${WATCHBRIDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/watchbridge}"
ROOT="$CACHE/kafka-$KAFKA_VERSION"
LIBS="${KAFKA_LIBS:-$ROOT/libs}"
# Modest: the machines this runs on have 2 cores and other builds. A test broker holds a few
# MB of records: every test passes with 512 MB of heap (an idle broker's RSS is ~170 MB; the
# JVM's default heap would be a quarter of the RAM).
KAFKA_HEAP="${KAFKA_HEAP:-512m}"
# shellcheck source=scripts/broker-lib.sh
. "$(dirname "$0")/broker-lib.sh"

need() {
    if ! command -v "$1" >/dev/null; then
        echo "Apache Kafka as the test broker needs \`$1\` ($2); install it (Debian: apt-get install $3)" >&2
        exit 1
    fi
}

# Kafka 4 brokers need Java 17 or newer.
need_java() {
    need java "Java 17 or newer" openjdk-17-jre-headless
    local major
    major="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
    if [ -n "$major" ] && [ "${major%%.*}" -lt 17 ] 2>/dev/null; then
        echo "Apache Kafka $KAFKA_VERSION needs Java 17 or newer; \`java\` is Java $major ($(command -v java))" >&2
        exit 1
    fi
}

installed() {
    [ -f "$LIBS/.complete" ] || { [ -n "${KAFKA_LIBS:-}" ] && [ -d "$LIBS" ]; }
}

fetch() {
    need_java
    need mvn "Maven, to fetch Kafka's jars from Maven Central" maven
    echo "installing Apache Kafka $KAFKA_VERSION into $ROOT (once; about 30 s)" >&2
    local tmp
    tmp="$(mktemp -d "$CACHE/kafka-install.XXXXXX")"
    cat >"$tmp/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>watchbridge</groupId>
  <artifactId>kafka-test-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    if ! mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$tmp/libs" >&2; then
        echo "mvn could not fetch Apache Kafka $KAFKA_VERSION (see above); nothing installed" >&2
        rm -rf "$tmp"
        exit 1
    fi
    # `.complete` marks a whole jar dir.
    touch "$tmp/libs/.complete"
    mkdir -p "$ROOT"
    rm -rf "$LIBS"
    mv "$tmp/libs" "$LIBS"
    rm -rf "$tmp"
}

install() {
    if [ -n "${KAFKA_LIBS:-}" ] && ! installed; then
        echo "KAFKA_LIBS=$KAFKA_LIBS is not a directory (of Kafka's jars)" >&2
        exit 1
    fi
    install_once "kafka-$KAFKA_VERSION" installed fetch
}

classpath() {
    echo "$LIBS/*"
}

# server.properties for one node on 127.0.0.1:PORT (clients) and CPORT (its controller),
# data in DIR/data, formatted once (a dir formatted before keeps its data: a restart). NODE,
# VOTERS and CLUSTER_ID make it one node of a cluster (see `serve` above).
config() {
    local dir="$1" port="$2" cport="$3" node="${4:-1}" voters="${5:-1@127.0.0.1:$3}" cluster_id="${6:-}"
    install
    need_java
    mkdir -p "$dir"
    # As a production cluster of this size would be: three replicas of everything where
    # there are three nodes, and a write acknowledged by all (acks=all) only once two have it.
    local nodes replicas min_isr
    nodes="$(echo "$voters" | tr ',' '\n' | grep -c @)"
    replicas=$((nodes < 3 ? nodes : 3))
    min_isr=$((nodes < 2 ? 1 : 2))
    cat >"$dir/server.properties" <<EOF
# A KRaft node for tests (scripts/kafka.sh): broker and controller in one process, one of
# $nodes.
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
# Every topic, internal ones too, with min(3, nodes) replicas and min.insync.replicas
# min(2, nodes); no unclean leader election (Kafka's default, written down).
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$min_isr
default.replication.factor=$replicas
min.insync.replicas=$min_isr
unclean.leader.election.enable=false
# A follower that stops fetching leaves the in-sync set after 5 s (Kafka's default 30 s),
# and the controller fences a node not heard from for 4 s (default 9 s): how long a record
# may wait above the high watermark, or a paused leader append one, and so how long a
# partition of the bridge waits after a failed delivery or at a takeover, without
# transactions (docs/brokers.md, "Replicated clusters"): 4 + 5 + 5 s of margin.
replica.lag.time.max.ms=5000
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=1000
# A group's first member gets its partitions at once, not after 3 s.
group.initial.rebalance.delay.ms=0
# No topics created by producing to or fetching from a name: like Tansu, and like the
# production clusters the bridge is meant for, where it must create its topics through the
# admin API (or fail naming them). A test that forgot create_topic fails on both brokers.
auto.create.topics.enable=false
# The log cleaner, fast enough for tests: it looks for work every 500 ms (default 15 s).
# Tests that want compaction set segment.ms / segment.bytes, min.cleanable.dirty.ratio and
# delete.retention.ms on their topics; the broker-wide ones stay Kafka's defaults.
log.cleaner.backoff.ms=500
log.cleaner.dedupe.buffer.size=16777216
log.cleaner.threads=1
# No deletion by time: the broker deletes a record once its timestamp is older than
# retention.ms (default 7 days), checked every 5 minutes, and the bridge stamps an output
# with its event time: the tests' fixed event times (scenario::T0, 30 Nov 2026) would make
# their outputs vanish between two reads (docs/brokers.md, "Retention and event time").
log.retention.ms=-1
# Less disk, fewer threads: a test broker.
num.network.threads=2
num.io.threads=2
num.partitions=1
EOF
    [ "${#SECURED[@]}" = 0 ] || secured_config "$dir" "$port" "$cport" "${SECURED[@]}"
    if [ ! -f "$dir/data/meta.properties" ]; then
        # The cluster's id, or a new one (below) for a node of its own.
        local id="${cluster_id:-$(cluster_id)}"
        # With controller.quorum.voters set, format without --standalone.
        # `--cluster-id=` form: an id may begin with `-`, which would read as an option.
        java -cp "$(classpath)" kafka.tools.StorageTool format --cluster-id="$id" \
            -c "$dir/server.properties" "${FORMAT_EXTRA[@]}" >"$dir/format.log" 2>&1 || {
            echo "formatting $dir/data failed:" >&2
            cat "$dir/format.log" >&2
            exit 1
        }
    fi
}

# The users of a secured node (`serve-secured`), for SCRAM-SHA-512 and PLAIN alike.
SECURED_USERS=(admin:admin-secret bridge:bridge-secret)

# Appended to DIR/server.properties for `serve-secured` (a later line wins in a Java
# properties file): a listener for each kind of client security on ports SSL MTLS SASL_SSL
# SASL_PLAINTEXT beside PLAINTEXT's PORT and the controller's CPORT, the authorizer, and the
# SASL users; SCRAM's are added at format time (FORMAT_EXTRA).
secured_config() {
    local dir="$1" port="$2" cport="$3" ssl="$4" mtls="$5" sasl_ssl="$6" sasl_plaintext="$7"
    local pki="$dir/pki" user plain_users="" mechanisms="SCRAM-SHA-512,PLAIN" listener
    for user in ca.pem server.pem server.key; do
        [ -f "$pki/$user" ] || { echo "serve-secured: $pki/$user is missing" >&2; exit 1; }
    done
    for user in "${SECURED_USERS[@]}"; do
        plain_users="$plain_users user_${user%%:*}=\"${user#*:}\""
        FORMAT_EXTRA+=(--add-scram "SCRAM-SHA-512=[name=${user%%:*},password=${user#*:}]")
    done
    [ -z "${KAFKA_OIDC_JWKS_URL:-}" ] || mechanisms="$mechanisms,OAUTHBEARER"
    [ -z "${KAFKA_KRB5_KEYTAB:-}" ] || mechanisms="$mechanisms,GSSAPI"
    # One PEM keystore file: the key, then the certificate chain.
    cat "$pki/server.key" "$pki/server.pem" >"$pki/server.keystore.pem"
    cat >>"$dir/server.properties" <<EOF

# --- secured (scripts/kafka.sh serve-secured): a listener per kind of client security ---
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SSL://127.0.0.1:$ssl,MTLS://127.0.0.1:$mtls,SASL_SSL://127.0.0.1:$sasl_ssl,SASL_PLAINTEXT://127.0.0.1:$sasl_plaintext
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SSL://127.0.0.1:$ssl,MTLS://127.0.0.1:$mtls,SASL_SSL://127.0.0.1:$sasl_ssl,SASL_PLAINTEXT://127.0.0.1:$sasl_plaintext
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT
# The standard authorizer: nothing is allowed that no ACL allows. The anonymous principal
# (PLAINTEXT, CONTROLLER, and SSL without a client certificate) is a super user, as is admin.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=false
# TLS: the server's certificate, signed by the test's private CA, in PEM.
ssl.keystore.type=PEM
ssl.keystore.location=$pki/server.keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$pki/ca.pem
# MTLS: a client certificate is required; the principal is its CN.
listener.name.mtls.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]*).*\$/\$1/,DEFAULT
# SASL, over TLS and over plain TCP.
listener.name.sasl_ssl.sasl.enabled.mechanisms=$mechanisms
listener.name.sasl_plaintext.sasl.enabled.mechanisms=$mechanisms
EOF
    for listener in sasl_ssl sasl_plaintext; do
        cat >>"$dir/server.properties" <<EOF
listener.name.$listener.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.$listener.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$plain_users;
EOF
        if [ -n "${KAFKA_KRB5_KEYTAB:-}" ]; then
            cat >>"$dir/server.properties" <<EOF
listener.name.$listener.gssapi.sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true keyTab="$KAFKA_KRB5_KEYTAB" principal="$KAFKA_KRB5_PRINCIPAL";
EOF
        fi
        if [ -n "${KAFKA_OIDC_JWKS_URL:-}" ]; then
            cat >>"$dir/server.properties" <<EOF
listener.name.$listener.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;
listener.name.$listener.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
EOF
        fi
    done
    if [ -n "${KAFKA_KRB5_KEYTAB:-}" ]; then
        cat >>"$dir/server.properties" <<EOF
# GSSAPI (Kerberos): the node is KAFKA_KRB5_PRINCIPAL (service name kafka) of the realm
# KAFKA_KRB5_CONF describes, its key in KAFKA_KRB5_KEYTAB; a client's principal
# name@REALM is User:name.
sasl.kerberos.service.name=kafka
EOF
        JVM_EXTRA+=("-Djava.security.krb5.conf=$KAFKA_KRB5_CONF")
    fi
    if [ -n "${KAFKA_OIDC_JWKS_URL:-}" ]; then
        cat >>"$dir/server.properties" <<EOF
# OAUTHBEARER: a JWT is valid if the keys at this endpoint signed it and its audience is
# kafka; its sub names the principal. (Kafka 4 fetches only the URLs that the JVM property
# org.apache.kafka.sasl.oauthbearer.allowed.urls allows: serve sets it.)
sasl.oauthbearer.jwks.endpoint.url=$KAFKA_OIDC_JWKS_URL
sasl.oauthbearer.expected.audience=kafka
EOF
        JVM_EXTRA+=("-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=$KAFKA_OIDC_JWKS_URL")
    fi
}

# Runs the broker for DIR in this process (exec, so a pid taken before is the JVM's), on
# PORT and CPORT, after writing its config (and formatting DIR/data the first time).
serve() {
    local dir="$1"
    config "$@"
    cd "$dir"
    # Serial GC and C1 only: fewer threads and less JIT work on a 2-core machine.
    exec java "-Xmx$KAFKA_HEAP" -Xms64m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "${JVM_EXTRA[@]}" \
        -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$(classpath)" \
        kafka.Kafka "$dir/server.properties"
}

start() {
    local dir="$1"
    mkdir -p "$dir"
    local port cport
    port="$(free_port)"
    cport="$(free_port)"
    while [ "$cport" = "$port" ]; do cport="$(free_port)"; done
    install
    (serve "$dir" "$port" "$cport" >"$dir/kafka.log" 2>&1) &
    echo $! >"$dir/kafka.pid"
    # The JVM takes ~7 s to listen (longer on a busy machine).
    wait_listening kafka "$port" "$dir" 60
}

# A cluster id: 16 random bytes, base64url without padding (what `StorageTool random-uuid`
# prints, without starting a second JVM for it). Not one that starts with `-`, which the
# tool would take for an option (Kafka's own ids never do).
cluster_id() {
    local id=-
    while [ "${id#-}" != "$id" ]; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    done
    echo "$id"
}

start_cluster() {
    local dir="$1" n="$2" i voters="" id bootstrap=""
    install
    local ports=() cports=()
    for i in $(seq 1 "$n"); do
        ports+=("$(free_port)")
        cports+=("$(free_port)")
        voters="${voters:+$voters,}$i@127.0.0.1:${cports[$((i - 1))]}"
    done
    id="$(cluster_id)"
    for i in $(seq 1 "$n"); do
        mkdir -p "$dir/node-$i"
        (serve "$dir/node-$i" "${ports[$((i - 1))]}" "${cports[$((i - 1))]}" "$i" "$voters" "$id" \
            >"$dir/node-$i/kafka.log" 2>&1) &
        echo $! >"$dir/node-$i/kafka.pid"
    done
    # A node listens once its quorum has formed: every node must be running first.
    for i in $(seq 1 "$n"); do
        bootstrap="${bootstrap:+$bootstrap,}$(wait_listening kafka "${ports[$((i - 1))]}" "$dir/node-$i" 90)"
    done
    echo "$bootstrap"
}

stop_cluster() {
    local dir="$1" node
    stop_started kafka "$dir"
    for node in "$dir"/node-*; do
        [ -d "$node" ] && stop_started kafka "$node"
    done
    return 0
}

run() {
    local port="${KAFKA_PORT:-9092}"
    local cport="${KAFKA_CONTROLLER_PORT:-$((port + 1))}"
    local data="${KAFKA_DATA:-$CACHE/kafka-data}"
    for p in "$port" "$cport"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "port $p is in use (is a broker already running?); set KAFKA_PORT (and KAFKA_CONTROLLER_PORT) to others" >&2
            exit 1
        fi
    done
    install
    echo "Apache Kafka $KAFKA_VERSION on 127.0.0.1:$port (controller :$cport), data in $data; Ctrl-C stops it" >&2
    serve "$data" "$port" "$cport"
}

case "${1:-}" in
    install) install ;;
    path) install; echo "$LIBS" ;;
    classpath) install; classpath ;;
    serve-secured)
        SECURED=("${5:?SSL port}" "${6:?MTLS port}" "${7:?SASL_SSL port}" "${8:?SASL_PLAINTEXT port}")
        serve "${2:?usage: $0 serve-secured DIR PORT CONTROLLER_PORT SSL MTLS SASL_SSL SASL_PLAINTEXT}" "${3:?port}" "${4:?controller port}" ;;
    serve) serve "${2:?usage: $0 serve DIR PORT CONTROLLER_PORT [NODE VOTERS CLUSTER_ID]}" "${3:?port}" "${4:?controller port}" "${@:5}" ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    start-cluster) start_cluster "${2:?usage: $0 start-cluster DIR N}" "${3:?number of nodes}" ;;
    stop) stop_cluster "${2:?usage: $0 stop DIR}" ;;
    run) run ;;
    *) echo "usage: $0 install|path|classpath|serve DIR PORT CPORT [NODE VOTERS CLUSTER_ID]|start DIR|start-cluster DIR N|stop DIR|run" >&2; exit 2 ;;
esac
