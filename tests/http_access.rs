//! The HTTP poller against APIs that need more than a URL: TLS with a private CA, mutual TLS,
//! a proxy, and authentication (basic, a bearer token file rotated during a run, OAuth2
//! client credentials). Real loopback servers; certificates made by each test (rcgen).

mod support;

use serde_json::json;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::http_server::{Reply, Seen, TestServer};
use support::proxy::TestProxy;
use support::tls::Pki;
use watchbridge::poll::{PollError, PollResult, Poller};
use watchbridge::pollers::http::auth::AuthArgs;
use watchbridge::pollers::http::client::ClientArgs;
use watchbridge::pollers::http::config::{HttpArgs, Redacted};
use watchbridge::pollers::http::HttpPoller;
use watchbridge::pollers::Resolve;

/// `{"items": [{"id": "a"}, {"id": "b"}]}`
fn two_items() -> Reply {
    Reply::json(json!({"items": [{"id": "a"}, {"id": "b"}]}))
}

/// A poller for `url` (items at `/items`, keyed by `/id`) with these extra settings, built
/// through the same checks as the binary's.
fn poller(url: &str, auth: AuthArgs, client: ClientArgs) -> HttpPoller {
    let config = HttpArgs {
        url: Some(url.into()),
        items: "/items".into(),
        item_key: "/id".into(),
        auth,
        client,
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap();
    HttpPoller::new(config).unwrap()
}

async fn poll(p: &HttpPoller) -> Result<PollResult, PollError> {
    let target = Arc::new(p.resolve(&json!({}), b"watch-1").unwrap());
    p.poll(target).await
}

fn keys(r: &PollResult) -> Vec<String> {
    r.outputs
        .iter()
        .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
        .collect()
}

fn authorization(seen: &Seen) -> Option<String> {
    seen.headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn a_server_with_a_private_ca_is_trusted_with_the_ca_file_and_only_then() {
    let pki = Pki::new("private CA");
    let server = TestServer::start_tls(|_| two_items(), pki.acceptor(false)).await;
    let url = server.url_at("localhost", "/feed");

    let untrusted = poll(&poller(&url, AuthArgs::default(), ClientArgs::default()))
        .await
        .unwrap_err();
    assert_eq!(untrusted.kind, "connect", "{untrusted}");

    let trusted = ClientArgs {
        ca_file: Some(pki.file("ca.pem", &pki.ca_pem)),
        ..Default::default()
    };
    let result = poll(&poller(&url, AuthArgs::default(), trusted))
        .await
        .unwrap();
    assert_eq!(keys(&result), ["a", "b"]);

    // The switch for tests: no verification at all.
    let insecure = ClientArgs {
        tls_insecure: true,
        ..Default::default()
    };
    let result = poll(&poller(&url, AuthArgs::default(), insecure))
        .await
        .unwrap();
    assert_eq!(keys(&result), ["a", "b"]);
}

#[tokio::test]
async fn mutual_tls_shows_the_client_certificate_the_server_requires() {
    let pki = Pki::new("mtls CA");
    let server = TestServer::start_tls(|_| two_items(), pki.acceptor(true)).await;
    let url = server.url_at("localhost", "/feed");
    let ca_file = Some(pki.file("ca.pem", &pki.ca_pem));

    let without = ClientArgs {
        ca_file: ca_file.clone(),
        ..Default::default()
    };
    let refused = poll(&poller(&url, AuthArgs::default(), without))
        .await
        .unwrap_err();
    assert_eq!(refused.kind, "connect", "{refused}");
    assert!(server.requests().is_empty());

    let with = ClientArgs {
        ca_file,
        client_cert: Some(pki.file("client.pem", &pki.client_cert_pem)),
        client_key: Some(pki.file("client.key", &pki.client_key_pem)),
        ..Default::default()
    };
    let result = poll(&poller(&url, AuthArgs::default(), with))
        .await
        .unwrap();
    assert_eq!(keys(&result), ["a", "b"]);
    assert_eq!(server.requests().len(), 1);
}

/// `api.test` resolves nowhere but in the test proxy: a request that did not go through the
/// proxy cannot reach the server.
#[tokio::test]
async fn with_a_proxy_set_every_request_goes_through_it_tunnelled_for_https() {
    let pki = Pki::new("proxy CA");
    let https = TestServer::start_tls(|_| two_items(), pki.acceptor(false)).await;
    let http = TestServer::start(|_| two_items()).await;
    for (server, expected) in [
        (&https, "CONNECT api.test:"),
        (&http, "GET http://api.test:"),
    ] {
        let proxy = TestProxy::start(server.addr).await;
        let url = server.url_at("api.test", "/feed");
        let direct = poll(&poller(
            &url,
            AuthArgs::default(),
            ClientArgs {
                ca_file: Some(pki.file("ca.pem", &pki.ca_pem)),
                proxy: Some(Redacted("none".into())),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
        assert_eq!(direct.kind, "connect", "{direct}");
        let p = poller(
            &url,
            AuthArgs::default(),
            ClientArgs {
                ca_file: Some(pki.file("ca.pem", &pki.ca_pem)),
                proxy: Some(Redacted(proxy.url())),
                ..Default::default()
            },
        );
        assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);
        let lines = proxy.request_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with(expected), "{lines:?}");
        assert!(
            lines[0].contains(&format!("api.test:{}", server.addr.port())),
            "{lines:?}"
        );
    }
}

/// Run `watchbridge poll-once` with only these variables of ours set (and none of the
/// proxy variables the machine may have).
fn poll_once(env: &[(&str, String)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        let proxy = name.to_ascii_lowercase().ends_with("_proxy");
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("SSL_CERT_") || proxy {
            command.env_remove(name);
        }
    }
    let out = command
        .args(["poll-once", "--input", r#"{"id": 42}"#, "--key", "user-42"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("WATCHBRIDGE_HTTP_ITEMS", "/items")
        .env("WATCHBRIDGE_HTTP_ITEM_KEY", "/id")
        .env("WATCHBRIDGE_LOG", "trace")
        .output()
        .expect("run watchbridge");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// How a container is set up: the private CA in the system's store (here `SSL_CERT_FILE`,
/// which OpenSSL and the system store loader both read) and `HTTPS_PROXY`; no
/// `WATCHBRIDGE_HTTP_*` setting for either.
#[tokio::test(flavor = "multi_thread")]
async fn the_system_ca_store_and_the_standard_proxy_variables_are_honoured() {
    let pki = Pki::new("system CA");
    let server = TestServer::start_tls(|_| two_items(), pki.acceptor(false)).await;
    let proxy = TestProxy::start(server.addr).await;
    let ca = pki.file("system-ca.pem", &pki.ca_pem);
    let url = server.url_at("api.test", "/users/{/id}/feed");
    let run =
        |env: Vec<(&'static str, String)>| tokio::task::spawn_blocking(move || poll_once(&env));

    let (code, out, err) = run(vec![
        ("WATCHBRIDGE_HTTP_URL", url.clone()),
        ("SSL_CERT_FILE", ca.display().to_string()),
        ("HTTPS_PROXY", proxy.url()),
    ])
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let lines = proxy.request_lines();
    assert!(
        lines.len() == 1 && lines[0].starts_with("CONNECT api.test:"),
        "{lines:?}"
    );
    assert_eq!(server.requests()[0].target, "/users/42/feed");

    // NO_PROXY exempts the host: it is then asked directly, and `api.test` is nowhere.
    let (code, _, err) = run(vec![
        ("WATCHBRIDGE_HTTP_URL", url.clone()),
        ("SSL_CERT_FILE", ca.display().to_string()),
        ("HTTPS_PROXY", proxy.url()),
        ("NO_PROXY", "api.test".into()),
    ])
    .await
    .unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("connect"), "{err}");
    assert_eq!(proxy.request_lines().len(), 1);

    // Without the CA in the store, the server is not trusted.
    let (code, _, err) = run(vec![
        ("WATCHBRIDGE_HTTP_URL", url),
        ("HTTPS_PROXY", proxy.url()),
    ])
    .await
    .unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("connect"), "{err}");
}

/// A server that wants `expected` in `Authorization`, and answers 401 otherwise.
fn guarded(expected: Arc<Mutex<String>>) -> impl Fn(&Seen) -> Reply {
    move |seen| {
        if authorization(seen).as_deref() == Some(expected.lock().unwrap().as_str()) {
            two_items()
        } else {
            Reply::status(401, "who are you?")
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_and_bearer_from_the_environment_are_sent_and_never_printed() {
    let expected = Arc::new(Mutex::new(String::new()));
    let server = TestServer::start(guarded(expected.clone())).await;
    let url = server.url("/users/{/id}/feed");
    for (header, env) in [
        (
            // aladdin:open sesame
            "Basic YWxhZGRpbjpvcGVuIHNlc2FtZQ==",
            vec![
                ("WATCHBRIDGE_HTTP_AUTH", "basic".to_string()),
                ("WATCHBRIDGE_HTTP_USERNAME", "aladdin".into()),
                ("WATCHBRIDGE_HTTP_PASSWORD", "open sesame".into()),
            ],
        ),
        (
            "Bearer hunter2",
            vec![
                ("WATCHBRIDGE_HTTP_AUTH", "bearer".to_string()),
                ("WATCHBRIDGE_HTTP_TOKEN", "hunter2".into()),
            ],
        ),
    ] {
        *expected.lock().unwrap() = header.into();
        let mut env = env;
        env.push(("WATCHBRIDGE_HTTP_URL", url.clone()));
        let (code, out, err) = tokio::task::spawn_blocking(move || poll_once(&env))
            .await
            .unwrap();
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.lines().count(), 2, "{out}");
        for secret in ["open sesame", "YWxhZGRpbjpvcGVuIHNlc2FtZQ", "hunter2"] {
            assert!(
                !err.contains(secret) && !out.contains(secret),
                "{secret}: {err}"
            );
        }
    }
    assert_eq!(server.requests().len(), 2);
}

/// Basic credentials go to the watch's own origin, not to a next page on another allowed
/// host.
#[tokio::test]
async fn credentials_go_only_to_the_watchs_own_origin() {
    let other = TestServer::start(|_| Reply::json(json!({"items": [{"id": "c"}]}))).await;
    let next = other.url("/more");
    let server = TestServer::start(move |_| {
        Reply::json(json!({"items": [{"id": "a"}], "next": next.clone()}))
    })
    .await;
    let config = HttpArgs {
        url: Some(server.url("/feed")),
        items: "/items".into(),
        item_key: "/id".into(),
        next: Some("/next".into()),
        allowed_hosts: Some(format!(
            "127.0.0.1:{},127.0.0.1:{}",
            server.addr.port(),
            other.addr.port()
        )),
        auth: AuthArgs {
            auth: Some("bearer".into()),
            token: Some(Redacted("s3cret".into())),
            ..Default::default()
        },
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap();
    let p = HttpPoller::new(config).unwrap();
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "c"]);
    assert_eq!(
        authorization(&server.requests()[0]).as_deref(),
        Some("Bearer s3cret")
    );
    assert_eq!(authorization(&other.requests()[0]), None);
}

/// A Kubernetes projected token: the kubelet writes a new file and swaps it in. The bridge
/// sends the new token from the first request after the swap, without a restart; and when
/// the server refuses a token first, a 401 makes it read the file once more.
#[tokio::test]
async fn a_bearer_token_file_rotated_during_a_run_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    let rotate = |token: &str| {
        let next = dir.path().join("token.next");
        std::fs::write(&next, format!("{token}\n")).unwrap();
        std::fs::rename(&next, &path).unwrap();
    };
    rotate("first");
    let expected = Arc::new(Mutex::new("Bearer first".to_string()));
    let server = TestServer::start(guarded(expected.clone())).await;
    let p = poller(
        &server.url("/feed"),
        AuthArgs {
            auth: Some("bearer".into()),
            token_file: Some(path.clone()),
            ..Default::default()
        },
        ClientArgs::default(),
    );
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);

    rotate("second");
    *expected.lock().unwrap() = "Bearer second".into();
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);
    let sent: Vec<_> = server.requests().iter().map(authorization).collect();
    assert_eq!(
        sent,
        [Some("Bearer first".into()), Some("Bearer second".into())]
    );

    // The server moves on before the file does: refused, and refused again after the
    // re-read (the same token), then the rotation lands.
    *expected.lock().unwrap() = "Bearer third".into();
    let refused = poll(&p).await.unwrap_err();
    assert_eq!(refused.kind, "http_4xx", "{refused}");
    assert!(!refused.message.contains("second"), "{refused}");
    assert_eq!(server.requests().len(), 4, "one 401, then one more try");
    rotate("third");
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);

    // A file gone is a failed poll that names it, and the watch goes on once it is back.
    std::fs::remove_file(&path).unwrap();
    let gone = poll(&p).await.unwrap_err();
    assert_eq!(gone.kind, "auth", "{gone}");
    assert!(gone.message.contains("token"), "{gone}");
    rotate("third");
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);
}

/// An identity provider and an API on one test server: `/token` hands out `tok-1`, `tok-2`,
/// … that live `lifetime_s`; the API takes the newest token only.
struct Provider {
    issued: AtomicUsize,
    token_requests: Mutex<Vec<Seen>>,
    unauthorized: AtomicUsize,
    lifetime_s: u64,
    /// The token endpoint's answer, when it is not a token.
    failure: Mutex<Option<(u16, String)>>,
}

fn provider(lifetime_s: u64) -> (Arc<Provider>, impl Fn(&Seen) -> Reply) {
    let p = Arc::new(Provider {
        issued: AtomicUsize::new(0),
        token_requests: Mutex::new(Vec::new()),
        unauthorized: AtomicUsize::new(0),
        lifetime_s,
        failure: Mutex::new(None),
    });
    let state = p.clone();
    let handler = move |seen: &Seen| {
        if seen.target == "/token" {
            state.token_requests.lock().unwrap().push(seen.clone());
            if let Some((status, body)) = state.failure.lock().unwrap().clone() {
                return Reply::status(status, body);
            }
            let n = state.issued.fetch_add(1, Ordering::SeqCst) + 1;
            return Reply::json(json!({
                "access_token": format!("tok-{n}"),
                "token_type": "bearer",
                "expires_in": state.lifetime_s,
            }))
            .delayed(Duration::from_millis(50));
        }
        let newest = format!("Bearer tok-{}", state.issued.load(Ordering::SeqCst));
        if authorization(seen).as_deref() == Some(newest.as_str()) {
            two_items()
        } else {
            state.unauthorized.fetch_add(1, Ordering::SeqCst);
            Reply::status(401, r#"{"error": "invalid_token"}"#)
        }
    };
    (p, handler)
}

fn oauth2(server: &TestServer, scopes: Option<&str>) -> AuthArgs {
    AuthArgs {
        auth: Some("oauth2".into()),
        oauth2_token_url: Some(server.url("/token")),
        oauth2_client_id: Some("bridge".into()),
        oauth2_client_secret: Some(Redacted("s3cret-of-the-client".into())),
        oauth2_scopes: scopes.map(str::to_string),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn oauth2_one_token_for_all_watches_renewed_before_expiry_and_after_a_401() {
    let (provider, handler) = provider(2);
    let server = TestServer::start(handler).await;
    let p = Arc::new(poller(
        &server.url("/feed"),
        oauth2(&server, Some("events:read")),
        ClientArgs::default(),
    ));

    // Eight watches poll at once: one token request, which they all wait for.
    let polls: Vec<_> = (0..8)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { poll(&p).await })
        })
        .collect();
    for poll in polls {
        assert_eq!(keys(&poll.await.unwrap().unwrap()), ["a", "b"]);
    }
    assert_eq!(provider.issued.load(Ordering::SeqCst), 1);
    let token_request = provider.token_requests.lock().unwrap()[0].clone();
    // The client authenticates with HTTP Basic (client_secret_basic): bridge:s3cret-of-the-client.
    assert_eq!(
        authorization(&token_request).as_deref(),
        Some("Basic YnJpZGdlOnMzY3JldC1vZi10aGUtY2xpZW50")
    );

    // A 2 s token is renewed after 1 s, before it expires: no request is refused for it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);
    assert_eq!(provider.issued.load(Ordering::SeqCst), 2);
    assert_eq!(provider.unauthorized.load(Ordering::SeqCst), 0);

    // The provider revokes it (here: issues a newer one that alone is accepted): the API
    // answers 401, the bridge fetches a token once and asks again.
    provider.issued.fetch_add(1, Ordering::SeqCst);
    assert_eq!(keys(&poll(&p).await.unwrap()), ["a", "b"]);
    assert_eq!(provider.unauthorized.load(Ordering::SeqCst), 1);
    assert_eq!(provider.token_requests.lock().unwrap().len(), 3);

    // A token endpoint that refuses is a failed poll of kind `auth` with its reason, and
    // never shows the secret.
    *provider.failure.lock().unwrap() = Some((
        400,
        r#"{"error": "invalid_client", "error_description": "client disabled"}"#.into(),
    ));
    provider.issued.fetch_add(1, Ordering::SeqCst);
    let failed = poll(&p).await.unwrap_err();
    assert_eq!(failed.kind, "auth", "{failed}");
    assert!(
        failed.message.contains("invalid_client") && failed.message.contains("client disabled"),
        "{failed}"
    );
    assert!(!failed.message.contains("s3cret"), "{failed}");
}

#[test]
fn auth_and_tls_settings_are_checked_at_start_naming_the_variable() {
    let run = |env: &[(&str, &str)]| {
        let mut env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        env.push(("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:9/x".into()));
        poll_once(&env)
    };
    for (env, named) in [
        (
            &[("WATCHBRIDGE_HTTP_AUTH", "kerberos")][..],
            "WATCHBRIDGE_HTTP_AUTH",
        ),
        (
            &[("WATCHBRIDGE_HTTP_TOKEN", "hunter2")][..],
            "WATCHBRIDGE_HTTP_TOKEN",
        ),
        (
            &[
                ("WATCHBRIDGE_HTTP_AUTH", "bearer"),
                ("WATCHBRIDGE_HTTP_TOKEN_FILE", "/nonexistent/token"),
            ][..],
            "WATCHBRIDGE_HTTP_TOKEN_FILE",
        ),
        (
            &[
                ("WATCHBRIDGE_HTTP_AUTH", "bearer"),
                ("WATCHBRIDGE_HTTP_TOKEN", "hunter2"),
                ("WATCHBRIDGE_HTTP_HEADERS", "Authorization: Bearer other"),
            ][..],
            "WATCHBRIDGE_HTTP_HEADERS",
        ),
        (
            &[("WATCHBRIDGE_HTTP_CA_FILE", "/nonexistent/ca.pem")][..],
            "WATCHBRIDGE_HTTP_CA_FILE",
        ),
        (
            &[("WATCHBRIDGE_HTTP_CLIENT_CERT", "/nonexistent/c.pem")][..],
            "WATCHBRIDGE_HTTP_CLIENT_KEY",
        ),
        (
            &[("WATCHBRIDGE_HTTP_PROXY", "socks9://proxy:1")][..],
            "WATCHBRIDGE_HTTP_PROXY",
        ),
    ] {
        let (code, _, err) = run(env);
        assert_eq!(code, 2, "{named}: {err}");
        assert!(err.contains(named), "{named}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
