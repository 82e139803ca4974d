//! A real Prometheus server for integration tests: one process per [`Prometheus`], scraping
//! the targets a test gives it every second, asked through its HTTP API.
//!
//! The binary is `$PROMETHEUS_BIN`, else Debian's `/usr/bin/prometheus` (the `prometheus`
//! package, which `make setup` installs), else `prometheus` on the `PATH`. Each server has
//! its own temp dir (`prometheus.yml`, the TSDB, `prometheus.log`) and listens on a free
//! loopback port, so it never depends on Prometheus's usual :9090 (or on a packaged daemon
//! that may hold it).

use super::broker_process::free_port;
use super::watchdog;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// How long Prometheus may take to answer `/-/ready` after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A series' labels, `__name__` included when the expression keeps it.
pub type Labels = BTreeMap<String, String>;

/// One target as `/api/v1/targets` shows it.
#[derive(Debug, Clone)]
pub struct Target {
    pub job: String,
    pub scrape_url: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
    pub last_error: String,
}

/// A Prometheus process; stopped (and its dir removed) when dropped, or when the test
/// process ends however it ends (`watchdog.rs`).
pub struct Prometheus {
    /// `http://127.0.0.1:PORT`
    url: String,
    dir: PathBuf,
    /// The watchdog shell; closing its stdin stops Prometheus.
    watchdog: Child,
    client: reqwest::Client,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`HOST:PORT`, path `/metrics`) as job `job`
    /// every second, and waits until it is ready. Panics if the binary is missing (run
    /// `make setup`) or it does not start, with the end of its log.
    pub async fn start(job: &str, targets: &[String]) -> Self {
        let bin = prometheus_bin();
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("build an HTTP client");
        let started = Instant::now();
        // A port picked free can be taken before Prometheus binds it: try a few.
        for attempt in 1..=3 {
            let dir = tempfile::Builder::new()
                .prefix("watchbridge-prometheus-")
                .tempdir()
                .expect("create a temp dir for prometheus")
                .keep();
            std::fs::write(dir.join("prometheus.yml"), config(job, targets))
                .expect("write prometheus.yml");
            let port = free_port();
            let listen = format!("127.0.0.1:{port}");
            let watchdog = watchdog::spawn(
                "prometheus",
                &dir,
                &[
                    bin.as_os_str(),
                    "--config.file=prometheus.yml".as_ref(),
                    "--storage.tsdb.path=data".as_ref(),
                    format!("--web.listen-address={listen}").as_ref(),
                    "--log.level=info".as_ref(),
                ],
            );
            let mut prometheus = Self {
                url: format!("http://{listen}"),
                dir,
                watchdog,
                client: client.clone(),
            };
            match prometheus.wait_ready().await {
                Ok(()) => {
                    eprintln!(
                        "prometheus: ready on {listen} after {:.1?}, scraping {targets:?}, dir {}",
                        started.elapsed(),
                        prometheus.dir.display()
                    );
                    return prometheus;
                }
                Err(log) if attempt < 3 && log.contains("address already in use") => {
                    eprintln!("prometheus: port {port} was taken, retrying on another");
                    drop(prometheus);
                }
                Err(log) => panic!(
                    "prometheus ({}) did not start on {listen} (attempt {attempt}, dir {}); \
                     the end of its log:\n{log}",
                    bin.display(),
                    prometheus.dir.display()
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `http://127.0.0.1:PORT`, Prometheus's own address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its dir: `prometheus.yml`, `prometheus.log`, the TSDB in `data/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        watchdog::log_tail(&self.dir, "prometheus")
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            if let Some(status) = self.watchdog.try_wait().expect("poll the watchdog") {
                return Err(format!("prometheus exited ({status})\n{}", self.log_tail()));
            }
            match self
                .client
                .get(format!("{}/-/ready", self.url))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = format!("/-/ready answered {}", r.status()),
                Err(e) => last = format!("/-/ready: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "not ready within {START_TIMEOUT:?} ({last})\n{}",
            self.log_tail()
        ))
    }

    /// `GET /api/v1/<path>`'s `data`, or a panic with the error and the log.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let url = format!("{}/api/v1/{path}", self.url);
        let response = self
            .client
            .get(&url)
            .query(query)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}\n{}", self.log_tail()));
        let status = response.status();
        let text = response
            .text()
            .await
            .unwrap_or_else(|e| panic!("GET {url} ({status}): {e}"));
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("GET {url} ({status}): not JSON ({e}): {text}"));
        if body["status"] != "success" {
            panic!(
                "GET {url} {query:?} ({status}): {} {}",
                body["errorType"], body["error"]
            );
        }
        body["data"].clone()
    }

    /// Evaluates `expr` now (`/api/v1/query`): each series of an instant vector with its
    /// value, or one unlabelled value for a scalar. `NaN` and `±Inf` come back as such.
    pub async fn query(&self, expr: &str) -> Vec<(Labels, f64)> {
        let data = self.api("query", &[("query", expr)]).await;
        let value = |v: &Value| -> f64 {
            let text = v[1].as_str().unwrap_or_else(|| panic!("{expr}: value {v}"));
            text.parse()
                .unwrap_or_else(|e| panic!("{expr}: value {text:?}: {e}"))
        };
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .unwrap_or_else(|| panic!("{expr}: {data}"))
                .iter()
                .map(|series| {
                    let labels = series["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()))
                                .collect()
                        })
                        .unwrap_or_default();
                    (labels, value(&series["value"]))
                })
                .collect(),
            Some("scalar") => vec![(Labels::new(), value(&data["result"]))],
            other => panic!("{expr}: a {other:?} result, not an instant vector: {data}"),
        }
    }

    /// Polls `expr` until its result satisfies `ok` (Prometheus needs a scrape or two to see
    /// a change), and returns that result; panics at `within` with the last result, the
    /// targets and the log.
    pub async fn wait_for(
        &self,
        expr: &str,
        ok: impl Fn(&[(Labels, f64)]) -> bool,
        within: Duration,
    ) -> Vec<(Labels, f64)> {
        let deadline = Instant::now() + within;
        loop {
            let result = self.query(expr).await;
            if ok(&result) {
                return result;
            }
            if Instant::now() > deadline {
                panic!(
                    "{expr} = {result:?}, still not as expected after {within:?}; targets: {:?}\n\
                     the end of prometheus's log:\n{}",
                    self.targets().await,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The one value of `expr` once it has exactly one series (or is a scalar) whose value
    /// satisfies `ok`.
    pub async fn wait_for_value(
        &self,
        expr: &str,
        ok: impl Fn(f64) -> bool,
        within: Duration,
    ) -> f64 {
        self.wait_for(expr, |r| r.len() == 1 && ok(r[0].1), within)
            .await[0]
            .1
    }

    /// Every active target (`/api/v1/targets`).
    pub async fn targets(&self) -> Vec<Target> {
        let data = self.api("targets", &[("state", "active")]).await;
        data["activeTargets"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| Target {
                        job: t["labels"]["job"].as_str().unwrap_or_default().into(),
                        scrape_url: t["scrapeUrl"].as_str().unwrap_or_default().into(),
                        health: t["health"].as_str().unwrap_or_default().into(),
                        last_error: t["lastError"].as_str().unwrap_or_default().into(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until every target has been scraped successfully (health `up`), and returns them.
    pub async fn targets_up(&self, within: Duration) -> Vec<Target> {
        let deadline = Instant::now() + within;
        loop {
            let targets = self.targets().await;
            if !targets.is_empty() && targets.iter().all(|t| t.health == "up") {
                return targets;
            }
            if Instant::now() > deadline {
                panic!(
                    "targets not all up after {within:?}: {targets:#?}\n\
                     the end of prometheus's log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "prometheus on {} (dir {}); the end of its log:\n{}",
                self.url,
                self.dir.display(),
                self.log_tail()
            );
        }
        // EOF on the watchdog's stdin stops Prometheus; the shell exits once it has.
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `prometheus.yml`: every target scraped each second at `/metrics`.
fn config(job: &str, targets: &[String]) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: '{job}'\n    metrics_path: /metrics\n    \
         static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    )
}

fn prometheus_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PROMETHEUS_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "PROMETHEUS_BIN={} is not a file; unset it to use Debian's (`make setup`)",
            bin.display()
        );
        return bin;
    }
    let debian = Path::new("/usr/bin/prometheus");
    if debian.is_file() {
        return debian.into();
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("prometheus"))
                .find(|bin| bin.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "no Prometheus server: /usr/bin/prometheus is missing and none is on the PATH. \
                 Run `make setup` (it installs Debian's `prometheus` package), or set \
                 PROMETHEUS_BIN to a prometheus binary"
            )
        })
}
