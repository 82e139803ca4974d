//! The store behind a `WATCHBRIDGE_OBJECT_URL`: built once at start from the URL's scheme
//! and bucket with `object_store`'s own credential sources from the environment, and the
//! faults of its requests turned into typed poll errors.
//!
//! `object_store`'s own retries are off: a failed request fails the poll at once, with a
//! `kind` the engine retries with its backoff (`WATCHBRIDGE_RETRY_*`), as every poller's
//! faults are. Its errors carry the status but not the headers, so each request goes
//! through [`Observed`], which notes the status and `Retry-After` of a refused request, and
//! counts requests, for the poll that made it (a task-local [`Exchange`]).

use crate::poll::PollError;
use crate::pollers::ConfigError;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use url::Url;

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
    Local,
}

impl Scheme {
    pub(crate) fn of(url: &Url) -> Option<Self> {
        Some(match url.scheme() {
            "s3" | "s3a" => Self::S3,
            "gs" => Self::Gcs,
            "az" | "azure" | "abfs" | "abfss" | "adl" => Self::Azure,
            "file" => Self::Local,
            _ => return None,
        })
    }

    /// Whether a listing comes back in lexical order of the keys, page after page (S3's
    /// ListObjectsV2, GCS and Azure do; a local directory walk does not). Only then is a
    /// listing cut short a listing of every key up to the last one it gave.
    pub fn lists_in_order(self) -> bool {
        self != Self::Local
    }

    /// The variables its credentials come from, for messages.
    fn credential_vars(self) -> &'static str {
        match self {
            Self::S3 => "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN)",
            Self::Gcs => "GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS)",
            Self::Azure => {
                "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, \
                 or AZURE_CLIENT_ID/AZURE_CLIENT_SECRET/AZURE_TENANT_ID)"
            }
            Self::Local => "none",
        }
    }
}

/// Build the store of `base` (`scheme://bucket`, no path) from the environment, with
/// `options` (`object_store`'s configuration keys, e.g. `aws_endpoint`) over it. Every fault
/// names `var`.
pub(crate) fn build(
    var: &'static str,
    scheme: Scheme,
    base: &str,
    options: &[(&str, &str)],
) -> Result<Arc<dyn ObjectStore>, ConfigError> {
    let no_retries = RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    };
    let err = |e: object_store::Error| {
        ConfigError::new(
            var,
            format!(
                "cannot set up the store of `{}`: {}",
                crate::logging::url(base),
                shown_error(&e)
            ),
        )
    };
    let unknown = |key: &str| {
        ConfigError::new(
            var,
            format!(
                "`{key}` is not a setting of the store of `{}`",
                crate::logging::url(base)
            ),
        )
    };
    macro_rules! with_options {
        ($builder:expr, $key:ty) => {{
            let mut builder = $builder;
            for (key, value) in options {
                let parsed: $key = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(parsed, *value);
            }
            builder
        }};
    }
    let store: Arc<dyn ObjectStore> = match scheme {
        Scheme::S3 => Arc::new(
            with_options!(
                object_store::aws::AmazonS3Builder::from_env(),
                object_store::aws::AmazonS3ConfigKey
            )
            .with_url(base)
            .with_retry(no_retries)
            .with_http_connector(ObservingConnector)
            .build()
            .map_err(err)?,
        ),
        Scheme::Gcs => Arc::new(
            with_options!(
                object_store::gcp::GoogleCloudStorageBuilder::from_env(),
                object_store::gcp::GoogleConfigKey
            )
            .with_url(base)
            .with_retry(no_retries)
            .with_http_connector(ObservingConnector)
            .build()
            .map_err(err)?,
        ),
        Scheme::Azure => Arc::new(
            with_options!(
                object_store::azure::MicrosoftAzureBuilder::from_env(),
                object_store::azure::AzureConfigKey
            )
            .with_url(base)
            .with_retry(no_retries)
            .with_http_connector(ObservingConnector)
            .build()
            .map_err(err)?,
        ),
        Scheme::Local => Arc::new(object_store::local::LocalFileSystem::new()),
    };
    Ok(store)
}

/// What one poll's requests met: how many were sent, and the status and `Retry-After` of
/// the last one refused.
#[derive(Debug, Default)]
pub struct Exchange {
    requests: AtomicU64,
    refused: Mutex<Option<Refused>>,
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    status: u16,
    retry_after: Option<Duration>,
}

impl Exchange {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn refused(&self) -> Option<Refused> {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }
}

tokio::task_local! {
    /// The exchange of the poll running on this task.
    pub(crate) static EXCHANGE: Arc<Exchange>;
}

/// Every store request, counted and its refusal noted in the poll's [`Exchange`].
#[derive(Debug)]
struct Observed(HttpClient);

