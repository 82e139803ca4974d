//! `WATCHBRIDGE_HTTP_*`: the HTTP poller's settings, as flags and environment variables,
//! checked once at start into an [`HttpConfig`]. Every error names its variable.

use super::body::BodyTemplate;
use crate::pollers::template::{OriginPart, Template};
use crate::pollers::ConfigError;
use reqwest::header::{HeaderMap, HeaderName};
use std::time::Duration;

/// The HTTP poller's settings (`WATCHBRIDGE_POLLER=http`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HttpArgs {
    /// URL template: `{/json/pointer}` is that field of the input value, `{key}` the watch
    /// key; substituted values are percent-encoded. E.g. `http://api:8080/users/{/id}/events`.
    /// Its value is not shown here: it may hold user info or a secret query parameter.
    #[arg(
        long = "http-url",
        env = "WATCHBRIDGE_HTTP_URL",
        value_name = "WATCHBRIDGE_HTTP_URL",
        hide_env_values = true
    )]
    pub url: Option<String>,
    /// The request method: `GET`, or `POST` (for GraphQL and search APIs, with
    /// WATCHBRIDGE_HTTP_BODY). Every page of a poll is asked with it.
    #[arg(
        long = "http-method",
        env = "WATCHBRIDGE_HTTP_METHOD",
        value_name = "WATCHBRIDGE_HTTP_METHOD",
        value_enum,
        ignore_case = true,
        default_value_t = HttpMethod::Get
    )]
    pub method: HttpMethod,
    /// JSON body sent with POST (`Content-Type: application/json`), the same body on every
    /// page. `{/json/pointer}` and `{key}` inside a JSON string are replaced by the value's
    /// text, JSON-escaped; standing as a whole value (`"id": {/id}`), by the input's JSON
    /// value. Its value is not shown here: it may hold a secret.
    #[arg(
        long = "http-body",
        env = "WATCHBRIDGE_HTTP_BODY",
        value_name = "WATCHBRIDGE_HTTP_BODY",
        hide_env_values = true
    )]
    pub body: Option<String>,
    /// JSON pointer to the array of items in a response (empty: the response is the array).
    #[arg(
        long = "http-items",
        env = "WATCHBRIDGE_HTTP_ITEMS",
        value_name = "WATCHBRIDGE_HTTP_ITEMS",
        default_value = ""
    )]
    pub items: String,
    /// JSON pointer to an item's identity (empty: the whole item).
    #[arg(
        long = "http-item-key",
        env = "WATCHBRIDGE_HTTP_ITEM_KEY",
        value_name = "WATCHBRIDGE_HTTP_ITEM_KEY",
        default_value = ""
    )]
    pub item_key: String,
    /// JSON pointer to an item's version (an `updated_at`, an ETag field): an item whose
    /// version changes is emitted again, once per version, with header
    /// `watchbridge-item-version` (unset: an item is emitted once, whatever changes).
    #[arg(
        long = "http-item-version",
        env = "WATCHBRIDGE_HTTP_ITEM_VERSION",
        value_name = "WATCHBRIDGE_HTTP_ITEM_VERSION"
    )]
    pub item_version: Option<String>,
    /// JSON pointer to an item's event time, RFC 3339 or epoch ms (unset: when first seen).
    #[arg(
        long = "http-item-time",
        env = "WATCHBRIDGE_HTTP_ITEM_TIME",
        value_name = "WATCHBRIDGE_HTTP_ITEM_TIME"
    )]
    pub item_time: Option<String>,
    /// JSON pointer to a watermark in the response, RFC 3339 or epoch ms.
    #[arg(
        long = "http-watermark",
        env = "WATCHBRIDGE_HTTP_WATERMARK",
        value_name = "WATCHBRIDGE_HTTP_WATERMARK"
    )]
    pub watermark: Option<String>,
    /// JSON pointer to a boolean that says the set of items is final.
    #[arg(
        long = "http-complete",
        env = "WATCHBRIDGE_HTTP_COMPLETE",
        value_name = "WATCHBRIDGE_HTTP_COMPLETE"
    )]
    pub complete: Option<String>,
    /// JSON pointer to the next page: a URL (absolute or relative) or a cursor.
    #[arg(
        long = "http-next",
        env = "WATCHBRIDGE_HTTP_NEXT",
        value_name = "WATCHBRIDGE_HTTP_NEXT"
    )]
    pub next: Option<String>,
    /// Query parameter that carries a cursor read by WATCHBRIDGE_HTTP_NEXT.
    #[arg(
        long = "http-cursor-param",
        env = "WATCHBRIDGE_HTTP_CURSOR_PARAM",
        value_name = "WATCHBRIDGE_HTTP_CURSOR_PARAM",
        default_value = "cursor"
    )]
    pub cursor_param: String,
    /// Most pages read in one poll (`304 Not Modified` pages do not count); the next poll
    /// continues at the first page not read, until one reaches the last page.
    #[arg(
        long = "http-max-pages",
        env = "WATCHBRIDGE_HTTP_MAX_PAGES",
        value_name = "WATCHBRIDGE_HTTP_MAX_PAGES",
        default_value_t = 100
    )]
    pub max_pages: u32,
    /// Extra request headers, one `Name: value` per line; `${VAR}` is read from the
    /// environment at start. Values are never logged.
    #[arg(
        long = "http-headers",
        env = "WATCHBRIDGE_HTTP_HEADERS",
        value_name = "WATCHBRIDGE_HTTP_HEADERS",
        hide_env_values = true
    )]
    pub headers: Option<Redacted>,
    /// Largest response body read (bytes, or with KiB/MiB/GiB); a larger one fails the poll.
    #[arg(
        long = "http-max-bytes",
        env = "WATCHBRIDGE_HTTP_MAX_BYTES",
        value_name = "WATCHBRIDGE_HTTP_MAX_BYTES",
        default_value = "4MiB"
    )]
    pub max_bytes: String,
    /// Most response bytes one poll reads over all its pages (same units as
    /// WATCHBRIDGE_HTTP_MAX_BYTES); more fails the poll (`over_budget`).
    #[arg(
        long = "http-max-poll-bytes",
        env = "WATCHBRIDGE_HTTP_MAX_POLL_BYTES",
        value_name = "WATCHBRIDGE_HTTP_MAX_POLL_BYTES",
        default_value = "16MiB"
    )]
    pub max_poll_bytes: String,
    /// Most items one poll reads over all its pages; more fails the poll (`over_budget`).
    #[arg(
        long = "http-max-poll-items",
        env = "WATCHBRIDGE_HTTP_MAX_POLL_ITEMS",
        value_name = "WATCHBRIDGE_HTTP_MAX_POLL_ITEMS",
        default_value_t = 100_000
    )]
    pub max_poll_items: usize,
    /// Comma-separated hosts (`name` or `name:port`) that URLs, next pages and redirects may
    /// reach. Unset: each watch stays on the host its URL names.
    #[arg(
        long = "http-allowed-hosts",
        env = "WATCHBRIDGE_HTTP_ALLOWED_HOSTS",
        value_name = "WATCHBRIDGE_HTTP_ALLOWED_HOSTS"
    )]
    pub allowed_hosts: Option<String>,
    #[command(flatten)]
    pub auth: super::auth::AuthArgs,
    #[command(flatten)]
    pub client: super::client::ClientArgs,
}

