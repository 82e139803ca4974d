//! The one HTTP client every watch shares: which servers it trusts (TLS), which certificate
//! it shows (mutual TLS) and which proxy it goes through, from `WATCHBRIDGE_HTTP_CA_FILE`,
//! `…_CLIENT_CERT`/`…_CLIENT_KEY`, `…_TLS_INSECURE` and `…_PROXY`.
//!
//! Trust: the system's CA store (`/etc/ssl/certs`, `SSL_CERT_FILE`, `SSL_CERT_DIR`: a
//! container's `ca-certificates`, and a private CA added the usual way) and the Mozilla
//! roots compiled in (so a public API works in an image without `ca-certificates`), plus
//! the CA file's certificates. Files are read once, at start: a file that cannot be read or
//! holds no usable PEM fails the start, naming its variable.

use crate::pollers::ConfigError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Settings of the client itself, flattened into [`super::HttpArgs`].
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientArgs {
    /// PEM file of CA certificates trusted besides the system's store and the built-in roots
    /// (an API behind a private CA).
    #[arg(
        long = "http-ca-file",
        env = "WATCHBRIDGE_HTTP_CA_FILE",
        value_name = "WATCHBRIDGE_HTTP_CA_FILE"
    )]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain) shown for mutual TLS; needs
    /// WATCHBRIDGE_HTTP_CLIENT_KEY.
    #[arg(
        long = "http-client-cert",
        env = "WATCHBRIDGE_HTTP_CLIENT_CERT",
        value_name = "WATCHBRIDGE_HTTP_CLIENT_CERT"
    )]
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long = "http-client-key",
        env = "WATCHBRIDGE_HTTP_CLIENT_KEY",
        value_name = "WATCHBRIDGE_HTTP_CLIENT_KEY"
    )]
    pub client_key: Option<PathBuf>,
    /// `true`: accept any server certificate, unverified. For tests only; logged as an
    /// error at start.
    #[arg(
        long = "http-tls-insecure",
        env = "WATCHBRIDGE_HTTP_TLS_INSECURE",
        value_name = "WATCHBRIDGE_HTTP_TLS_INSECURE",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub tls_insecure: bool,
    /// Proxy for every request (`http://host:port`, user info allowed), overriding
    /// HTTP_PROXY/HTTPS_PROXY/ALL_PROXY; NO_PROXY still applies. `none`: no proxy, whatever
    /// the environment says. Unset: those standard variables decide.
    #[arg(
        long = "http-proxy",
        env = "WATCHBRIDGE_HTTP_PROXY",
        value_name = "WATCHBRIDGE_HTTP_PROXY",
        hide_env_values = true
    )]
    pub proxy: Option<crate::secrets::Redacted>,
}

/// The checked client settings: files read, proxy parsed.
#[derive(Clone, Default)]
pub struct ClientConfig {
    /// Extra trusted CAs, from `WATCHBRIDGE_HTTP_CA_FILE`.
    pub extra_roots: Vec<reqwest::Certificate>,
    /// The certificate chain and key shown to servers that ask (mutual TLS).
    pub identity: Option<reqwest::Identity>,
    pub tls_insecure: bool,
    pub proxy: ProxyChoice,
}

