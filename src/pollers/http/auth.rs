//! `WATCHBRIDGE_HTTP_AUTH`: how requests prove who the bridge is — HTTP Basic, a bearer
//! token (fixed, or a file re-read when it changes, such as a Kubernetes projected token),
//! or OAuth2 client credentials (one token for every watch, fetched again before it
//! expires and once when a server answers 401).
//!
//! The credential goes only where the configured headers go: to the origin of the watch's
//! URL (`send` in `mod.rs`), never to a redirect or next page elsewhere. Secrets are never
//! logged: settings are [`Redacted`], header values marked sensitive, and messages name the
//! variable or file, not what it holds.

use super::client::PendingClient;
use crate::poll::PollError;
use crate::pollers::ConfigError;
use crate::secrets::Redacted;
use oauth2::basic::BasicClient;
use oauth2::{AuthType, ClientId, ClientSecret, EndpointNotSet, EndpointSet, Scope, TokenResponse};
use reqwest::header::HeaderValue;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The authentication settings, flattened into [`super::HttpArgs`].
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AuthArgs {
    /// `none`, `basic` (WATCHBRIDGE_HTTP_USERNAME/…_PASSWORD), `bearer`
    /// (WATCHBRIDGE_HTTP_TOKEN or …_TOKEN_FILE) or `oauth2` (client credentials:
    /// WATCHBRIDGE_HTTP_OAUTH2_*).
    #[arg(
        long = "http-auth",
        env = "WATCHBRIDGE_HTTP_AUTH",
        value_name = "WATCHBRIDGE_HTTP_AUTH",
        default_value = "none"
    )]
    pub auth: Option<String>,
    /// User name for `basic`.
    #[arg(
        long = "http-username",
        env = "WATCHBRIDGE_HTTP_USERNAME",
        value_name = "WATCHBRIDGE_HTTP_USERNAME"
    )]
    pub username: Option<String>,
    /// Password for `basic` (never logged).
    #[arg(
        long = "http-password",
        env = "WATCHBRIDGE_HTTP_PASSWORD",
        value_name = "WATCHBRIDGE_HTTP_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<Redacted>,
    /// Token for `bearer` (never logged).
    #[arg(
        long = "http-token",
        env = "WATCHBRIDGE_HTTP_TOKEN",
        value_name = "WATCHBRIDGE_HTTP_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<Redacted>,
    /// File holding the token for `bearer`, read again whenever it changes (and after a 401).
    #[arg(
        long = "http-token-file",
        env = "WATCHBRIDGE_HTTP_TOKEN_FILE",
        value_name = "WATCHBRIDGE_HTTP_TOKEN_FILE"
    )]
    pub token_file: Option<PathBuf>,
    /// Token endpoint for `oauth2` (client credentials grant).
    #[arg(
        long = "http-oauth2-token-url",
        env = "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL",
        value_name = "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL"
    )]
    pub oauth2_token_url: Option<String>,
    /// Client id for `oauth2`.
    #[arg(
        long = "http-oauth2-client-id",
        env = "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_ID",
        value_name = "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_ID"
    )]
    pub oauth2_client_id: Option<String>,
    /// Client secret for `oauth2` (never logged), sent to the token endpoint with HTTP Basic.
    #[arg(
        long = "http-oauth2-client-secret",
        env = "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_SECRET",
        value_name = "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_SECRET",
        hide_env_values = true
    )]
    pub oauth2_client_secret: Option<Redacted>,
    /// Scopes asked for with `oauth2`, separated by spaces or commas (unset: none asked).
    #[arg(
        long = "http-oauth2-scopes",
        env = "WATCHBRIDGE_HTTP_OAUTH2_SCOPES",
        value_name = "WATCHBRIDGE_HTTP_OAUTH2_SCOPES"
    )]
    pub oauth2_scopes: Option<String>,
}

/// The checked authentication settings.
#[derive(Debug, Clone, Default)]
pub enum AuthConfig {
    #[default]
    None,
    /// `Authorization: Basic …` or `Bearer …`, the same on every request (marked sensitive).
    Fixed(HeaderValue),
    /// `Authorization: Bearer <the file's text, trimmed>`.
    TokenFile(PathBuf),
    OAuth2(OAuth2Config),
}

/// OAuth2 client credentials (RFC 6749 §4.4).
#[derive(Debug, Clone)]
pub struct OAuth2Config {
    pub token_url: url::Url,
    pub client_id: String,
    pub client_secret: Redacted,
    pub scopes: Vec<String>,
}