/// `WATCHBRIDGE_HTTP_METHOD`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpMethod {
    /// Written as HTTP writes it (any case is read).
    #[default]
    #[value(name = "GET")]
    Get,
    #[value(name = "POST")]
    Post,
}

pub use crate::secrets::Redacted;

/// The HTTP poller's checked settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub url: Template,
    /// `WATCHBRIDGE_HTTP_METHOD`: `GET` or `POST`.
    pub method: reqwest::Method,
    /// `WATCHBRIDGE_HTTP_BODY`, only with `POST`.
    pub body: Option<BodyTemplate>,
    pub items: String,
    pub item_key: String,
    pub item_time: Option<String>,
    /// `WATCHBRIDGE_HTTP_ITEM_VERSION`: an item's version, part of its identity.
    pub item_version: Option<String>,
    pub watermark: Option<String>,
    pub complete: Option<String>,
    pub next: Option<String>,
    pub cursor_param: String,
    pub max_pages: u32,
    /// Marked sensitive: `Debug` prints `Sensitive` instead of the value.
    pub headers: HeaderMap,
    pub max_bytes: u64,
    /// Most body bytes one poll reads over all its pages (`WATCHBRIDGE_HTTP_MAX_POLL_BYTES`).
    pub max_poll_bytes: u64,
    /// Most items one poll reads over all its pages (`WATCHBRIDGE_HTTP_MAX_POLL_ITEMS`).
    pub max_poll_items: usize,
    pub allowed_hosts: Option<Vec<AllowedHost>>,
    /// Each request's deadline (`WATCHBRIDGE_POLL_TIMEOUT`; the engine bounds the whole poll).
    pub timeout: Duration,
    /// How requests authenticate (`WATCHBRIDGE_HTTP_AUTH`).
    pub auth: super::auth::AuthConfig,
    /// Trust, client certificate and proxy of the HTTP client.
    pub client: super::client::ClientConfig,
}

