//! The HTTP JSON poller (`WATCHBRIDGE_POLLER=http`, the default): each watch GETs a URL made
//! from its input (or POSTs a JSON body made from it too: `body.rs`), reads the items of a
//! JSON response (following pages), and returns one output per item, keyed by the item's
//! identity and stamped with its event time.
//!
//! Faults are poll errors, never panics, and their `kind` says which fault it was (the
//! engine retries transient ones with backoff and counts them by kind):
//!
//! | kind | what | retried |
//! |---|---|---|
//! | `timeout` | no complete response within `WATCHBRIDGE_POLL_TIMEOUT` | yes |
//! | `connect` | connection refused, DNS, TLS (an untrusted server, a refused client certificate) | yes |
//! | `auth` | no credential to send: token file missing or empty, OAuth2 token endpoint refused | yes |
//! | `http_429`, `http_503`, `http_5xx` | server busy or broken; `Retry-After` honoured, up to `WATCHBRIDGE_RETRY_AFTER_MAX` | yes |
//! | `http_4xx` | 404, 408 and 425 are retried; other 4xx mean the request is wrong | 404/408/425 |
//! | `too_large` | body above `WATCHBRIDGE_HTTP_MAX_BYTES` (read no further) | yes |
//! | `over_budget` | the poll's pages together above `WATCHBRIDGE_HTTP_MAX_POLL_BYTES` or `WATCHBRIDGE_HTTP_MAX_POLL_ITEMS` (read no further) | yes |
//! | `malformed_json`, `missing_field`, `bad_time`, `bad_next` | the response is not what the settings describe | yes |
//! | `redirect_refused`, `next_refused` | a redirect or next page to a host not allowed | yes |
//! | `request` | anything else the client reports | yes |
//!
//! Only hosts a watch may reach are ever contacted: the host its URL names (substituted
//! values are percent-encoded, so an input cannot change it; a template that puts a
//! placeholder in the host or port needs `WATCHBRIDGE_HTTP_ALLOWED_HOSTS`), plus
//! `WATCHBRIDGE_HTTP_ALLOWED_HOSTS`. Redirects (followed here, hop by hop) and next-page links
//! elsewhere, or from https to http, are refused. The configured headers go only to the
//! origin of the watch's URL, and so does the credential (`auth.rs`); no `Referer` is sent.
//! The client's trust, client certificate and proxy are `client.rs`'s.

pub mod auth;
pub mod body;
mod checked;
pub mod client;
pub mod config;
mod last;
pub mod link;
mod page;
mod rate_limit;
mod raw;

pub use config::{HttpArgs, HttpConfig};

use crate::clock::Millis;
use crate::logging::{outside, Outside};
use crate::poll::{PollError, PollResult, Poller};
use crate::pollers::{RenderError, Resolve};
use auth::Auth;
use bytes::Bytes;
use config::AllowedHost;
use page::Page;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Response, StatusCode};
use serde_json::Value;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use url::Url;

/// A URL as messages and logs show it: secrets redacted, escaped, bounded
/// ([`crate::logging::url`]). Next pages and redirects come from the server, so a URL can be
/// as long as a response is.
pub(crate) fn shown(url: &Url) -> Outside<'_> {
    crate::logging::url(url.as_str())
}

/// Redirects followed for one request before giving up.
const MAX_REDIRECTS: usize = 10;

/// Polls JSON HTTP APIs. One client (connection pool) is shared by every watch.
pub struct HttpPoller {
    client: client::PendingClient,
    /// Shared by every watch: one OAuth2 token, one read of a token file.
    auth: Arc<Auth>,
    config: Arc<HttpConfig>,
}

