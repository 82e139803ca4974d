//! One test broker process that cannot outlive the process that started it: Tansu
//! (`tansu_process.rs`, `scripts/tansu.sh`) or Apache Kafka (`kafka_process.rs`,
//! `scripts/kafka.sh`). Only the command line differs; starting on free ports (retried if one
//! was taken), waiting until it answers metadata, crashing and restarting it on the same
//! ports and data, its pid and its log are the same for both, here.
//!
//! Shared by the integration tests (`support/kafka.rs`, one broker per test binary) and the
//! benchmarks (`benches/*.rs` include these files by `#[path]`, a fresh broker per case).
//! Only std and rdkafka: a bench includes these files alone.

use super::watchdog;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to run one kind of broker.
pub struct Launch<'a> {
    /// For messages: `tansu`, `kafka`.
    pub name: &'static str,
    /// The temp dir's name starts with this.
    pub prefix: &'a str,
    /// How many loopback ports it listens on; the first is the clients' (bootstrap) one.
    pub ports: usize,
    /// How long it may take to answer a metadata request after it was started.
    pub start_timeout: Duration,
    /// Its command line, given its dir and ports. Run in the dir, output to `broker.log`.
    pub command: &'a dyn Fn(&Path, &[u16]) -> Vec<OsString>,
    /// The ports to listen on (`ports` of them), when the caller chose them: e.g. a port a
    /// client was pointed at before the broker started. `None`: free ones.
    pub on: Option<&'a [u16]>,
}

/// A running broker under its watchdog (`watchdog.rs`: it cannot outlive this process; its
/// output goes to `broker.log` in its dir). Dropping it stops the broker and removes its dir.
pub struct BrokerProcess {
    pub bootstrap: String,
    pub dir: PathBuf,
    name: &'static str,
    start_timeout: Duration,
    /// The command line, ports included, so that a restart runs the same broker.
    command: Vec<OsString>,
    watchdog: Child,
}