impl HttpConfig {
    /// A config with defaults for everything but the URL (for code and tests).
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        HttpArgs {
            url: Some(url.to_string()),
            ..HttpArgs::defaults()
        }
        .config(Duration::from_secs(30), &|name| std::env::var(name).ok())
    }
}

/// A placeholder in the URL's scheme is always refused (the input would choose http or
/// https); one in its user info, host or port only when `WATCHBRIDGE_HTTP_ALLOWED_HOSTS` is
/// set, which then bounds the hosts an input can name. Without this, `http://{key}:8080/`
/// lets an input reach any host (`0x7f000002` is 127.0.0.2).
pub(crate) fn check_origin_placeholders(
    url: &Template,
    allowed_hosts: bool,
) -> Result<(), ConfigError> {
    const URL: &str = "WATCHBRIDGE_HTTP_URL";
    for (placeholder, part) in url.origin_placeholders() {
        match part {
            OriginPart::Scheme => {
                return Err(ConfigError::new(
                    URL,
                    format!(
                        "`{placeholder}` is in the scheme of `{}`: an input must not choose it; write http:// or https://",
                        crate::logging::url(&url.to_string())
                    ),
                ))
            }
            OriginPart::Authority if !allowed_hosts => {
                return Err(ConfigError::new(
                    URL,
                    format!(
                        "`{placeholder}` is in the host or port of `{}`, so an input would choose which host is contacted (any host: `0x7f000001` is 127.0.0.1); move it into the path or query, or set WATCHBRIDGE_HTTP_ALLOWED_HOSTS to the hosts an input may name",
                        crate::logging::url(&url.to_string())
                    ),
                ))
            }
            OriginPart::Authority => {}
        }
    }
    Ok(())
}

/// The template must become a URL whatever the input: with every placeholder filled by a
/// sample value (`1`, which fits a path, a query, a host label and a port) it must parse as
/// an http(s) URL, and its own text must name a host (`https:///x` would otherwise read `x`
/// as the host). Without this, `http://`, a space in the host or `http://h:notaport/` pass
/// the start and dead-letter every input.
pub(crate) fn check_url_shape(text: &str, url: &Template) -> Result<(), ConfigError> {
    const URL: &str = "WATCHBRIDGE_HTTP_URL";
    let invalid = |why: String| {
        ConfigError::new(
            URL,
            format!("`{text}` is not a valid URL, whatever the input: {why}"),
        )
    };
    let after_scheme = text.split_once("://").map_or("", |(_, rest)| rest);
    if after_scheme.is_empty() || after_scheme.starts_with(['/', '?', '#', '\\']) {
        return Err(invalid("it names no host".into()));
    }
    let sample = url.with_placeholders_as("1");
    match url::Url::parse(&sample) {
        Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(()),
        Ok(_) => Err(invalid("it names no host".into())),
        Err(e) => Err(invalid(format!(
            "{e} (with each placeholder filled by `1`: `{sample}`)"
        ))),
    }
}

