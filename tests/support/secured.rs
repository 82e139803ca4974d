//! One Apache Kafka node secured as production clusters are (`scripts/kafka.sh
//! serve-secured`), shared by the tests of a binary as its [`broker()`]: the standard
//! authorizer, and a listener per kind of client security — TLS with a private CA, mutual
//! TLS, SASL (SCRAM-SHA-512, PLAIN, OAUTHBEARER) over TLS and over plain TCP — beside a
//! PLAINTEXT one whose anonymous principal is a super user, for the tests' own clients
//! (topics, inputs, reading outputs back, granting ACLs). A local OpenID Connect token
//! endpoint (tests/python/oidc_server.py) issues the OAUTHBEARER tokens the node checks
//! against its keys.
//!
//! [`broker()`]: super::kafka::broker

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::broker_process::BrokerProcess;
use super::kafka::{broker_from, Broker};
use super::kafka_process::SecuredListeners;
use super::kerberos::{Kdc, REALM};
use super::python::venv_python;
use super::tls::Pki;
use super::watchdog;

/// The SCRAM and PLAIN user the bridge logs in as (`serve-secured` makes it).
pub const SASL_USER: (&str, &str) = ("bridge", "bridge-secret");
/// The common name of the bridge's client certificate: its principal under mutual TLS.
pub const MTLS_USER: &str = "bridge-mtls";
/// The OIDC client the bridge gets its tokens as; the token's `sub`, so the principal.
pub const OIDC_CLIENT: (&str, &str) = ("bridge-oidc", "bridge-oidc-secret");

/// How the bridge logs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// TLS, the broker's certificate checked against the private CA; no client certificate
    /// (the node's anonymous principal, a super user there).
    Tls,
    /// TLS with a client certificate, whose CN is the principal.
    MutualTls,
    /// SASL/SCRAM-SHA-512 over TLS.
    Scram,
    /// SASL/PLAIN over TLS, the password read from a file (`KAFKA_SASL_PASSWORD_FILE`).
    Plain,
    /// SASL/OAUTHBEARER over TLS, tokens from the OIDC endpoint (client credentials).
    OAuth,
    /// SASL/GSSAPI (Kerberos) over plain TCP, the bridge's key in a keytab; the local KDC
    /// ([`Kdc`]) issues the tickets.
    Kerberos,
}

impl Login {
    /// The principal the node sees.
    pub fn principal(self) -> String {
        match self {
            Login::Tls => "User:ANONYMOUS".into(),
            Login::MutualTls => format!("User:{MTLS_USER}"),
            Login::Scram | Login::Plain | Login::Kerberos => format!("User:{}", SASL_USER.0),
            Login::OAuth => format!("User:{}", OIDC_CLIENT.0),
        }
    }
}

/// The node, its listeners, the files a client needs, and the token endpoint.
pub struct Secured {
    pub broker: &'static Broker,
    pub listeners: SecuredListeners,
    /// The private CA's certificate (PEM), the bridge's client certificate and key.
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A file holding the SASL user's password (`KAFKA_SASL_PASSWORD_FILE`).
    pub password_file: PathBuf,
    /// The token endpoint's base URL (`/token`, `/jwks`).
    pub oidc_url: String,
    /// The realm, and the bridge's keytab in it (`bridge@WATCHBRIDGE.TEST`).
    pub kdc: Kdc,
    pub bridge_keytab: PathBuf,
    _pki: Pki,
    _oidc: Mutex<Child>,
}

/// The binary's secured node, started on first use (after its token endpoint).
pub fn secured() -> &'static Secured {
    static SECURED: OnceLock<Secured> = OnceLock::new();
    SECURED.get_or_init(|| {
        let pki = Pki::with_client("watchbridge secured test CA", MTLS_USER);
        let (oidc, oidc_url) = start_oidc();
        let jwks = format!("{oidc_url}/jwks");
        // The node's service principal is named for the host clients reach it by.
        let kdc = Kdc::start();
        let kafka_keytab = kdc.principal("kafka/127.0.0.1");
        let bridge_keytab = kdc.principal(SASL_USER.0);
        let krb5 = [
            ("KAFKA_KRB5_CONF", kdc.krb5_conf.display().to_string()),
            ("KAFKA_KRB5_KEYTAB", kafka_keytab.display().to_string()),
            ("KAFKA_KRB5_PRINCIPAL", format!("kafka/127.0.0.1@{REALM}")),
        ];
        let pem = [
            pki.ca_pem.clone(),
            pki.server_cert_pem.clone(),
            pki.server_key_pem.clone(),
        ];
        let listeners = OnceLock::new();
        let broker = broker_from(|| {
            let (process, l) =
                BrokerProcess::kafka_secured("watchbridge-secured-", pem, Some(&jwks), &krb5)?;
            let _ = listeners.set(l);
            Ok(process)
        });
        Secured {
            broker,
            listeners: listeners
                .into_inner()
                .expect("the binary's broker is the secured node: secured() comes first"),
            ca: pki.file("ca.pem", &pki.ca_pem),
            client_cert: pki.file("client.pem", &pki.client_cert_pem),
            client_key: pki.file("client.key", &pki.client_key_pem),
            password_file: pki.file("password", &format!("{}\n", SASL_USER.1)),
            oidc_url,
            kdc,
            bridge_keytab,
            _pki: pki,
            _oidc: Mutex::new(oidc),
        }
    })
}