/// What one watch polls: its URL, fixed when the watch starts, the validators of the pages
/// it read (for conditional requests), and where its next poll starts.
#[derive(Debug)]
pub struct HttpTarget {
    url: Url,
    host: Arc<str>,
    /// The JSON body every request of the watch sends (`WATCHBRIDGE_HTTP_BODY`, POST only),
    /// made from the input once, when the watch starts, as its URL is.
    body: Option<bytes::Bytes>,
    /// Written only after a whole poll succeeds, so a poll that failed half way never makes
    /// a later one skip pages whose items were not emitted.
    pages: Mutex<Vec<CachedPage>>,
    /// The first page the last poll did not read because it stopped at
    /// `WATCHBRIDGE_HTTP_MAX_PAGES`: the next poll starts there instead of at `url`, so a
    /// listing longer than the limit is read whole over several polls (were every poll to
    /// start at `url`, pages past the limit would never be read). `None` once a poll reached
    /// the last page. Written with `pages`, only after a poll succeeded: a failed poll is
    /// retried from where it started.
    continue_at: Mutex<Option<Url>>,
    /// With `{last.*}` in the URL template: the template with this input's values in place,
    /// and what the watch has seen so far, which fills the rest at each poll.
    incremental: Option<Box<Incremental>>,
}

/// A watch's incremental request ([`last`]).
#[derive(Debug)]
struct Incremental {
    bound: crate::pollers::template::Template,
    last: Mutex<last::Last>,
}

impl HttpTarget {
    /// The first page to ask for: the URL, with the watch's last values where the template
    /// has `{last.*}`.
    fn first_page(&self) -> Url {
        let Some(inc) = &self.incremental else {
            return self.url.clone();
        };
        let last = inc.last.lock().unwrap_or_else(|p| p.into_inner());
        let text = inc.bound.render_last(|field| last.value(field));
        // Only the query changes, and values are percent-encoded: the URL stays one.
        Url::parse(&text).unwrap_or_else(|_| self.url.clone())
    }

    pub fn url(&self) -> &Url {
        &self.url
    }
}

/// A page that carried `ETag` or `Last-Modified`, and where it pointed next.
#[derive(Debug, Clone)]
struct CachedPage {
    url: Url,
    etag: Option<HeaderValue>,
    last_modified: Option<HeaderValue>,
    next: Option<Url>,
}

impl HttpPoller {
    pub fn new(config: HttpConfig) -> Result<Self, crate::pollers::ConfigError> {
        // Checked here too, for configs built in code rather than by `HttpArgs::config`.
        config::check_origin_placeholders(&config.url, config.allowed_hosts.is_some())?;
        // Redirects are followed by `send`, which decides each hop and its headers.
        let client = client::PendingClient::spawn(&config.client, config.timeout);
        Ok(Self {
            auth: Arc::new(Auth::new(&config.auth, client.clone())),
            client,
            config: Arc::new(config),
        })
    }
}

/// `a` and `b` are one origin: scheme, host and port (RFC 6454). Configured headers go only
/// to the origin of the watch's URL.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str()
            .zip(b.host_str())
            .is_some_and(|(x, y)| x.eq_ignore_ascii_case(y))
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Why a hop (a redirect or a next page) from `from` to `to` is refused, if it is: it goes
/// from https to anything else, or it leaves the host and port of `origin` (the watch's
/// URL) for a host not in `allowed`.
fn refuse_hop(to: &Url, from: &Url, origin: &Url, allowed: &[AllowedHost]) -> Option<&'static str> {
    if from.scheme() == "https" && to.scheme() != "https" {
        return Some("from https to http, which is refused");
    }
    if !matches!(to.scheme(), "http" | "https") {
        return Some("not http or https");
    }
    let same_host = to
        .host_str()
        .zip(origin.host_str())
        .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
        && to.port_or_known_default() == origin.port_or_known_default();
    if same_host || allowed.iter().any(|h| h.matches(to)) {
        None
    } else {
        Some("on another host; allow it with WATCHBRIDGE_HTTP_ALLOWED_HOSTS")
    }
}

/// `to` may follow `from`: see [`refuse_hop`], with `from` as the origin.
#[cfg(test)]
fn may_reach(to: &Url, from: &Url, allowed: &[AllowedHost]) -> bool {
    refuse_hop(to, from, from, allowed).is_none()
}