/// With `WATCHBRIDGE_HTTP_ALLOWED_HOSTS` set, a watch's URL must name one of its hosts: when
/// the template's host and port are its own text, check that at start rather than
/// dead-letter every input (a port-less entry means the default port, not any port).
fn check_own_host_allowed(url: &Template, allowed: &[AllowedHost]) -> Result<(), ConfigError> {
    if !url.origin_placeholders().is_empty() {
        return Ok(());
    }
    let Ok(sample) = url::Url::parse(&url.with_placeholders_as("x")) else {
        return Ok(());
    };
    let (Some(host), Some(port)) = (sample.host_str(), sample.port_or_known_default()) else {
        return Ok(());
    };
    if allowed.iter().any(|h| h.matches(&sample)) {
        return Ok(());
    }
    Err(ConfigError::new(
        "WATCHBRIDGE_HTTP_ALLOWED_HOSTS",
        format!(
            "does not name `{host}:{port}`, the host and port of WATCHBRIDGE_HTTP_URL (an entry without a port means port {} for {})",
            if sample.scheme() == "https" { 443 } else { 80 },
            sample.scheme()
        ),
    ))
}

/// One entry of `WATCHBRIDGE_HTTP_ALLOWED_HOSTS`: `host` or `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// As a URL parser writes it: lowercase, an IPv4 address as a dotted quad (`0x7f000001`
    /// and `2130706433` are `127.0.0.1`), IPv6 in brackets.
    pub host: String,
    /// `None`: the default port of the URL's scheme (80 for http, 443 for https), not any
    /// port.
    pub port: Option<u16>,
}

impl AllowedHost {
    /// Parse one entry, normalising the host as a URL's host is normalised.
    pub fn parse(entry: &str) -> Option<Self> {
        // Parse as the authority of a URL so IPv6 (`[::1]:8080`) and ports work.
        let url = url::Url::parse(&format!("http://{entry}/"))
            .ok()
            .filter(|u| u.username().is_empty() && u.password().is_none() && u.path() == "/")?;
        let host = url.host_str()?.to_string();
        // The parser drops a port that is http's default: `h:80` still names port 80.
        let explicit = entry
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let port = url.port().or(explicit.then_some(80));
        Some(Self { host, port })
    }

    /// `url`'s host (in its normal form, as the URL parser wrote it) is this entry's, on this
    /// entry's port, or on its scheme's default port when the entry names none.
    pub fn matches(&self, url: &url::Url) -> bool {
        url.host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
            && match self.port {
                Some(p) => url.port_or_known_default() == Some(p),
                None => url.port().is_none() && url.port_or_known_default().is_some(),
            }
    }
}

impl HttpArgs {
    /// The defaults clap would fill in, for building args in code.
    pub fn defaults() -> Self {
        Self {
            cursor_param: "cursor".into(),
            max_pages: 100,
            max_bytes: "4MiB".into(),
            max_poll_bytes: "16MiB".into(),
            max_poll_items: 100_000,
            ..Self::default()
        }
    }