/// Which proxy requests go through.
#[derive(Clone, Default)]
pub enum ProxyChoice {
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` (either case) decide.
    #[default]
    FromEnvironment,
    /// No proxy at all (`WATCHBRIDGE_HTTP_PROXY=none`).
    Direct,
    /// This one for every request but those `NO_PROXY` exempts.
    Via(Box<reqwest::Proxy>),
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Certificates and keys say nothing useful in a log; a proxy URL may hold a password.
        f.debug_struct("ClientConfig")
            .field("extra_roots", &self.extra_roots.len())
            .field("identity", &self.identity.is_some())
            .field("tls_insecure", &self.tls_insecure)
            .field(
                "proxy",
                &match self.proxy {
                    ProxyChoice::FromEnvironment => "from the environment",
                    ProxyChoice::Direct => "none",
                    ProxyChoice::Via(_) => "WATCHBRIDGE_HTTP_PROXY",
                },
            )
            .finish()
    }
}

impl ClientArgs {
    /// Read the files and parse the proxy; each error names its variable.
    pub fn config(&self) -> Result<ClientConfig, ConfigError> {
        let extra_roots = match &self.ca_file {
            None => Vec::new(),
            Some(path) => {
                const VAR: &str = "WATCHBRIDGE_HTTP_CA_FILE";
                let pem = read(VAR, path)?;
                let roots = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| ConfigError::new(VAR, format!("{}: {e}", path.display())))?;
                if roots.is_empty() {
                    return Err(ConfigError::new(
                        VAR,
                        format!(
                            "{} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
                            path.display()
                        ),
                    ));
                }
                roots
            }
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_HTTP_CLIENT_KEY",
                    "is required with WATCHBRIDGE_HTTP_CLIENT_CERT (the certificate's private key)",
                ))
            }
            (None, Some(_)) => return Err(ConfigError::new(
                "WATCHBRIDGE_HTTP_CLIENT_CERT",
                "is required with WATCHBRIDGE_HTTP_CLIENT_KEY (the certificate the key belongs to)",
            )),
            (Some(cert), Some(key)) => Some(identity(cert, key)?),
        };
        let proxy = match self.proxy.as_ref().map(|p| p.0.trim()) {
            None => ProxyChoice::FromEnvironment,
            Some(none) if none.eq_ignore_ascii_case("none") => ProxyChoice::Direct,
            Some(url) => ProxyChoice::Via(Box::new(proxy(url)?)),
        };
        Ok(ClientConfig {
            extra_roots,
            identity,
            tls_insecure: self.tls_insecure,
            proxy,
        })
    }
}

fn read(var: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| ConfigError::new(var, format!("cannot read {}: {e}", path.display())))
}

/// The certificate chain and its key, checked to be PEM of the right kinds (the key is
/// never shown in a message).
fn identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, ConfigError> {
    const CERT: &str = "WATCHBRIDGE_HTTP_CLIENT_CERT";
    const KEY: &str = "WATCHBRIDGE_HTTP_CLIENT_KEY";
    let cert_pem = read(CERT, cert)?;
    let key_pem = read(KEY, key)?;
    if !contains_label(&cert_pem, "CERTIFICATE") {
        return Err(ConfigError::new(
            CERT,
            format!(
                "{} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
                cert.display()
            ),
        ));
    }
    if !contains_label(&key_pem, "PRIVATE KEY") {
        return Err(ConfigError::new(
            KEY,
            format!(
                "{} holds no PEM private key (`-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)",
                key.display()
            ),
        ));
    }
    let mut both = cert_pem;
    both.push(b'\n');
    both.extend_from_slice(&key_pem);
    reqwest::Identity::from_pem(&both).map_err(|e| {
        ConfigError::new(
            CERT,
            format!(
                "{} with the key in {} is not a usable client identity: {e}",
                cert.display(),
                key.display()
            ),
        )
    })
}

/// `pem` has a `-----BEGIN … <label>-----` line.
fn contains_label(pem: &[u8], label: &str) -> bool {
    String::from_utf8_lossy(pem)
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")))
}

/// `WATCHBRIDGE_HTTP_PROXY`: an http(s) URL with a host. Its text may hold a password, so
/// messages show it redacted.
fn proxy(text: &str) -> Result<reqwest::Proxy, ConfigError> {
    const VAR: &str = "WATCHBRIDGE_HTTP_PROXY";
    let shown = crate::logging::url(text);
    let url = url::Url::parse(text)
        .map_err(|e| ConfigError::new(VAR, format!("`{shown}` is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(
            VAR,
            format!(
                "`{shown}` must be an http:// or https:// URL naming the proxy's host, or `none`"
            ),
        ));
    }
    let proxy = reqwest::Proxy::all(url.as_str())
        .map_err(|e| ConfigError::new(VAR, format!("`{shown}`: {e}")))?;
    Ok(proxy.no_proxy(reqwest::NoProxy::from_env()))
}