impl BrokerProcess {
    /// Starts the broker on free loopback ports with its data in a new temp dir, and waits
    /// until it answers. A port picked free can be taken before the broker binds it: a few
    /// ports are tried.
    pub fn start(launch: &Launch) -> Result<BrokerProcess, String> {
        let name = launch.name;
        let started = Instant::now();
        for attempt in 1..=3 {
            let dir = tempfile::Builder::new()
                .prefix(launch.prefix)
                .tempdir()
                .unwrap_or_else(|e| panic!("create a temp dir for {name}: {e}"))
                .keep();
            let ports = match launch.on {
                Some(ports) => {
                    assert_eq!(
                        ports.len(),
                        launch.ports,
                        "{name} listens on {} port(s)",
                        launch.ports
                    );
                    ports.to_vec()
                }
                None => free_ports(launch.ports),
            };
            let mut process = BrokerProcess::spawn(launch, dir, &ports);
            match process.wait_ready() {
                Ok(()) => {
                    eprintln!(
                        "{name}: listening on {} after {:.1?} (dir {})",
                        process.bootstrap,
                        started.elapsed(),
                        process.dir.display()
                    );
                    return Ok(process);
                }
                Err(log) if attempt < 3 && log.contains("in use") => {
                    // Closing the pipe stops whatever is left of this attempt.
                    drop(process.watchdog.stdin.take());
                    let _ = process.watchdog.wait();
                    let _ = std::fs::remove_dir_all(&process.dir);
                    eprintln!("{name}: a port of {ports:?} was taken, retrying on others");
                }
                Err(log) => {
                    return Err(format!(
                        "{name} did not start on {} (attempt {attempt}, dir {}); the end of \
                         its log:\n{log}",
                        process.bootstrap,
                        process.dir.display()
                    ))
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Runs the broker in `dir` on `ports` under its watchdog, without waiting for it: the
    /// nodes of a cluster answer only once a quorum of them runs ([`BrokerProcess::start`]
    /// for one broker; `kafka_process.rs` for a cluster).
    pub fn spawn(launch: &Launch, dir: PathBuf, ports: &[u16]) -> BrokerProcess {
        let command = (launch.command)(&dir, ports);
        BrokerProcess {
            watchdog: watchdog::spawn("broker", &dir, &command),
            command,
            bootstrap: format!("127.0.0.1:{}", ports[0]),
            dir,
            name: launch.name,
            start_timeout: launch.start_timeout,
        }
    }

    /// The broker's process id (for CPU accounting, SIGKILL, SIGSTOP and SIGCONT).
    pub fn pid(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.pid"))
            .unwrap_or_else(|e| panic!("read {}/broker.pid: {e}", self.dir.display()))
            .trim()
            .to_string()
    }

    /// Crashes the broker (SIGKILL) and starts it again on the same ports with the same dir,
    /// so its storage (topics, records, committed offsets, groups) carries over, as it does
    /// for a real broker restart. Clients reconnect on their own.
    pub fn restart(&mut self) {
        self.kill_keeping_dir();
        self.start_again();
    }

    /// SIGKILLs the broker, keeping its dir: it is gone until [`BrokerProcess::start_again`].
    pub fn kill(&mut self) {
        self.kill_keeping_dir();
    }

    /// Starts the broker again (after [`BrokerProcess::kill`]) on the same ports with the
    /// same dir, and waits until it answers.
    pub fn start_again(&mut self) {
        let started = Instant::now();
        // The ports were just released; if one is briefly not bindable, try again for a
        // while: the address can't change.
        let mut last = String::new();
        for _ in 0..10 {
            self.watchdog = watchdog::spawn("broker", &self.dir, &self.command);
            match self.wait_ready() {
                Ok(()) => {
                    eprintln!(
                        "{}: restarted on {} after {:.1?}",
                        self.name,
                        self.bootstrap,
                        started.elapsed()
                    );
                    return;
                }
                Err(log) => {
                    self.kill_keeping_dir();
                    last = log;
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        panic!(
            "{} did not come back on {} (dir {}); the end of its log:\n{last}",
            self.name,
            self.bootstrap,
            self.dir.display()
        );
    }

    /// SIGKILLs the broker (if it still runs) and reaps the watchdog, without closing its
    /// stdin first: that would tell it its owner has exited, and it would remove the dir.
    /// (`Child::wait` closes stdin, hence the `take`.)
    fn kill_keeping_dir(&mut self) {
        let stdin = self.watchdog.stdin.take();
        if self
            .watchdog
            .try_wait()
            .unwrap_or_else(|e| panic!("poll the {} watchdog: {e}", self.name))
            .is_none()
        {
            let _ = Command::new("kill").args(["-KILL", &self.pid()]).status();
        }
        // The watchdog shell exits once the broker is gone.
        let _ = self.watchdog.wait();
        drop(stdin);
    }

    /// The last lines of the broker's log.
    pub fn log_tail(&self) -> String {
        watchdog::log_tail(&self.dir, "broker")
    }

    /// Waits until the broker accepts connections and answers a metadata request with itself
    /// as a broker. On failure returns the tail of its log.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let addr: SocketAddr = self.bootstrap.parse().unwrap();
        let deadline = Instant::now() + self.start_timeout;
        let mut last_error = String::from("no connection yet");
        while Instant::now() < deadline {
            let exited = self
                .watchdog
                .try_wait()
                .unwrap_or_else(|e| panic!("poll the {} watchdog: {e}", self.name));
            if let Some(status) = exited {
                return Err(format!(
                    "{} exited ({status})\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                let consumer: BaseConsumer = ClientConfig::new()
                    .set("bootstrap.servers", &self.bootstrap)
                    .create()
                    .expect("create a Kafka client");
                match consumer.fetch_metadata(None, Duration::from_secs(2)) {
                    Ok(m) if !m.brokers().is_empty() => return Ok(()),
                    Ok(_) => last_error = "metadata lists no brokers".into(),
                    Err(e) => last_error = format!("metadata: {e}"),
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "not ready within {:?} ({last_error})\n{}",
            self.start_timeout,
            self.log_tail()
        ))
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        // EOF on the watchdog's stdin stops the broker; the watchdog exits with it.
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// A loopback port free now (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("pick a free loopback port")
}

/// `n` distinct loopback ports free now (all bound at once, then released).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("pick a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// Runs `scripts/<script> path` in the clone (installing the broker once, its progress on
/// the terminal) and returns what it prints: the broker's binary or jar dir.
pub fn installed_path(script: &str, hint: &str) -> PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("scripts/{script}"))
        .arg("path")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {root}/scripts/{script} path: {e}"));
    assert!(
        out.status.success(),
        "{root}/scripts/{script} path failed ({}); `make broker-install` installs the test \
         brokers, {hint}",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}