    /// Check every setting. `env` looks up `${VAR}` in header values.
    pub fn config(
        &self,
        timeout: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpConfig, ConfigError> {
        const URL: &str = "WATCHBRIDGE_HTTP_URL";
        let text = self.url.as_deref().ok_or_else(|| {
            ConfigError::new(URL, "is required when WATCHBRIDGE_POLLER=http (e.g. http://127.0.0.1:8080/users/{/id}/events)")
        })?;
        let url = Template::parse(text).map_err(|e| ConfigError::new(URL, e.to_string()))?;
        check_origin_placeholders(&url, self.allowed_hosts.is_some())?;
        if !(text.starts_with("http://") || text.starts_with("https://")) {
            return Err(ConfigError::new(
                URL,
                format!(
                    "`{}` must start with http:// or https://",
                    crate::logging::url(text)
                ),
            ));
        }
        check_url_shape(text, &url)?;
        for (field, in_query) in url.last_placeholders() {
            if !in_query {
                return Err(ConfigError::new(
                    URL,
                    format!(
                        "`{{{}}}` must be in the query (after `?`, e.g. `?since={{last.time}}`): it is empty until the watch has seen an output, and an empty path value would name another resource",
                        field.name()
                    ),
                ));
            }
            if field == crate::pollers::template::LastField::Cursor && self.next.is_none() {
                return Err(ConfigError::new(
                    URL,
                    "`{last.cursor}` needs WATCHBRIDGE_HTTP_NEXT, the pointer to the cursor a page gives",
                ));
            }
        }
        let method = match self.method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
        };
        let body = self
            .body
            .as_deref()
            .map(|text| {
                // A body on a GET is ignored or refused by servers: say so rather than
                // send one they would not read.
                if method != reqwest::Method::POST {
                    return Err(ConfigError::new(
                        "WATCHBRIDGE_HTTP_BODY",
                        "is set, but a body is sent only with WATCHBRIDGE_HTTP_METHOD=POST (it is GET)",
                    ));
                }
                BodyTemplate::parse(text).map_err(|m| ConfigError::new("WATCHBRIDGE_HTTP_BODY", m))
            })
            .transpose()?;
        if self.max_pages == 0 {
            return Err(ConfigError::new(
                "WATCHBRIDGE_HTTP_MAX_PAGES",
                "must be at least 1",
            ));
        }
        if self.max_poll_items == 0 {
            return Err(ConfigError::new(
                "WATCHBRIDGE_HTTP_MAX_POLL_ITEMS",
                "must be at least 1",
            ));
        }
        if self.cursor_param.is_empty() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_HTTP_CURSOR_PARAM",
                "must not be empty",
            ));
        }
        if timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_POLL_TIMEOUT",
                "must be more than zero",
            ));
        }
        let allowed_hosts = self
            .allowed_hosts
            .as_deref()
            .map(parse_allowed_hosts)
            .transpose()?;
        if let Some(allowed) = &allowed_hosts {
            check_own_host_allowed(&url, allowed)?;
        }
        let headers = match &self.headers {
            Some(text) => parse_headers(&text.0, env)?,
            None => HeaderMap::new(),
        };
        let auth = self.auth.config()?;
        if !matches!(auth, super::auth::AuthConfig::None)
            && headers.contains_key(reqwest::header::AUTHORIZATION)
        {
            return Err(ConfigError::new(
                "WATCHBRIDGE_HTTP_HEADERS",
                "sets Authorization, and so does WATCHBRIDGE_HTTP_AUTH: keep one",
            ));
        }
        Ok(HttpConfig {
            url,
            method,
            body,
            items: pointer("WATCHBRIDGE_HTTP_ITEMS", &self.items)?,
            item_key: pointer("WATCHBRIDGE_HTTP_ITEM_KEY", &self.item_key)?,
            item_time: optional_pointer("WATCHBRIDGE_HTTP_ITEM_TIME", &self.item_time)?,
            item_version: optional_pointer("WATCHBRIDGE_HTTP_ITEM_VERSION", &self.item_version)?,
            watermark: optional_pointer("WATCHBRIDGE_HTTP_WATERMARK", &self.watermark)?,
            complete: optional_pointer("WATCHBRIDGE_HTTP_COMPLETE", &self.complete)?,
            next: optional_pointer("WATCHBRIDGE_HTTP_NEXT", &self.next)?,
            cursor_param: self.cursor_param.clone(),
            max_pages: self.max_pages,
            headers,
            max_bytes: parse_bytes(&self.max_bytes)
                .map_err(|m| ConfigError::new("WATCHBRIDGE_HTTP_MAX_BYTES", m))?,
            max_poll_bytes: parse_bytes(&self.max_poll_bytes)
                .map_err(|m| ConfigError::new("WATCHBRIDGE_HTTP_MAX_POLL_BYTES", m))?,
            max_poll_items: self.max_poll_items,
            allowed_hosts,
            timeout,
            auth,
            client: self.client.config()?,
        })
    }
}

/// A JSON pointer (RFC 6901): empty (the whole document) or starting with `/`.
fn pointer(var: &'static str, text: &str) -> Result<String, ConfigError> {
    if text.is_empty() || text.starts_with('/') {
        Ok(text.to_string())
    } else {
        Err(ConfigError::new(
            var,
            format!(
                "`{text}` is not a JSON pointer: write `/{text}` (or empty for the whole document)"
            ),
        ))
    }
}

fn optional_pointer(
    var: &'static str,
    text: &Option<String>,
) -> Result<Option<String>, ConfigError> {
    text.as_deref().map(|t| pointer(var, t)).transpose()
}