impl Resolve for HttpPoller {
    fn resolve(&self, value: &Value, key: &[u8]) -> Result<HttpTarget, RenderError> {
        // With `{last.*}`, the template bound to the input; its URL is that with none yet.
        let (text, incremental) = match self.config.url.last_placeholders().is_empty() {
            true => (self.config.url.render(value, key)?, None),
            false => {
                let bound = self.config.url.bind(value, key)?;
                let text = bound.render_last(|_| String::new());
                let last = Mutex::default();
                (text, Some(Box::new(Incremental { bound, last })))
            }
        };
        let url = Url::parse(&text).map_err(|e| {
            RenderError::Unusable(format!(
                "`{}` is not a valid URL: {e}",
                crate::logging::url(&text)
            ))
        })?;
        let host = match (url.scheme(), url.host_str()) {
            ("http" | "https", Some(host)) if !host.is_empty() => host.to_ascii_lowercase(),
            _ => {
                return Err(RenderError::Unusable(format!(
                    "`{}` is not an http(s) URL with a host",
                    crate::logging::url(&text)
                )))
            }
        };
        if let Some(allowed) = &self.config.allowed_hosts {
            if !allowed.iter().any(|h| h.matches(&url)) {
                return Err(RenderError::Unusable(format!(
                    "`{}` names a host that is not in WATCHBRIDGE_HTTP_ALLOWED_HOSTS",
                    shown(&url)
                )));
            }
        }
        let body = match &self.config.body {
            Some(template) => Some(template.render(value, key)?.into()),
            None => None,
        };
        Ok(HttpTarget {
            url,
            host: host.into(),
            body,
            pages: Mutex::new(Vec::new()),
            continue_at: Mutex::new(None),
            incremental,
        })
    }

    fn resume(&self, target: &HttpTarget, state: &[u8]) {
        let Some(inc) = &target.incremental else {
            return;
        };
        match last::Last::decode(state) {
            Some(saved) => *inc.last.lock().unwrap_or_else(|p| p.into_inner()) = saved,
            None => tracing::warn!(
                url = %shown(&target.url),
                "a restored watch's saved {{last.*}} values do not read as such; it asks as from its start"
            ),
        }
    }

    /// The client, built on its own thread since the poller was made (`client.rs`).
    fn ready(&self) -> Result<(), String> {
        self.client.get().map(|_| ()).map_err(str::to_string)
    }

    /// An output's value is its item's JSON text: the key is read again from it, with the
    /// same pointer and the same rule as when the page was read.
    fn output_key_reader(&self) -> Option<crate::pollers::OutputKeyReader> {
        let pointer = self.config.item_key.clone();
        Some(Arc::new(move |value: &[u8]| {
            let item: &serde_json::value::RawValue = serde_json::from_slice(value).ok()?;
            page::item_key(item, &pointer).map(bytes::Bytes::from)
        }))
    }
}

impl Poller for HttpPoller {
    type Input = HttpTarget;

    fn poll(
        &self,
        target: Arc<HttpTarget>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let client = self
            .client
            .get()
            .cloned()
            .map_err(|e| PollError::transient("client", e));
        let (auth, config) = (self.auth.clone(), self.config.clone());
        async move {
            let http = Http {
                client: client?,
                auth,
                config,
            };
            poll(&http, &target).await
        }
    }

    fn rate_key(&self, target: &HttpTarget) -> Option<Arc<str>> {
        Some(target.host.clone())
    }

    fn resume_state(&self, target: &HttpTarget) -> Option<Vec<u8>> {
        let inc = target.incremental.as_ref()?;
        let last = inc.last.lock().unwrap_or_else(|p| p.into_inner());
        Some(last.encode())
    }
}

/// What one poll uses: the shared client and credential, and the settings.
struct Http {
    client: reqwest::Client,
    auth: Arc<Auth>,
    config: Arc<HttpConfig>,
}

