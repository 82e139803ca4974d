//! A client of the bridge's operations server (`/healthz`, `/readyz`, `/metrics`); each test
//! binary adds the waits it needs in an `impl Ops` of its own, beside the one they share
//! ([`Ops::wait_for`]).

use super::bridge::Bridge;
use std::time::{Duration, Instant};

pub struct Ops {
    base: String,
    client: reqwest::Client,
    /// Sent with every `GET` (the control API asks for it on reads too).
    token: Option<String>,
}

impl Ops {
    pub fn new(port: u16) -> Self {
        Self {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
            token: None,
        }
    }

    /// A client of the control API on `port`, sending `token` with its `GET`s.
    #[allow(dead_code)]
    pub fn with_token(port: u16, token: &str) -> Self {
        Self {
            token: Some(token.to_string()),
            ..Self::new(port)
        }
    }

    /// Status and body, or `None` when nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// Poll `path` (every 50 ms) until `done` says so of its answer (`None`: nothing
    /// answered), or panic with the bridge's log after `within`: that answer.
    #[allow(dead_code)]
    pub async fn wait_until(
        &self,
        bridge: &Bridge,
        path: &str,
        within: Duration,
        done: impl Fn(Option<&(u16, String)>) -> bool,
    ) -> Option<(u16, String)> {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.get(path).await;
            if done(answer.as_ref()) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "{path} answered {answer:?} for {within:?}; bridge log:\n{}",
                bridge.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Poll `path` until it answers `status` (or panic with the bridge's log): its body.
    #[allow(dead_code)]
    pub async fn wait_for(
        &self,
        bridge: &Bridge,
        path: &str,
        status: u16,
        within: Duration,
    ) -> String {
        let answered = self
            .wait_until(bridge, path, within, |a| {
                a.is_some_and(|(s, _)| *s == status)
            })
            .await;
        answered.expect("an answer, with that status").1
    }

    /// `POST path`, with `Authorization: Bearer <token>` when given: status and body, or
    /// `None` when nothing answers.
    pub async fn post(&self, path: &str, token: Option<&str>) -> Option<(u16, String)> {
        let mut request = self.client.post(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// The value of one sample of `/metrics`, e.g. `watchbridge_ready` or
    /// `watchbridge_consumer_lag_messages{partition="0"}` (`None` when nothing answers or
    /// there is no such sample).
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (status, body) = self.get("/metrics").await?;
        assert_eq!(status, 200, "{body}");
        sample_value(&body, sample)
    }
}

/// The value of `sample` in a Prometheus text exposition.
pub fn sample_value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}