/// `Name: value` lines; `${VAR}` expanded from `env`, `$$` is a literal `$`.
fn parse_headers(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HeaderMap, ConfigError> {
    const VAR: &str = "WATCHBRIDGE_HTTP_HEADERS";
    let mut headers = HeaderMap::new();
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(ConfigError::new(
                VAR,
                format!("line {n} is not `Name: value`"),
            ));
        };
        // A mistyped line (`Authorization Bearer …: x`) may hold the secret before its
        // first `:`: say where, never what.
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            ConfigError::new(
                VAR,
                format!("line {n}: the text before the first `:` is not a header name (a header name is letters, digits and `-`; the line is not shown, as it may hold a secret)"),
            )
        })?;
        let value = expand(value.trim(), env)
            .map_err(|m| ConfigError::new(VAR, format!("header `{name}`: {m}")))?;
        let value = super::auth::sensitive_header(&value).ok_or_else(|| {
            ConfigError::new(
                VAR,
                format!("header `{name}`: the value has characters a header cannot carry"),
            )
        })?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Expand `${VAR}` from `env`. The error names the variable, never a value.
fn expand(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(after) = after.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| "`${` without a closing `}`".to_string())?;
            let name = &body[..end];
            let value = env(name).ok_or_else(|| {
                format!("refers to ${{{name}}}, which is not set in the environment")
            })?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// `4194304`, `512KiB`, `4MiB`, `1GiB`, `500kB`, `4MB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "`{text}` is not a size such as 4194304, 512KiB or 4MiB"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 4194304, 512KiB or 4MiB"))?;
    match n.checked_mul(scale) {
        Some(0) => Err("must be more than zero".into()),
        Some(b) => Ok(b),
        None => Err(format!("`{text}` is too large")),
    }
}