/// Validators are kept for at most this many times `WATCHBRIDGE_HTTP_MAX_PAGES` pages per
/// watch (the most recently read), so that a listing read over several polls can be walked
/// again as `304`s, while a server that links page after page cannot grow a watch's memory
/// without end.
const CACHED_PAGES_PER_MAX_PAGE: usize = 4;

/// One poll: the pages from the target's URL (or from where the last poll stopped at the
/// page limit), as one result.
async fn poll(http: &Http, target: &HttpTarget) -> Result<PollResult, PollError> {
    let config = &*http.config;
    let first_seen = now_ms();
    let cached = target.pages.lock().map(|p| p.clone()).unwrap_or_default();
    let continue_at = target.continue_at.lock().ok().and_then(|r| r.clone());
    let mut now_cached = Vec::new();
    let mut result = PollResult::default();
    let mut url = continue_at.unwrap_or_else(|| target.first_page());
    // The last cursor a page of this poll gave (`{last.cursor}`).
    let mut cursor = None;
    let mut visited = vec![url.clone()];
    // Pages read in this poll: a `304` is not read (nothing of it is new), so it does not
    // count toward `max_pages`; a poll asks for at most `max_pages` plus the pages it holds
    // validators for.
    let mut read_pages: usize = 0;
    let mut truncated = None;
    // Body bytes read by this poll so far, over all its pages (`max_poll_bytes`).
    let mut read: u64 = 0;
    loop {
        let previous = cached.iter().find(|c| c.url == url);
        let response = send(http, &target.url, &url, target.body.as_ref(), previous).await?;
        // A page that leaves no request in the server's window holds the host afterwards.
        result.host_wait = result
            .host_wait
            .max(rate_limit::wait(response.headers(), SystemTime::now()));
        let next = match response.status() {
            StatusCode::NOT_MODIFIED if previous.is_some() => {
                // Unchanged since the last poll: its items were all emitted then.
                let previous = previous.expect("checked above");
                now_cached.push(previous.clone());
                result.complete = false;
                previous.next.clone()
            }
            status if status.is_success() => {
                read_pages += 1;
                let etag = response.headers().get(header::ETAG).cloned();
                let last_modified = response.headers().get(header::LAST_MODIFIED).cloned();
                let link = link::next_link(
                    response
                        .headers()
                        .get_all(header::LINK)
                        .iter()
                        .filter_map(|v| v.to_str().ok()),
                );
                let page = if status == StatusCode::NO_CONTENT {
                    Page::default()
                } else {
                    let body = read_body(response, config, read, &url).await?;
                    read += body.len() as u64;
                    let items_left = config.max_poll_items.saturating_sub(result.outputs.len());
                    Page::parse(&body, config, first_seen, &url, items_left)?
                };
                let next = match page.next {
                    Some(next) => Some(next),
                    None => link
                        .map(|l| {
                            url.join(&l).map_err(|e| {
                                PollError::transient(
                                    "bad_next",
                                    format!(
                                        "{}: Link rel=\"next\" `{}` is not a URL: {e}",
                                        shown(&url),
                                        crate::logging::url(&l)
                                    ),
                                )
                            })
                        })
                        .transpose()?,
                };
                cursor = page.cursor.or(cursor);
                result.outputs.extend(page.outputs);
                result.watermark = match (result.watermark, page.watermark) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                result.complete = page.complete;
                if etag.is_some() || last_modified.is_some() {
                    now_cached.push(CachedPage {
                        url: url.clone(),
                        etag,
                        last_modified,
                        next: next.clone(),
                    });
                }
                next
            }
            _ => return Err(status_error(response, &url).await),
        };
        let Some(next) = next else { break };
        let allowed = config.allowed_hosts.as_deref().unwrap_or_default();
        if let Some(why) = refuse_hop(&next, &url, &target.url, allowed) {
            return Err(PollError::transient(
                "next_refused",
                format!("{}: the next page `{}` is {why}", shown(&url), shown(&next)),
            ));
        }
        if visited.contains(&next) {
            tracing::debug!(url = %shown(&url), next = %shown(&next), "next page already read in this poll; stopping");
            break;
        }
        if read_pages >= config.max_pages as usize {
            truncated = Some(next);
            break;
        }
        visited.push(next.clone());
        url = next;
    }
    if let Some(next) = &truncated {
        // Pages not read may hold anything: promise nothing about them.
        tracing::debug!(url = %shown(&target.url), next = %shown(next), max_pages = config.max_pages, "more pages than WATCHBRIDGE_HTTP_MAX_PAGES; the next poll continues there");
        result.complete = false;
        result.watermark = None;
    }
    // The validators of earlier polls' pages not asked for in this one stay (a continued
    // poll asks for other pages than the one before it), newest first, up to the cap.
    let cap = CACHED_PAGES_PER_MAX_PAGE.saturating_mul(config.max_pages as usize);
    for old in cached {
        if now_cached.len() >= cap {
            break;
        }
        if !visited.contains(&old.url) {
            now_cached.push(old);
        }
    }
    now_cached.truncate(cap);
    if let Ok(mut pages) = target.pages.lock() {
        *pages = now_cached;
    }
    if let Ok(mut continue_at) = target.continue_at.lock() {
        *continue_at = truncated;
    }
    if let Some(inc) = &target.incremental {
        let mut last = inc.last.lock().unwrap_or_else(|p| p.into_inner());
        last.advance(&result.outputs, cursor);
    }
    Ok(result)
}

