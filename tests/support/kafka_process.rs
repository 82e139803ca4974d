//! Apache Kafka (`scripts/kafka.sh`: a pinned release from Maven Central, one KRaft node
//! that is broker and controller) as a [`BrokerProcess`], the second test broker
//! (`WATCHBRIDGE_TEST_BROKER=kafka`, docs/brokers.md); or a cluster of such nodes with a
//! static quorum, one [`BrokerProcess`] each (`WATCHBRIDGE_TEST_BROKER=kafka3`), whose topics
//! get three replicas and `min.insync.replicas=2`. Its data is Kafka's own log dir, so a
//! [`BrokerProcess::restart`] keeps topics, records, committed offsets and transactions.
//!
//! Only std and rdkafka, like `broker_process.rs`.

use super::broker_process::{free_ports, installed_path, BrokerProcess, Launch};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

impl BrokerProcess {
    /// Kafka on two free loopback ports (clients, controller) with its config and data in a
    /// new temp dir named `prefix…`, once it answers. The JVM takes ~7 s to start, more on a
    /// busy machine.
    pub fn kafka(prefix: &str) -> Result<BrokerProcess, String> {
        Self::kafka_on(prefix, None)
    }

    /// [`BrokerProcess::kafka`] on the given ports (clients, controller) or free ones.
    pub fn kafka_on(prefix: &str, on: Option<&[u16]>) -> Result<BrokerProcess, String> {
        let command = serve(&[]);
        BrokerProcess::start(&launch(prefix, &command, on))
    }

    /// A cluster of `nodes` Kafka nodes (each broker and controller, node ids 1..=nodes, a
    /// static quorum), each on two free loopback ports with its config and data in a dir of
    /// its own, once every node answers. A node's [`BrokerProcess::restart`] brings it back
    /// into the cluster with its data.
    pub fn kafka_cluster(prefix: &str, nodes: usize) -> Result<Vec<BrokerProcess>, String> {
        let started = Instant::now();
        let ports = free_ports(2 * nodes);
        let voters = (1..=nodes)
            .map(|node| format!("{node}@127.0.0.1:{}", ports[2 * node - 1]))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_id = cluster_id();
        let mut cluster: Vec<BrokerProcess> = (1..=nodes)
            .map(|node| {
                let extra = [node.to_string(), voters.clone(), cluster_id.clone()];
                let command = serve(&extra);
                let dir: PathBuf = tempfile::Builder::new()
                    .prefix(&format!("{prefix}node{node}-"))
                    .tempdir()
                    .unwrap_or_else(|e| panic!("create a temp dir for kafka node {node}: {e}"))
                    .keep();
                let launch = launch(prefix, &command, None);
                BrokerProcess::spawn(&launch, dir, &ports[2 * (node - 1)..2 * node])
            })
            .collect();
        // A node answers only once a quorum of controllers runs: all were started above.
        for (i, node) in cluster.iter_mut().enumerate() {
            node.wait_ready().map_err(|log| {
                format!(
                    "kafka node {} of {nodes} did not start on {} (dir {}); the end of its \
                     log:\n{log}",
                    i + 1,
                    node.bootstrap,
                    node.dir.display()
                )
            })?;
        }
        eprintln!(
            "kafka: {nodes} nodes listening on {} after {:.1?}",
            cluster
                .iter()
                .map(|n| n.bootstrap.as_str())
                .collect::<Vec<_>>()
                .join(","),
            started.elapsed()
        );
        Ok(cluster)
    }
}

/// How the fixture runs a Kafka node.
fn launch<'a>(
    prefix: &'a str,
    command: &'a dyn Fn(&Path, &[u16]) -> Vec<OsString>,
    on: Option<&'a [u16]>,
) -> Launch<'a> {
    Launch {
        name: "kafka",
        prefix,
        ports: 2,
        start_timeout: Duration::from_secs(90),
        command,
        on,
    }
}

/// `scripts/kafka.sh serve DIR PORT CONTROLLER_PORT` plus `extra` (a cluster node's id,
/// voters and cluster id), as a command line given the dir and ports.
fn serve(extra: &[String]) -> impl Fn(&Path, &[u16]) -> Vec<OsString> {
    // Installs the jars once (progress on the terminal), before the watchdog runs `serve`,
    // whose output goes to the broker's log.
    installed_path("kafka.sh", "or set KAFKA_LIBS to a dir of Kafka's jars");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh");
    let extra = extra.to_vec();
    move |dir: &Path, ports: &[u16]| -> Vec<OsString> {
        // `serve` writes server.properties, formats the data dir the first time, and execs
        // the JVM (so the pid the watchdog records is Kafka's).
        let mut command: Vec<OsString> = vec!["bash".into(), script.clone().into()];
        command.push("serve".into());
        command.push(dir.into());
        command.extend(ports.iter().map(|p| p.to_string().into()));
        command.extend(extra.iter().map(OsString::from));
        command
    }
}