impl AuthArgs {
    /// Check the settings of the chosen mode, and that no other mode's are set (a token set
    /// while `WATCHBRIDGE_HTTP_AUTH` is unset is a mistake, not something to ignore).
    pub fn config(&self) -> Result<AuthConfig, ConfigError> {
        const AUTH: &str = "WATCHBRIDGE_HTTP_AUTH";
        let mode = self.auth.as_deref().unwrap_or("none").trim();
        let set: Vec<&'static str> = [
            (
                "WATCHBRIDGE_HTTP_USERNAME",
                self.username.is_some(),
                "basic",
            ),
            (
                "WATCHBRIDGE_HTTP_PASSWORD",
                self.password.is_some(),
                "basic",
            ),
            ("WATCHBRIDGE_HTTP_TOKEN", self.token.is_some(), "bearer"),
            (
                "WATCHBRIDGE_HTTP_TOKEN_FILE",
                self.token_file.is_some(),
                "bearer",
            ),
            (
                "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL",
                self.oauth2_token_url.is_some(),
                "oauth2",
            ),
            (
                "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_ID",
                self.oauth2_client_id.is_some(),
                "oauth2",
            ),
            (
                "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_SECRET",
                self.oauth2_client_secret.is_some(),
                "oauth2",
            ),
            (
                "WATCHBRIDGE_HTTP_OAUTH2_SCOPES",
                self.oauth2_scopes.is_some(),
                "oauth2",
            ),
        ]
        .into_iter()
        .filter(|&(_, is_set, of)| is_set && of != mode)
        .map(|(var, _, _)| var)
        .collect();
        if let Some(var) = set.first() {
            return Err(ConfigError::new(
                *var,
                format!("is set, but WATCHBRIDGE_HTTP_AUTH is `{mode}`: set WATCHBRIDGE_HTTP_AUTH to the mode it belongs to, or unset it"),
            ));
        }
        let required = |var: &'static str, value: Option<&str>| {
            value
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| {
                    ConfigError::new(
                        var,
                        format!("is required with WATCHBRIDGE_HTTP_AUTH={mode}"),
                    )
                })
        };
        match mode {
            "none" | "" => Ok(AuthConfig::None),
            "basic" => {
                let user = required("WATCHBRIDGE_HTTP_USERNAME", self.username.as_deref())?;
                if user.contains(':') {
                    return Err(ConfigError::new(
                        "WATCHBRIDGE_HTTP_USERNAME",
                        "must not contain `:` (HTTP Basic separates user and password with it)",
                    ));
                }
                let password = required(
                    "WATCHBRIDGE_HTTP_PASSWORD",
                    self.password.as_ref().map(|p| p.0.as_str()),
                )?;
                use base64::Engine;
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Ok(AuthConfig::Fixed(sensitive(
                    &format!("Basic {encoded}"),
                    "WATCHBRIDGE_HTTP_PASSWORD",
                )?))
            }
            "bearer" => match (&self.token, &self.token_file) {
                (Some(_), Some(_)) => Err(ConfigError::new(
                    "WATCHBRIDGE_HTTP_TOKEN_FILE",
                    "and WATCHBRIDGE_HTTP_TOKEN are both set: set one",
                )),
                (Some(token), None) => {
                    let token = required("WATCHBRIDGE_HTTP_TOKEN", Some(token.0.trim()))?;
                    Ok(AuthConfig::Fixed(sensitive(
                        &format!("Bearer {token}"),
                        "WATCHBRIDGE_HTTP_TOKEN",
                    )?))
                }
                (None, Some(path)) => {
                    read_token(path)
                        .map_err(|e| ConfigError::new("WATCHBRIDGE_HTTP_TOKEN_FILE", e))?;
                    Ok(AuthConfig::TokenFile(path.clone()))
                }
                (None, None) => Err(ConfigError::new(
                    "WATCHBRIDGE_HTTP_TOKEN",
                    "or WATCHBRIDGE_HTTP_TOKEN_FILE is required with WATCHBRIDGE_HTTP_AUTH=bearer",
                )),
            },
            "oauth2" => {
                const URL: &str = "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL";
                let text = required(URL, self.oauth2_token_url.as_deref())?;
                let token_url = url::Url::parse(&text)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
                    .ok_or_else(|| {
                        ConfigError::new(
                            URL,
                            format!("`{}` is not an http(s) URL", crate::logging::url(&text)),
                        )
                    })?;
                Ok(AuthConfig::OAuth2(OAuth2Config {
                    token_url,
                    client_id: required(
                        "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_ID",
                        self.oauth2_client_id.as_deref(),
                    )?,
                    client_secret: Redacted(required(
                        "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_SECRET",
                        self.oauth2_client_secret.as_ref().map(|s| s.0.as_str()),
                    )?),
                    scopes: self
                        .oauth2_scopes
                        .as_deref()
                        .unwrap_or_default()
                        .split([' ', ','])
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                }))
            }
            other => Err(ConfigError::new(
                AUTH,
                format!("`{other}` is not one of none, basic, bearer, oauth2"),
            )),
        }
    }
}