/// Ask for `url` with the configured method (and `body`, with POST), conditionally if it
/// was read before with validators, following redirects.
///
/// The configured headers go only to `origin`'s origin (the watch's URL: scheme, host,
/// port). A redirect is followed only where a next page could go ([`refuse_hop`]); once a
/// chain has left the origin, no later hop of it carries the configured headers, even one
/// back on the origin. No `Referer` is ever sent. A 307 or 308 asks the next hop with the
/// same method and body; a 301, 302 or 303 turns a POST into a GET without a body, as
/// browsers do (and as servers that answer a POST with 303 expect).
async fn send(
    http: &Http,
    origin: &Url,
    url: &Url,
    body: Option<&bytes::Bytes>,
    previous: Option<&CachedPage>,
) -> Result<Response, PollError> {
    let config = &*http.config;
    let allowed = config.allowed_hosts.as_deref().unwrap_or_default();
    let mut hop = url.clone();
    let mut credentials = same_origin(url, origin);
    let (mut method, mut body) = (config.method.clone(), body);
    for _ in 0..=MAX_REDIRECTS {
        let response = request(http, &method, &hop, body, credentials, previous).await?;
        let status = response.status().as_u16();
        let followed = matches!(status, 301 | 302 | 303 | 307 | 308);
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok());
        let (true, Some(location)) = (followed, location) else {
            return Ok(response);
        };
        let refused = |why: String| {
            PollError::transient(
                "redirect_refused",
                format!("{} redirected to {why}", shown(url)),
            )
        };
        let to = hop.join(location).map_err(|e| {
            refused(format!(
                "`{}`, not a URL: {e}",
                crate::logging::url(location)
            ))
        })?;
        if let Some(why) = refuse_hop(&to, &hop, origin, allowed) {
            return Err(refused(format!("`{}`, {why}", shown(&to))));
        }
        credentials &= same_origin(&to, origin);
        if matches!(status, 301..=303) && method == reqwest::Method::POST {
            (method, body) = (reqwest::Method::GET, None);
        }
        hop = to;
    }
    Err(PollError::transient(
        "redirect_refused",
        format!("{}: more than {MAX_REDIRECTS} redirects", shown(url)),
    ))
}