impl HttpService for Observed {
    fn call<'a, 'b>(
        &'a self,
        req: HttpRequest,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<HttpResponse, HttpError>> + Send + 'b>,
    >
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            let response = self.0.execute(req).await;
            let _ = EXCHANGE.try_with(|exchange| {
                exchange.requests.fetch_add(1, Ordering::Relaxed);
                if let Ok(r) = &response {
                    if !r.status().is_success() {
                        let retry_after = r
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .map(Duration::from_secs);
                        *exchange.refused.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(Refused {
                                status: r.status().as_u16(),
                                retry_after,
                            });
                    }
                }
            });
            response
        })
    }
}

/// `object_store`'s own reqwest client, wrapped in [`Observed`].
#[derive(Debug)]
struct ObservingConnector;

impl HttpConnector for ObservingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Observed(inner)))
    }
}

/// An `object_store` error for a message: the query of each URL in it cut (an Azure SAS
/// token rides in one), escaped and bounded.
fn shown_error(e: &object_store::Error) -> String {
    let text = e.to_string();
    let shown: String = text
        .split_inclusive(char::is_whitespace)
        .map(|word| match (word.contains("://"), word.find('?')) {
            (true, Some(q)) => {
                let space = &word[word.trim_end().len()..];
                format!("{}?…{space}", &word[..q])
            }
            _ => word.to_string(),
        })
        .collect();
    crate::logging::outside(&shown).to_string()
}

/// The S3-style error code in a response body the error carries (`<Code>SlowDown</Code>`).
fn error_code(text: &str) -> Option<&str> {
    let start = text.find("<Code>")? + "<Code>".len();
    let end = start + text[start..].find("</Code>")?;
    Some(&text[start..end])
}

/// A failed store request as a poll error. `what` says what the request was for, e.g.
/// "list s3://bucket/tenants/acme".
pub(crate) fn poll_error(
    scheme: Scheme,
    what: &str,
    e: &object_store::Error,
    exchange: &Exchange,
) -> PollError {
    let text = e.to_string();
    let shown = shown_error(e);
    let refused = exchange.refused();
    let status = refused.map(|r| r.status);
    let code = error_code(&text).unwrap_or_default();
    // The store's own word first: a long error is cut at the end.
    let shown = if code.is_empty() {
        shown
    } else {
        format!("{} ({shown})", crate::logging::outside(code))
    };
    let credential = || {
        let hint = match code {
            "InvalidAccessKeyId" => " (the key in AWS_ACCESS_KEY_ID is not known to the store)",
            "SignatureDoesNotMatch" => {
                " (AWS_SECRET_ACCESS_KEY does not match the key in AWS_ACCESS_KEY_ID)"
            }
            "ExpiredToken" | "InvalidToken" => " (AWS_SESSION_TOKEN has expired or is not valid)",
            "AccessDenied" => " (the credential is known but may not list this prefix)",
            _ => "",
        };
        PollError::transient(
            "auth",
            format!(
                "cannot {what}: the store refused the credential{hint}; credentials come from {}: {shown}",
                scheme.credential_vars()
            ),
        )
    };
    if code == "SlowDown" || matches!(status, Some(503 | 429)) {
        let mut err = PollError::transient(
            "throttled",
            format!("cannot {what}: the store asks to slow down: {shown}"),
        );
        if let Some(after) = refused.and_then(|r| r.retry_after) {
            err = err.with_retry_after(after);
        }
        return err;
    }
    let denied = matches!(
        e,
        object_store::Error::Unauthenticated { .. } | object_store::Error::PermissionDenied { .. }
    );
    if denied || matches!(status, Some(401 | 403)) {
        return credential();
    }
    if matches!(e, object_store::Error::NotFound { .. }) || status == Some(404) {
        return PollError::transient(
            "no_bucket",
            format!("cannot {what}: the bucket (or container) does not exist: {shown}"),
        );
    }
    match status {
        Some(s) if s >= 500 => PollError::transient(
            "store_5xx",
            format!("cannot {what}: the store failed ({s}): {shown}"),
        ),
        Some(s) => PollError::transient(
            "store_4xx",
            format!("cannot {what}: the store refused the request ({s}): {shown}"),
        ),
        // No response at all: a connection fault, or no credential could be had (an
        // instance-metadata or token endpoint that did not answer).
        None if text.contains("credential") || text.contains("token") => PollError::transient(
            "auth",
            format!(
                "cannot {what}: no credential could be had; set {}: {shown}",
                scheme.credential_vars()
            ),
        ),
        None => PollError::transient("request", format!("cannot {what}: {shown}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_error_codes_are_read_from_the_body() {
        assert_eq!(
            error_code("x: <Error><Code>SlowDown</Code><Message>m</Message>"),
            Some("SlowDown")
        );
        assert_eq!(error_code("plain"), None);
    }

    #[test]
    fn queries_are_cut_from_shown_errors() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: "GET https://a.blob/c?sig=SECRET&x=1 failed".into(),
        };
        let shown = shown_error(&e);
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("https://a.blob/c?… failed"), "{shown}");
        let e = object_store::Error::Generic {
            store: "S3",
            source: "503: <?xml version=\"1.0\"?><Code>SlowDown</Code>".into(),
        };
        assert!(
            shown_error(&e).contains("<?xml version"),
            "{}",
            shown_error(&e)
        );
    }
}