/// The client, built on a thread of its own from when the poller is made. Building it
/// reads the system's root certificates (reqwest's native roots, a file per certificate):
/// ~10 ms, which was most of the bridge's start before its first broker request; built
/// beside the Kafka start instead, it costs the start nothing. The bridge's start waits
/// for it once the topics are checked (`Resolve::ready`) and fails there if it could not
/// be built; a poll made earlier (a poller used in code) waits for it too.
#[derive(Clone)]
pub struct PendingClient(Arc<Pending>);

struct Pending {
    built: OnceLock<Result<reqwest::Client, String>>,
    thread: Mutex<Option<JoinHandle<Result<reqwest::Client, String>>>>,
}

impl PendingClient {
    /// Starts building the client (here, where no thread can be started).
    pub fn spawn(config: &ClientConfig, timeout: Duration) -> Self {
        let spawned = {
            let config = config.clone();
            std::thread::Builder::new()
                .name("watchbridge-http-client".into())
                .spawn(move || build(&config, timeout).map_err(|e| e.to_string()))
        };
        let built = OnceLock::new();
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(_) => {
                let _ = built.set(build(config, timeout).map_err(|e| e.to_string()));
                None
            }
        };
        Self(Arc::new(Pending {
            built,
            thread: Mutex::new(thread),
        }))
    }

    /// The client, once built (waiting for its thread the first time); `Err` says why it
    /// could not be, naming the setting (`WATCHBRIDGE_POLLER: cannot build the HTTP
    /// client: …`, [`build`]'s error).
    pub fn get(&self) -> Result<&reqwest::Client, &str> {
        self.0
            .built
            .get_or_init(|| {
                let thread = self
                    .0
                    .thread
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                match thread.map(JoinHandle::join) {
                    Some(Ok(built)) => built,
                    Some(Err(_)) => {
                        Err("WATCHBRIDGE_POLLER: building the HTTP client panicked".into())
                    }
                    // Not reached: without a thread, `spawn` built the client itself.
                    None => Err("WATCHBRIDGE_POLLER: the HTTP client was never built".into()),
                }
            })
            .as_ref()
            .map_err(String::as_str)
    }
}