/// One request to `hop`, with the configured headers and credential when `credentials`
/// (the watch's own origin). A 401 to a credential that can be renewed (an OAuth2 token, a
/// token file) is asked once more with the renewed one.
async fn request(
    http: &Http,
    method: &reqwest::Method,
    hop: &Url,
    body: Option<&bytes::Bytes>,
    credentials: bool,
    previous: Option<&CachedPage>,
) -> Result<Response, PollError> {
    let mut renewed = false;
    loop {
        let mut request = new_request(&http.client, method, hop, body);
        let mut authorization = None;
        if credentials {
            request = request.headers(http.config.headers.clone());
            authorization = http.auth.authorization().await?;
            if let Some(value) = &authorization {
                request = request.header(header::AUTHORIZATION, value.clone());
            }
        }
        if let Some(previous) = previous {
            if let Some(etag) = &previous.etag {
                request = request.header(header::IF_NONE_MATCH, etag);
            }
            if let Some(modified) = &previous.last_modified {
                request = request.header(header::IF_MODIFIED_SINCE, modified);
            }
        }
        let response = request.send().await.map_err(|e| client_error(&e, hop))?;
        if response.status() == StatusCode::UNAUTHORIZED && !renewed {
            if let Some(sent) = &authorization {
                if http.auth.rejected(sent) {
                    tracing::info!(url = %shown(hop), "401 Unauthorized: asking once more with a renewed credential");
                    renewed = true;
                    continue;
                }
            }
        }
        return Ok(response);
    }
}

/// A request of `method` for `url`, with `body` as JSON when there is one (a configured
/// `Content-Type` header, added after, wins).
fn new_request(
    client: &reqwest::Client,
    method: &reqwest::Method,
    url: &Url,
    body: Option<&bytes::Bytes>,
) -> reqwest::RequestBuilder {
    let request = client.request(method.clone(), url.clone());
    match body {
        Some(body) => request
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone()),
        None => request,
    }
}

/// Read the whole body, failing as soon as it is seen (from `Content-Length` or while
/// reading) to exceed `WATCHBRIDGE_HTTP_MAX_BYTES` (`too_large`), or to take the poll past
/// `WATCHBRIDGE_HTTP_MAX_POLL_BYTES`, of which `read` bytes went to its earlier pages
/// (`over_budget`). The rest is not read.
async fn read_body(
    mut response: Response,
    config: &HttpConfig,
    read: u64,
    url: &Url,
) -> Result<Bytes, PollError> {
    let max = config.max_bytes;
    let left = config.max_poll_bytes.saturating_sub(read);
    let too_large = || {
        PollError::transient(
            "too_large",
            format!(
                "{}: response body is larger than WATCHBRIDGE_HTTP_MAX_BYTES ({max} bytes)",
                shown(url)
            ),
        )
    };
    let over_budget = || {
        PollError::transient(
            "over_budget",
            format!(
                "{url}: this page would take the poll past WATCHBRIDGE_HTTP_MAX_POLL_BYTES ({} bytes over all pages; {read} read before it)",
                config.max_poll_bytes
            ),
        )
    };
    let check = |n: u64| {
        if n > max {
            Err(too_large())
        } else if n > left {
            Err(over_budget())
        } else {
            Ok(())
        }
    };
    if let Some(n) = response.content_length() {
        check(n)?;
    }
    // Chunks kept as they come: a body in one chunk (the usual) is not copied.
    let (mut chunks, mut len) = (Vec::new(), 0);
    while let Some(chunk) = response.chunk().await.map_err(|e| client_error(&e, url))? {
        len += chunk.len() as u64;
        check(len)?;
        chunks.push(chunk);
    }
    Ok(match chunks.len() {
        1 => chunks.pop().unwrap_or_default(),
        _ => Bytes::from(chunks.concat()),
    })
}