/// An `Authorization` value, marked sensitive (its `Debug` shows `Sensitive`).
fn sensitive(text: &str, var: &'static str) -> Result<HeaderValue, ConfigError> {
    sensitive_header(text).ok_or_else(|| {
        ConfigError::new(
            var,
            "holds a character not allowed in an HTTP header (a line break?)",
        )
    })
}

/// The token in a token file: its text without surrounding whitespace (files often end
/// with a newline), as an `Authorization: Bearer` value. The error names the file, never
/// what it holds.
fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    sensitive_header(&format!("Bearer {token}")).ok_or_else(|| {
        format!(
            "the token file {} holds a character not allowed in an HTTP header",
            path.display()
        )
    })
}

/// The credential of every request, as it stands.
#[derive(Debug)]
pub struct Auth {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    None,
    Fixed(HeaderValue),
    File(TokenFile),
    OAuth2(Box<OAuth2Tokens>),
}

impl Auth {
    pub fn new(config: &AuthConfig, client: PendingClient) -> Self {
        let kind = match config {
            AuthConfig::None => Kind::None,
            AuthConfig::Fixed(value) => Kind::Fixed(value.clone()),
            AuthConfig::TokenFile(path) => Kind::File(TokenFile {
                path: path.clone(),
                read: Mutex::new(None),
            }),
            AuthConfig::OAuth2(c) => Kind::OAuth2(Box::new(OAuth2Tokens::new(c, client))),
        };
        Self { kind }
    }

    /// The `Authorization` value for the next request, if any: a token file is read again
    /// if it changed, an OAuth2 token fetched if there is none or it is about to expire.
    pub async fn authorization(&self) -> Result<Option<HeaderValue>, PollError> {
        match &self.kind {
            Kind::None => Ok(None),
            Kind::Fixed(value) => Ok(Some(value.clone())),
            Kind::File(file) => file.current().map(Some),
            Kind::OAuth2(tokens) => tokens.current().await.map(Some),
        }
    }

    /// A server answered 401 to a request that carried `sent`: forget it, and say whether
    /// asking once more with a fresh credential may help (a token file read again, a new
    /// OAuth2 token; a fixed credential stays what it is).
    pub fn rejected(&self, sent: &HeaderValue) -> bool {
        match &self.kind {
            Kind::None | Kind::Fixed(_) => false,
            Kind::File(file) => {
                *file.read.lock().unwrap_or_else(|p| p.into_inner()) = None;
                true
            }
            Kind::OAuth2(tokens) => {
                tokens.forget(sent);
                true
            }
        }
    }
}

/// A token file and what was last read from it.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    /// The file's identity when read (modification time, length, inode: a Kubernetes
    /// rotation swaps a symlink to a new file), and its token.
    read: Mutex<Option<(FileStamp, HeaderValue)>>,
}

type FileStamp = (Option<SystemTime>, u64, u64);

impl TokenFile {
    fn current(&self) -> Result<HeaderValue, PollError> {
        let failed = |why: String| PollError::transient("auth", why);
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            failed(format!(
                "cannot read the token file {}: {e}",
                self.path.display()
            ))
        })?;
        use std::os::unix::fs::MetadataExt;
        let stamp = (meta.modified().ok(), meta.len(), meta.ino());
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, value)) = &*read {
            if *at == stamp {
                return Ok(value.clone());
            }
        }
        let value = read_token(&self.path).map_err(failed)?;
        tracing::debug!(file = %self.path.display(), "bearer token read from its file");
        *read = Some((stamp, value.clone()));
        Ok(value)
    }
}

type Client =
    BasicClient<EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointSet>;