fn parse_allowed_hosts(text: &str) -> Result<Vec<AllowedHost>, ConfigError> {
    const VAR: &str = "WATCHBRIDGE_HTTP_ALLOWED_HOSTS";
    let mut hosts = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some(host) = AllowedHost::parse(entry) else {
            return Err(ConfigError::new(
                VAR,
                format!("`{entry}` is not a host or host:port"),
            ));
        };
        hosts.push(host);
    }
    if hosts.is_empty() {
        return Err(ConfigError::new(VAR, "is set but names no host"));
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "API_TOKEN").then(|| "s3cret".to_string())
    }

    fn args(url: &str) -> HttpArgs {
        HttpArgs {
            url: Some(url.into()),
            ..HttpArgs::defaults()
        }
    }

    fn err(a: HttpArgs) -> ConfigError {
        a.config(Duration::from_secs(5), &env).unwrap_err()
    }

    #[test]
    fn headers_expand_variables_and_are_never_printed() {
        let a = HttpArgs {
            headers: Some(Redacted(
                "Authorization: Bearer ${API_TOKEN}\n\nX-Price: $$5\nX-Multi: a\nX-Multi: b".into(),
            )),
            ..args("http://h/")
        };
        assert!(!format!("{a:?}").contains("API_TOKEN"));
        let c = a.config(Duration::from_secs(5), &env).unwrap();
        assert_eq!(c.headers["authorization"], "Bearer s3cret");
        assert_eq!(c.headers["x-price"], "$5");
        assert_eq!(c.headers.get_all("x-multi").iter().count(), 2);
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
    }

    #[test]
    fn bad_settings_name_their_variable() {
        let e = err(HttpArgs::defaults());
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_URL");
        assert_eq!(err(args("ftp://h/{key}")).var, "WATCHBRIDGE_HTTP_URL");
        assert!(err(args("http://h/{id}"))
            .message
            .contains("unknown placeholder"));
        let e = err(HttpArgs {
            items: "data".into(),
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_ITEMS");
        assert!(e.message.contains("write `/data`"), "{e}");
        let e = err(HttpArgs {
            headers: Some(Redacted("Authorization: Bearer ${NOPE}".into())),
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_HEADERS");
        assert!(e.message.contains("${NOPE}, which is not set"), "{e}");
        let e = err(HttpArgs {
            headers: Some(Redacted("no colon here".into())),
            ..args("http://h/")
        });
        assert!(e.message.contains("line 1"), "{e}");
        let e = err(HttpArgs {
            max_bytes: "lots".into(),
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_MAX_BYTES");
        let e = err(HttpArgs {
            max_poll_bytes: "0".into(),
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_MAX_POLL_BYTES");
        let e = err(HttpArgs {
            max_poll_items: 0,
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_MAX_POLL_ITEMS");
        let e = err(HttpArgs {
            allowed_hosts: Some("a.example, user@b.example".into()),
            ..args("http://h/")
        });
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_ALLOWED_HOSTS");
        assert!(e.message.contains("user@b.example"), "{e}");
        let e = HttpArgs::defaults()
            .config(Duration::ZERO, &env)
            .unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_URL");
        assert_eq!(
            args("http://h/")
                .config(Duration::ZERO, &env)
                .unwrap_err()
                .var,
            "WATCHBRIDGE_POLL_TIMEOUT"
        );
    }

    #[test]
    fn a_placeholder_in_the_scheme_host_or_port_needs_allowed_hosts() {
        for (template, placeholder) in [
            ("http://{key}:8080/", "{key}"),
            ("http://{/host}/users", "{/host}"),
            ("https://api-{/region}.example/x", "{/region}"),
            ("http://127.0.0.1:{/port}/x", "{/port}"),
            ("http://u{key}@h/x", "{key}"),
            ("{/scheme}://api.example/", "{/scheme}"),
            ("http{/s}://api.example/", "{/s}"),
        ] {
            let e = err(args(template));
            assert_eq!(e.var, "WATCHBRIDGE_HTTP_URL", "{template}: {e}");
            assert!(
                e.message.contains(&format!("`{placeholder}`")),
                "{template}: {e}"
            );
            if !template.contains("scheme}") && !template.contains("{/s}") {
                assert!(
                    e.message.contains("WATCHBRIDGE_HTTP_ALLOWED_HOSTS"),
                    "{template}: {e}"
                );
                let with_hosts = HttpArgs {
                    allowed_hosts: Some("api.example".into()),
                    ..args(template)
                };
                assert!(
                    with_hosts.config(Duration::from_secs(5), &env).is_ok(),
                    "{template}"
                );
            }
        }
        // The input can still choose the scheme in no case: only `http://` or `https://`.
        let e = err(HttpArgs {
            allowed_hosts: Some("api.example".into()),
            ..args("{/scheme}://api.example/")
        });
        assert!(e.message.contains("`{/scheme}`"), "{e}");
        // Placeholders after the authority are fine, and so are literal braces in it.
        for template in [
            "http://h:8080/{key}",
            "http://h?{key}",
            "http://h#{key}",
            "http://h/a{{b}}/{/id}",
        ] {
            assert!(
                args(template).config(Duration::from_secs(5), &env).is_ok(),
                "{template}"
            );
        }
    }

    #[test]
    fn allowed_hosts_must_name_the_templates_own_host_and_port() {
        let with = |url: &str, hosts: &str| {
            HttpArgs {
                allowed_hosts: Some(hosts.into()),
                ..args(url)
            }
            .config(Duration::from_secs(5), &env)
        };
        assert!(with("http://api.example/{key}", "api.example").is_ok());
        assert!(with("https://api.example/{key}", "api.example").is_ok());
        assert!(with("http://api.example:8080/{key}", "other, api.example:8080").is_ok());
        let e = with("http://api.example:8080/{key}", "api.example").unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_ALLOWED_HOSTS");
        assert!(
            e.message.contains("`api.example:8080`") && e.message.contains("port 80 for http"),
            "{e}"
        );
        // A host from the input is checked per input instead.
        assert!(with("http://{key}:8080/", "api.example").is_ok());
    }

    #[test]
    fn an_allowed_host_without_a_port_means_the_default_port() {
        let hosts = parse_allowed_hosts("api.example, api.example:8443, h:80, 0x7f000001").unwrap();
        let m = |i: usize, url: &str| hosts[i].matches(&url::Url::parse(url).unwrap());
        assert!(m(0, "http://api.example/x"));
        assert!(m(0, "https://api.example/x"));
        assert!(m(0, "https://API.example:443/x"));
        assert!(!m(0, "http://api.example:8080/x"), "not every port");
        assert!(!m(0, "https://api.example:8443/x"));
        assert!(m(1, "https://api.example:8443/x"));
        assert!(!m(1, "https://api.example/x"));
        // An explicit port is that port, even when it is http's default.
        assert!(m(2, "http://h/x"));
        assert!(!m(2, "https://h/x"), "h:80 is not h:443");
        // Entries are normalised as URL hosts are: numeric IPv4 forms become dotted quads.
        assert_eq!(hosts[3].host, "127.0.0.1");
        assert!(m(3, "http://2130706433/"));
        assert!(!m(3, "http://localhost/"));
    }

    #[test]
    fn sizes_and_hosts_parse() {
        assert_eq!(parse_bytes("4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("2 kB"), Ok(2000));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("99999999999GiB").is_err());
        let hosts = parse_allowed_hosts("api.example.com, 127.0.0.1:8080,[::1]:9").unwrap();
        assert_eq!(
            hosts[0],
            AllowedHost {
                host: "api.example.com".into(),
                port: None
            }
        );
        assert_eq!(hosts[1].port, Some(8080));
        assert_eq!(hosts[2].host, "[::1]");
        let u = url::Url::parse("http://127.0.0.1:8080/x").unwrap();
        assert!(hosts[1].matches(&u));
        assert!(!hosts[1].matches(&url::Url::parse("http://127.0.0.1:8081/x").unwrap()));
        assert!(hosts[0].matches(&url::Url::parse("https://API.example.com/x").unwrap()));
        assert!(hosts[2].matches(&url::Url::parse("http://[::1]:9/").unwrap()));
    }
    /// `WATCHBRIDGE_HTTP_BODY` is checked at start: it needs `WATCHBRIDGE_HTTP_METHOD=POST`
    /// (an error naming both), and with every placeholder filled it must be JSON, so that
    /// no input is dead-lettered for the template's own fault.
    #[test]
    fn a_body_needs_post_and_must_be_json_whatever_the_input() {
        let with = |method: HttpMethod, body: &str| {
            HttpArgs {
                method,
                body: Some(body.into()),
                ..args("http://h/")
            }
            .config(Duration::from_secs(5), &env)
        };
        let e = with(HttpMethod::Get, r#"{"a": 1}"#).unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_HTTP_BODY");
        assert!(e.message.contains("WATCHBRIDGE_HTTP_METHOD=POST"), "{e}");
        assert!(HttpArgs {
            method: HttpMethod::Post,
            ..args("http://h/")
        }
        .config(Duration::from_secs(5), &env)
        .is_ok());
        for good in [
            r#"{"a": "{/a} and {key}", "b": {/b}, "c": [{/c}, {key}], "d": "\u007bkey}"}"#,
            r#"{"query": "query{user{id}}", "n": -1.5e3, "ok": [true, null]}"#,
            r#"[{/a}, "{/b}"]"#,
            // The example of docs/pollers/http.md.
            r#"{"query": "query($id: ID!, $tenant: String) { events(user: $id, tenant: $tenant) { nodes { id at } } }",
                "variables": {"id": {/id}, "tenant": "{/org/name}", "watch": "{key}"}}"#,
            "{/a}",
            r#" {"a": { "b" : {/a} } } "#,
        ] {
            assert!(with(HttpMethod::Post, good).is_ok(), "{good}");
        }
        for bad in [
            r#"{"a": 1"#,
            r#"{"a": x{/id}}"#,
            r#"{"a": {/a}{/b}}"#,
            r#"{"a": {/a} {/b}}"#,
            r#"{"a": 1{/a}}"#,
            r#"{"a": -{/a}}"#,
            r#"{"a": {/a}.5}"#,
            r#"{{/k}: 1}"#,
            r#"{"a": "{/a"}"#,
            r#"{"a": {"b": {/a}}"#,
            "",
            "query { user }",
        ] {
            let e = with(HttpMethod::Post, bad).unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_HTTP_BODY", "{bad}: {e}");
        }
        let e = with(HttpMethod::Post, r#"{"a": x{/id}}"#).unwrap_err();
        assert!(e.message.contains("not JSON"), "{e}");
    }
}