/// A response that is neither a success nor an expected `304`.
async fn status_error(mut response: Response, url: &Url) -> PollError {
    let status = response.status();
    let retry_after = retry_after(response.headers())
        .or_else(|| rate_limit::wait(response.headers(), SystemTime::now()));
    if status.is_redirection() {
        let to = response
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or("(no Location)")
            .to_string();
        return PollError::transient(
            "redirect_refused",
            format!(
                "{}: HTTP {status} to `{}` is not a redirect that is followed",
                shown(url),
                crate::logging::url(&to)
            ),
        );
    }
    // The start of the body often says why (an expired token, a bad parameter).
    let mut snippet = Vec::new();
    while snippet.len() < 200 {
        match response.chunk().await {
            Ok(Some(chunk)) => snippet.extend_from_slice(&chunk),
            _ => break,
        }
    }
    snippet.truncate(200);
    let snippet = String::from_utf8_lossy(&snippet);
    let message = format!("{}: HTTP {status}: {}", shown(url), outside(snippet.trim()));
    let error = match status.as_u16() {
        429 => PollError::transient("http_429", message),
        503 => PollError::transient("http_503", message),
        404 | 408 | 425 => PollError::transient("http_4xx", message),
        400..=499 => PollError::permanent("http_4xx", message),
        500..=599 => PollError::transient("http_5xx", message),
        _ => PollError::transient("request", message),
    };
    match retry_after {
        Some(after) => error.with_retry_after(after),
        None => error,
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date, as asked; the schedule caps it
/// (`WATCHBRIDGE_RETRY_AFTER_MAX`). Seconds too many for a `u64` are as long as can be (and
/// so capped); a date in the past is no wait; anything else (`-5`, `1.5`, `soon`) is no
/// `Retry-After`: the retry backoff alone decides.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Some(seconds) = rate_limit::delta_seconds(value) {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A failure the client reports (no response, or the body broke off).
fn client_error(e: &reqwest::Error, url: &Url) -> PollError {
    // reqwest's own text repeats the URL; say what happened, then why (its sources).
    let (kind, what) = if e.is_timeout() {
        ("timeout", "timed out")
    } else if e.is_connect() {
        ("connect", "cannot connect")
    } else if tls_failed(e) {
        // With TLS 1.3 a server refuses a client certificate after the client's side of the
        // handshake is done, so it shows as a failed request; it is a connection fault.
        ("connect", "TLS failed")
    } else if e.is_body() {
        ("request", "reading the body failed")
    } else {
        ("request", "request failed")
    };
    let mut message = format!("{}: {what}", shown(url));
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&outside(&s.to_string()).to_string());
        source = s.source();
    }
    PollError::transient(kind, message)
}

/// Somewhere in `e`'s sources is a TLS error (a rustls error, maybe inside an I/O error).
fn tls_failed(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let io_inner = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if s.is::<rustls::Error>() || io_inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        source = s.source();
    }
    false
}

fn now_ms() -> Millis {
    crate::pollers::event_time::from_system_time(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn entry(host: &str, port: Option<u16>) -> AllowedHost {
        AllowedHost {
            host: host.into(),
            port,
        }
    }

    /// TLS is not set up in the tests, so the downgrade rule is checked here on URLs: the
    /// same function decides every redirect and next page.
    #[test]
    fn a_hop_from_https_to_http_is_refused_whatever_is_allowed() {
        let from = u("https://api.example/a");
        assert!(may_reach(&u("https://api.example/b"), &from, &[]));
        assert!(!may_reach(&u("http://api.example:443/b"), &from, &[]));
        let allowed = [entry("api.example", None), entry("api.example", Some(80))];
        assert!(!may_reach(&u("http://api.example/b"), &from, &allowed));
        assert!(!may_reach(&u("http://api.example:80/b"), &from, &allowed));
        let other = [entry("other.example", None)];
        assert!(may_reach(&u("https://other.example/b"), &from, &other));
        assert!(!may_reach(&u("http://other.example/b"), &from, &other));
        // Upwards is fine, to an allowed origin.
        assert!(may_reach(
            &u("https://api.example/b"),
            &u("http://api.example/a"),
            &allowed
        ));
    }
}