/// One OAuth2 token for every watch: fetched by the first request that needs it (the
/// others wait for that fetch rather than each asking), again once most of its lifetime has
/// passed, and after a 401.
struct OAuth2Tokens {
    oauth: Client,
    scopes: Vec<Scope>,
    token_url: url::Url,
    http: PendingClient,
    current: Mutex<Option<Token>>,
    /// Held while fetching, so concurrent polls make one request to the token endpoint.
    fetching: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for OAuth2Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth2Tokens")
            .field(
                "token_url",
                &crate::logging::url(self.token_url.as_str()).to_string(),
            )
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Token {
    value: HeaderValue,
    /// When to fetch a new one (`None`: the server gave no lifetime; until a 401).
    refresh_at: Option<Instant>,
}

impl OAuth2Tokens {
    fn new(config: &OAuth2Config, http: PendingClient) -> Self {
        let oauth = BasicClient::new(ClientId::new(config.client_id.clone()))
            .set_client_secret(ClientSecret::new(config.client_secret.0.clone()))
            .set_auth_type(AuthType::BasicAuth)
            .set_token_uri(oauth2::TokenUrl::from_url(config.token_url.clone()));
        Self {
            oauth,
            scopes: config.scopes.iter().cloned().map(Scope::new).collect(),
            token_url: config.token_url.clone(),
            http,
            current: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn valid(&self) -> Option<HeaderValue> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .as_ref()
            .filter(|t| t.refresh_at.is_none_or(|at| Instant::now() < at))
            .map(|t| t.value.clone())
    }

    async fn current(&self) -> Result<HeaderValue, PollError> {
        if let Some(value) = self.valid() {
            return Ok(value);
        }
        let _fetching = self.fetching.lock().await;
        // Another poll may have fetched one while this one waited.
        if let Some(value) = self.valid() {
            return Ok(value);
        }
        let token = self.fetch().await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
        Ok(token.value)
    }

    fn forget(&self, sent: &HeaderValue) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        // Only the token that was refused: a newer one fetched meanwhile stays.
        if current.as_ref().is_some_and(|t| t.value == *sent) {
            *current = None;
        }
    }

    async fn fetch(&self) -> Result<Token, PollError> {
        let started = Instant::now();
        let shown = crate::logging::url(self.token_url.as_str());
        let http = self
            .http
            .get()
            .map_err(|e| PollError::transient("auth", e))?;
        let response = self
            .oauth
            .exchange_client_credentials()
            .add_scopes(self.scopes.iter().cloned())
            .request_async(http)
            .await
            .map_err(|e| {
                PollError::transient(
                    "auth",
                    format!(
                        "OAuth2 token request to {shown} failed: {}",
                        token_error(&e)
                    ),
                )
            })?;
        let value = sensitive_header(&format!("Bearer {}", response.access_token().secret()))
            .ok_or_else(|| {
                PollError::transient(
                    "auth",
                    format!(
                        "OAuth2 token from {shown} holds a character not allowed in an HTTP header"
                    ),
                )
            })?;
        let lifetime = response.expires_in();
        tracing::info!(token_url = %shown, expires_in = ?lifetime, "OAuth2 token fetched");
        Ok(Token {
            value,
            refresh_at: lifetime.map(|l| started + refresh_after(l)),
        })
    }
}

/// When to fetch a token again: after nine tenths of its lifetime, and at least 30 s before
/// it ends where it lives long enough for that, so a request never leaves with a token
/// that expires on the way.
fn refresh_after(lifetime: Duration) -> Duration {
    let margin = (lifetime / 10).max((lifetime / 2).min(Duration::from_secs(30)));
    lifetime.saturating_sub(margin)
}

/// What went wrong with a token request, without anything it sent (the secret) and with
/// what the server said escaped and bounded.
fn token_error<RE: std::error::Error + 'static>(
    e: &oauth2::RequestTokenError<RE, oauth2::basic::BasicErrorResponse>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => {
            let description = r
                .error_description()
                .map(|d| format!(": {}", crate::logging::outside(d)))
                .unwrap_or_default();
            format!("the server refused it ({}){description}", r.error())
        }
        oauth2::RequestTokenError::Request(re) => {
            let mut text = re.to_string();
            let mut source = std::error::Error::source(re);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            crate::logging::outside(&text).to_string()
        }
        oauth2::RequestTokenError::Parse(e, body) => format!(
            "its answer is not a token response ({e}): {}",
            crate::logging::outside(&String::from_utf8_lossy(body))
        ),
        oauth2::RequestTokenError::Other(o) => crate::logging::outside(o).to_string(),
    }
}

