//! A client of the bridge's operations server (`/healthz`, `/readyz`, `/metrics`); each test
//! binary adds the waits it needs in an `impl Ops` of its own.

use std::time::Duration;

pub struct Ops {
    base: String,
    client: reqwest::Client,
}

impl Ops {
    pub fn new(port: u16) -> Self {
        Self {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        }
    }

    /// Status and body, or `None` when nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }
}