/// A KRaft cluster id: 16 random bytes, base64url without padding, not starting with `-`.
fn cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("read /dev/urandom");
    // 128 bits in 22 characters of 6 bits (the last one carries 2).
    let bits = u128::from_be_bytes(bytes);
    let mut id: String = (0..22)
        .map(|i| {
            let shift = 128i32 - 6 * (i + 1);
            let index = if shift >= 0 {
                (bits >> shift) & 63
            } else {
                (bits << -shift) & 63
            };
            ALPHABET[index as usize] as char
        })
        .collect();
    if id.starts_with('-') {
        id.replace_range(0..1, "A");
    }
    id
}

/// The listeners of a secured node ([`BrokerProcess::kafka_secured`]), each a `host:port`.
#[derive(Debug, Clone)]
pub struct SecuredListeners {
    /// The tests' own admin door: its anonymous principal is a super user.
    pub plaintext: String,
    /// TLS with the test's private CA, no client certificate.
    pub ssl: String,
    /// TLS with a client certificate required; the principal is its CN.
    pub mtls: String,
    /// SASL (SCRAM-SHA-512, PLAIN, and OAUTHBEARER where a JWKS URL was given) over TLS.
    pub sasl_ssl: String,
    /// The same mechanisms over plain TCP.
    pub sasl_plaintext: String,
}

impl BrokerProcess {
    /// One Kafka node secured as a production cluster is (`scripts/kafka.sh serve-secured`):
    /// the standard authorizer and a listener per kind of client security. `pki` is the
    /// CA's, the server certificate's and its key's PEM text; with `jwks_url`, OAUTHBEARER
    /// tokens signed by the keys there are accepted (the endpoint must answer before the
    /// node starts); `env`, more of the script's settings (`KAFKA_KRB5_*` for GSSAPI).
    pub fn kafka_secured(
        prefix: &str,
        pki: [String; 3],
        jwks_url: Option<&str>,
        env: &[(&str, String)],
    ) -> Result<(BrokerProcess, SecuredListeners), String> {
        installed_path("kafka.sh", "or set KAFKA_LIBS to a dir of Kafka's jars");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh");
        let jwks_url = jwks_url.map(str::to_string);
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let command = move |dir: &Path, ports: &[u16]| -> Vec<OsString> {
            // The TLS files, where serve-secured looks for them.
            let files = dir.join("pki");
            std::fs::create_dir_all(&files).expect("create the node's pki dir");
            for (name, text) in ["ca.pem", "server.pem", "server.key"].iter().zip(&pki) {
                std::fs::write(files.join(name), text).expect("write a pki file");
            }
            let mut command: Vec<OsString> = vec!["env".into()];
            if let Some(url) = &jwks_url {
                command.push(format!("KAFKA_OIDC_JWKS_URL={url}").into());
            }
            command.extend(env.iter().map(Into::into));
            command.extend(["bash".into(), script.clone().into(), "serve-secured".into()]);
            command.push(dir.into());
            command.extend(ports.iter().map(|p| p.to_string().into()));
            command
        };
        let launch = Launch {
            name: "kafka",
            prefix,
            ports: 6,
            start_timeout: Duration::from_secs(90),
            command: &command,
            on: None,
        };
        let process = BrokerProcess::start(&launch)?;
        let port = |i: usize| -> String {
            let ports = std::fs::read_to_string(process.dir.join("server.properties"))
                .expect("the node's server.properties");
            // advertised.listeners names every client listener with its port.
            let name = ["PLAINTEXT", "", "SSL", "MTLS", "SASL_SSL", "SASL_PLAINTEXT"][i];
            ports
                .lines()
                .rfind(|l| l.starts_with("advertised.listeners="))
                .and_then(|l| {
                    l.split(['=', ','])
                        .find_map(|e| e.strip_prefix(&format!("{name}://")))
                })
                .unwrap_or_else(|| panic!("no {name} listener in server.properties"))
                .to_string()
        };
        let listeners = SecuredListeners {
            plaintext: port(0),
            ssl: port(2),
            mtls: port(3),
            sasl_ssl: port(4),
            sasl_plaintext: port(5),
        };
        Ok((process, listeners))
    }
}