/// A header value that may be a secret, marked sensitive (its `Debug` shows `Sensitive`,
/// and the HTTP/2 encoder never indexes it); `None` if a header cannot carry the text.
/// Configured headers and every credential are made here.
pub(crate) fn sensitive_header(text: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(text).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: &str) -> AuthArgs {
        AuthArgs {
            auth: Some(mode.into()),
            ..Default::default()
        }
    }

    #[test]
    fn basic_is_user_and_password_in_base64_and_never_shown() {
        let config = AuthArgs {
            username: Some("aladdin".into()),
            password: Some(Redacted("open sesame".into())),
            ..args("basic")
        }
        .config()
        .unwrap();
        let AuthConfig::Fixed(value) = &config else {
            panic!("{config:?}")
        };
        assert_eq!(value, "Basic YWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(!format!("{config:?}").contains("YWxh"), "{config:?}");
    }

    #[test]
    fn each_mode_needs_its_own_settings_and_refuses_another_modes() {
        for (a, var) in [
            (args("basic"), "WATCHBRIDGE_HTTP_USERNAME"),
            (
                AuthArgs {
                    username: Some("u".into()),
                    ..args("basic")
                },
                "WATCHBRIDGE_HTTP_PASSWORD",
            ),
            (
                AuthArgs {
                    username: Some("a:b".into()),
                    password: Some(Redacted("p".into())),
                    ..args("basic")
                },
                "WATCHBRIDGE_HTTP_USERNAME",
            ),
            (args("bearer"), "WATCHBRIDGE_HTTP_TOKEN"),
            (
                AuthArgs {
                    token: Some(Redacted("t".into())),
                    token_file: Some("/x".into()),
                    ..args("bearer")
                },
                "WATCHBRIDGE_HTTP_TOKEN_FILE",
            ),
            (
                AuthArgs {
                    token_file: Some("/nonexistent/token".into()),
                    ..args("bearer")
                },
                "WATCHBRIDGE_HTTP_TOKEN_FILE",
            ),
            (args("oauth2"), "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL"),
            (
                AuthArgs {
                    oauth2_token_url: Some("ftp://x/token".into()),
                    ..args("oauth2")
                },
                "WATCHBRIDGE_HTTP_OAUTH2_TOKEN_URL",
            ),
            (
                AuthArgs {
                    oauth2_token_url: Some("https://idp/token".into()),
                    ..args("oauth2")
                },
                "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_ID",
            ),
            (
                AuthArgs {
                    oauth2_token_url: Some("https://idp/token".into()),
                    oauth2_client_id: Some("id".into()),
                    ..args("oauth2")
                },
                "WATCHBRIDGE_HTTP_OAUTH2_CLIENT_SECRET",
            ),
            (
                AuthArgs {
                    token: Some(Redacted("t".into())),
                    auth: None,
                    ..Default::default()
                },
                "WATCHBRIDGE_HTTP_TOKEN",
            ),
            (
                AuthArgs {
                    password: Some(Redacted("p".into())),
                    ..args("bearer")
                },
                "WATCHBRIDGE_HTTP_PASSWORD",
            ),
            (args("digest"), "WATCHBRIDGE_HTTP_AUTH"),
        ] {
            let e = a.config().unwrap_err().to_string();
            assert!(
                e.starts_with(var) || e.contains(&format!("{var} ")),
                "{var}: {e}"
            );
        }
    }

    #[test]
    fn oauth2_scopes_split_on_spaces_and_commas() {
        let AuthConfig::OAuth2(c) = AuthArgs {
            oauth2_token_url: Some("https://idp.example/token".into()),
            oauth2_client_id: Some("id".into()),
            oauth2_client_secret: Some(Redacted("s3cret".into())),
            oauth2_scopes: Some("read:events, write  admin".into()),
            ..args("oauth2")
        }
        .config()
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.scopes, ["read:events", "write", "admin"]);
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn a_token_is_fetched_again_before_it_expires() {
        assert_eq!(
            refresh_after(Duration::from_secs(3600)),
            Duration::from_secs(3240)
        );
        assert_eq!(
            refresh_after(Duration::from_secs(120)),
            Duration::from_secs(90)
        );
        assert_eq!(
            refresh_after(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        assert_eq!(refresh_after(Duration::ZERO), Duration::ZERO);
    }
}