/// The client, with these settings and the poller's own (no redirects followed by the
/// client: the poller decides each hop; no `Referer`).
pub fn build(config: &ClientConfig, timeout: Duration) -> Result<reqwest::Client, ConfigError> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("watchbridge/", env!("CARGO_PKG_VERSION")))
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .referer(false);
    for root in &config.extra_roots {
        builder = builder.add_root_certificate(root.clone());
    }
    if let Some(identity) = &config.identity {
        builder = builder.identity(identity.clone());
    }
    if config.tls_insecure {
        tracing::error!("WATCHBRIDGE_HTTP_TLS_INSECURE=true: server certificates are NOT verified; anyone on the path can read and change what the bridge polls (for tests only)");
        builder = builder.danger_accept_invalid_certs(true);
    }
    builder = match &config.proxy {
        ProxyChoice::FromEnvironment => builder,
        ProxyChoice::Direct => builder.no_proxy(),
        ProxyChoice::Via(proxy) => builder.proxy((**proxy).clone()),
    };
    builder.build().map_err(|e| {
        ConfigError::new(
            "WATCHBRIDGE_POLLER",
            format!("cannot build the HTTP client: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Redacted;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn error(args: ClientArgs) -> String {
        args.config().unwrap_err().to_string()
    }

    #[test]
    fn bad_files_and_proxies_fail_naming_their_variable() {
        let not_pem = file("hello");
        let missing = PathBuf::from("/nonexistent/ca.pem");
        for (args, var) in [
            (
                ClientArgs {
                    ca_file: Some(missing.clone()),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_CA_FILE",
            ),
            (
                ClientArgs {
                    ca_file: Some(not_pem.path().into()),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_CA_FILE",
            ),
            (
                ClientArgs {
                    client_cert: Some(not_pem.path().into()),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_CLIENT_KEY",
            ),
            (
                ClientArgs {
                    client_key: Some(not_pem.path().into()),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_CLIENT_CERT",
            ),
            (
                ClientArgs {
                    client_cert: Some(not_pem.path().into()),
                    client_key: Some(not_pem.path().into()),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_CLIENT_CERT",
            ),
            (
                ClientArgs {
                    proxy: Some(Redacted("socks9://p:1".into())),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_PROXY",
            ),
            (
                ClientArgs {
                    proxy: Some(Redacted("not a url".into())),
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_PROXY",
            ),
        ] {
            let e = error(args);
            assert!(e.contains(var), "{var}: {e}");
        }
    }

    #[test]
    fn a_proxy_password_is_not_shown_in_errors_or_debug() {
        let e = error(ClientArgs {
            proxy: Some(Redacted("ftp://user:hunter2@proxy:1".into())),
            ..Default::default()
        });
        assert!(
            e.contains("WATCHBRIDGE_HTTP_PROXY") && !e.contains("hunter2"),
            "{e}"
        );
        let args = ClientArgs {
            proxy: Some(Redacted("http://user:hunter2@proxy:3128".into())),
            ..Default::default()
        };
        assert!(!format!("{args:?}").contains("hunter2"), "{args:?}");
        let ok = args.config().unwrap();
        let debug = format!("{ok:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(matches!(ok.proxy, ProxyChoice::Via(_)));
        assert!(matches!(
            ClientArgs {
                proxy: Some(Redacted("NONE".into())),
                ..Default::default()
            }
            .config()
            .unwrap()
            .proxy,
            ProxyChoice::Direct
        ));
    }

    /// The client is built beside the start; one that cannot be built (here: a key that is
    /// not the certificate's, which rustls refuses only when the client is built) still
    /// fails the start, through `ready`, naming the setting, and every poll says so.
    #[test]
    fn a_client_that_cannot_be_built_fails_ready_and_every_poll() {
        use crate::poll::Poller;
        use crate::pollers::Resolve;
        let cert = rcgen::generate_simple_self_signed(vec!["client".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
        let cert_file = file(&cert.cert.pem());
        let key_file = file(&other.signing_key.serialize_pem());
        let args = ClientArgs {
            client_cert: Some(cert_file.path().into()),
            client_key: Some(key_file.path().into()),
            ..ClientArgs::default()
        };
        let config = crate::pollers::http::HttpConfig {
            client: args
                .config()
                .expect("a certificate and a key, each well formed"),
            ..crate::pollers::http::HttpConfig::new("http://127.0.0.1:9/{/id}").unwrap()
        };
        let poller = crate::pollers::http::HttpPoller::new(config).expect("the poller is made");
        let error = poller.ready().expect_err("the client cannot be built");
        assert!(
            error.contains("WATCHBRIDGE_POLLER") && error.contains("cannot build the HTTP client"),
            "{error}"
        );
        // Said once, not wrapped again by each caller.
        assert_eq!(
            error.matches("cannot build the HTTP client").count(),
            1,
            "{error}"
        );
        let target = poller
            .resolve(&serde_json::json!({"id": 1}), b"1")
            .expect("a URL");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let polled = runtime.block_on(poller.poll(std::sync::Arc::new(target)));
        let e = polled.expect_err("no client, no poll");
        assert!(
            e.to_string().contains("cannot build the HTTP client"),
            "{e}"
        );
    }

    #[test]
    fn a_client_with_default_settings_is_ready() {
        use crate::pollers::Resolve;
        let config = crate::pollers::http::HttpConfig::new("http://127.0.0.1:9/{/id}").unwrap();
        let poller = crate::pollers::http::HttpPoller::new(config).unwrap();
        assert_eq!(poller.ready(), Ok(()));
    }
}
