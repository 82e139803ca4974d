//! A `watchbridge` process under test: started with a clean environment against the test
//! broker, its log in a temp file, SIGTERM on request, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::kafka::broker;

/// A `watchbridge` process; killed when dropped, its log kept in a temp file.
pub struct Bridge {
    pub child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Bridge {
    /// Start it and wait until its topics exist.
    pub fn start(env: &[(&str, String)]) -> Self {
        let bridge = Self::spawn(env);
        // Logged once its topics exist.
        bridge.wait_for_log("bridge starting", Duration::from_secs(60));
        bridge
    }

    /// Start it, without waiting for anything.
    /// (`WATCHBRIDGE_TEST_BIN` names another build of the binary: to run a test against
    /// the code of an earlier commit and see it fail.)
    pub fn spawn(env: &[(&str, String)]) -> Self {
        let program = std::env::var_os("WATCHBRIDGE_TEST_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_watchbridge")),
            PathBuf::from,
        );
        Self::spawn_program(&program, env)
    }

    /// [`Bridge::start`] with another program that runs a bridge (an example built on the
    /// library), given the same environment.
    pub fn start_program(program: &Path, env: &[(&str, String)]) -> Self {
        let bridge = Self::spawn_program(program, env);
        bridge.wait_for_log("bridge starting", Duration::from_secs(60));
        bridge
    }

    /// [`Bridge::spawn`] with another program: the test's own `WATCHBRIDGE_*` and `KAFKA_*`
    /// variables removed, the test broker and the settings below, then `env`.
    pub fn spawn_program(program: &Path, env: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bridge.log");
        let mut command = Command::new(program);
        for (name, _) in std::env::vars() {
            if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
                command.env_remove(name);
            }
        }
        // The shared test broker, unless the test names brokers (and then the shared one is
        // not even started).
        if !env.iter().any(|(k, _)| *k == "WATCHBRIDGE_BROKERS") {
            command.env("WATCHBRIDGE_BROKERS", broker().bootstrap());
        }
        command
            .env("WATCHBRIDGE_LOG", "info,librdkafka=warn,rdkafka=warn")
            .env("WATCHBRIDGE_POLL_INTERVAL", "200ms")
            .env("WATCHBRIDGE_SHUTDOWN_TIMEOUT", "10s")
            .env("WATCHBRIDGE_WATERMARK_INTERVAL", "100ms")
            // The output key as a header: tests tell outputs apart by
            // `watchbridge-output-key` (a test of the default headers sets `none`, one of
            // every header `all`). Only that one: Tansu on SQLite keeps each header as a row
            // and reads them back with a query per record, and the shared test broker slowed
            // down enough with four per output to time out other tests' requests.
            .env("WATCHBRIDGE_OUTPUT_HEADERS", "output_key")
            // Any free port, so that bridges running at once do not collide on 9898.
            .env("WATCHBRIDGE_METRICS_ADDR", "127.0.0.1:0")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, once `server` has answered `polls` more requests and two seconds of
    /// checkpoints have passed (so the state topic has what those polls changed).
    pub async fn kill_after_polls(
        &mut self,
        server: &super::http_server::TestServer,
        polls: usize,
    ) {
        let polled = server.requests().len();
        while server.requests().len() < polled + polls {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Wait until `text` occurs at least `n` times in the log (or panic with it).
    pub fn wait_for_log_count(&self, text: &str, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            let found = log.matches(text).count();
            if found >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the log says {text:?} {found} times, not {n}, after {within:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until the log contains `text` (or panic with the log).
    pub fn wait_for_log(&self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.log().contains(text) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("bridge log never said {text:?}:\n{}", self.log());
    }

    /// Wait for a bridge that ends by itself (a bounded run, a refused start); its exit code
    /// (panics with the log if it runs past `within`).
    pub fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "the bridge did not end within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM; returns the exit code and how long it took.
    pub fn terminate(&mut self) -> (Option<i32>, Duration) {
        match self.terminate_within(Duration::from_secs(30)) {
            Ok(ended) => ended,
            Err(_) => panic!("bridge did not stop:\n{}", self.log()),
        }
    }

    /// SIGTERM, then wait up to `within` for the process to exit: its exit code and how
    /// long it took, or (`Err`) how long it had been running since the SIGTERM when the
    /// wait gave up (it is still running then; dropping it kills it).
    pub fn terminate_within(
        &mut self,
        within: Duration,
    ) -> Result<(Option<i32>, Duration), Duration> {
        let started = Instant::now();
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.wait_for_exit(started, within)
    }

    /// Wait until the process exits, at most until `since + within`: its exit code and the
    /// time since `since`, or (`Err`) that time when it still runs.
    pub fn wait_for_exit(
        &mut self,
        since: Instant,
        within: Duration,
    ) -> Result<(Option<i32>, Duration), Duration> {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Ok((status.code(), since.elapsed()));
            }
            if since.elapsed() > within {
                return Err(since.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // To trace a failed fault run afterwards: `WATCHBRIDGE_TEST_KEEP_LOGS=<dir>` keeps
        // every bridge's log there, named by its process id.
        if let Some(dir) = std::env::var_os("WATCHBRIDGE_TEST_KEEP_LOGS") {
            let dir = PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(
                &self.log,
                dir.join(format!("bridge-{}.log", self.child.id())),
            );
        }
    }
}