/// tests/python/oidc_server.py under a watchdog; its base URL once it listens. (The child
/// is kept for the life of the binary: the watchdog stops the server when the binary ends.)
#[allow(clippy::zombie_processes)]
fn start_oidc() -> (Child, String) {
    let dir = tempfile::Builder::new()
        .prefix("watchbridge-oidc-")
        .tempdir()
        .unwrap()
        .keep();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/oidc_server.py");
    let client = format!("{}:{}", OIDC_CLIENT.0, OIDC_CLIENT.1);
    let command = [
        venv_python().into_os_string(),
        script.into_os_string(),
        client.into(),
    ];
    let mut child = watchdog::spawn("oidc", &dir, &command);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(dir.join("oidc.log")).unwrap_or_default();
        if let Some(url) = log.lines().find(|l| l.starts_with("http://127.0.0.1:")) {
            return (child, url.trim().to_string());
        }
        if Instant::now() > deadline {
            let tail = watchdog::log_tail(&dir, "oidc");
            drop(child.stdin.take());
            let _ = child.wait();
            panic!("the OIDC endpoint did not start: {tail}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Secured {
    /// The bridge's settings to reach the node logging in as `login`.
    pub fn env(&self, login: Login) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        let l = &self.listeners;
        let mut env = Vec::new();
        let (brokers, protocol) = match login {
            Login::Tls => (&l.ssl, "SSL"),
            Login::MutualTls => (&l.mtls, "SSL"),
            Login::Scram | Login::Plain | Login::OAuth => (&l.sasl_ssl, "SASL_SSL"),
            Login::Kerberos => (&l.sasl_plaintext, "SASL_PLAINTEXT"),
        };
        if login != Login::Kerberos {
            env.push(("KAFKA_SSL_CA_LOCATION", path(&self.ca)));
        }
        env.push(("WATCHBRIDGE_BROKERS", brokers.clone()));
        env.push(("KAFKA_SECURITY_PROTOCOL", protocol.into()));
        match login {
            Login::Tls => {}
            Login::MutualTls => env.extend([
                ("KAFKA_SSL_CERTIFICATE_LOCATION", path(&self.client_cert)),
                ("KAFKA_SSL_KEY_LOCATION", path(&self.client_key)),
            ]),
            Login::Scram => env.extend([
                ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512".into()),
                ("KAFKA_SASL_USERNAME", SASL_USER.0.into()),
                ("KAFKA_SASL_PASSWORD", SASL_USER.1.into()),
            ]),
            Login::Plain => env.extend([
                ("KAFKA_SASL_MECHANISM", "PLAIN".into()),
                ("KAFKA_SASL_USERNAME", SASL_USER.0.into()),
                ("KAFKA_SASL_PASSWORD_FILE", path(&self.password_file)),
            ]),
            Login::Kerberos => env.extend([
                ("KAFKA_SASL_MECHANISM", "GSSAPI".into()),
                ("KAFKA_SASL_KERBEROS_SERVICE_NAME", "kafka".into()),
                ("KAFKA_SASL_KERBEROS_KEYTAB", path(&self.bridge_keytab)),
                (
                    "KAFKA_SASL_KERBEROS_PRINCIPAL",
                    format!("{}@{REALM}", SASL_USER.0),
                ),
                // kinit's and libsasl2's view of the realm, and a ticket cache of its own.
                ("KRB5_CONFIG", path(&self.kdc.krb5_conf)),
                (
                    "KRB5CCNAME",
                    format!("FILE:{}", self.kdc.dir.join("bridge.ccache").display()),
                ),
            ]),
            Login::OAuth => env.extend([
                ("KAFKA_SASL_MECHANISM", "OAUTHBEARER".into()),
                ("KAFKA_SASL_OAUTHBEARER_METHOD", "oidc".into()),
                ("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", OIDC_CLIENT.0.into()),
                ("KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", OIDC_CLIENT.1.into()),
                (
                    "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
                    format!("{}/token", self.oidc_url),
                ),
            ]),
        }
        env
    }

    /// Grant (`add`) or revoke (`remove`) ACLs of `principal`, each line
    /// `RESOURCE_TYPE NAME PATTERN OPERATION` (tests/python/kafka_acls.py), over the
    /// super user's listener. The node applies them at once (one node: no propagation).
    pub fn acls(&self, action: &str, principal: &str, lines: &[String]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_acls.py");
        let mut child = Command::new(venv_python())
            .arg(script)
            .args([action, &self.listeners.plaintext, principal])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kafka_acls.py");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            for line in lines {
                writeln!(stdin, "{line}").unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kafka_acls.py {action} {principal}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
