//! One Tansu broker process (the test broker, `scripts/tansu.sh`) that cannot outlive the
//! process that started it. Shared by the integration tests (`support/kafka.rs`, one broker
//! per test binary) and the benchmarks (`benches/*.rs` include this file by `#[path]`, a
//! fresh broker per case), so both start, wait for and stop Tansu the same way.
//!
//! Only std and rdkafka: a bench includes this file alone.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Tansu may take to answer a metadata request after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where Tansu keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `sqlite://tansu.db` in the broker's dir: survives a broker crash and restart; what
    /// the tests use. Tansu writes every record header as an SQLite row, and is the limit
    /// of any throughput measured on it (about 50k records/s on 2 cores).
    Sqlite,
    /// `memory://`: nothing survives the process; what throughput is measured on (about
    /// 290k records/s on 2 cores, `/work/shared/notes/tansu-0.6.md`).
    Memory,
}

impl Storage {
    fn url(self) -> &'static str {
        match self {
            Storage::Sqlite => "sqlite://tansu.db",
            Storage::Memory => "memory://tansu/",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Storage::Sqlite => "SQLite storage",
            Storage::Memory => "memory storage",
        }
    }
}

/// The watchdog: runs Tansu in the background and kills it once its own stdin reaches EOF.
/// Only the starting process holds the pipe's write end (std opens pipes close-on-exec, so
/// no other child inherits it), and the kernel closes it however that process ends — normal
/// exit, panic, or SIGKILL — so Tansu can't outlive it. No pid polling, so no pid-reuse
/// races. (`PR_SET_DEATHSIG` would fire when the *thread* that spawned it ends.) Tansu exits
/// within ~50 ms of SIGTERM; SIGKILL follows after 5 s in case it ever doesn't. The shell
/// itself exits when Tansu does, which is how [`TansuProcess::start`] notices an early
/// death. The dir is removed once the starting process has let go (unless
/// `TANSU_KEEP_DIR` is set); if Tansu died by itself, it stays for its log.
///
/// `$1` is the dir, the rest is the Tansu command line.
const WATCHDOG: &str = r#"
dir=$1; shift
cd "$dir" || exit 1
exec 3<&0
"$@" </dev/null 3<&- >>tansu.log 2>&1 &
tansu=$!
echo "$tansu" >tansu.pid
{
    read -r _ <&3
    touch owner-exited
    kill "$tansu"
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$tansu" || exit; sleep 0.5; done
    kill -9 "$tansu"
} >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$tansu" 2>/dev/null  # (dash would report "Terminated")
status=$?
kill "$watcher" 2>/dev/null
if [ -e owner-exited ] && [ -z "$TANSU_KEEP_DIR" ]; then cd / && rm -rf "$dir"; fi
exit "$status"
"#;

/// A running Tansu under its watchdog. Dropping it stops Tansu and removes its dir.
pub struct TansuProcess {
    pub bootstrap: String,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub storage: Storage,
    watchdog: Child,
}

impl TansuProcess {
    /// Starts Tansu on a free loopback port with its data in a new temp dir named
    /// `prefix…`, and waits until it answers. A port picked free can be taken before Tansu
    /// binds it (Tansu panics then): a few ports are tried.
    pub fn start(bin: &Path, storage: Storage, prefix: &str) -> Result<TansuProcess, String> {
        let started = Instant::now();
        for attempt in 1..=3 {
            let dir = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .expect("create a temp dir for tansu")
                .keep();
            let bootstrap = format!("127.0.0.1:{}", free_port());
            let mut watchdog = spawn_watchdog(bin, &dir, &bootstrap, storage);
            match wait_ready(&mut watchdog, &bootstrap, &dir) {
                Ok(()) => {
                    eprintln!(
                        "tansu: listening on {bootstrap} after {:.1?} ({}, dir {})",
                        started.elapsed(),
                        storage.describe(),
                        dir.display()
                    );
                    return Ok(TansuProcess {
                        bootstrap,
                        dir,
                        bin: bin.to_path_buf(),
                        storage,
                        watchdog,
                    });
                }
                Err(log) if attempt < 3 && log.contains("in use") => {
                    // Closing the pipe stops whatever is left of this attempt.
                    drop(watchdog.stdin.take());
                    let _ = watchdog.wait();
                    let _ = std::fs::remove_dir_all(&dir);
                    eprintln!("tansu: {bootstrap} was taken, retrying on another port");
                }
                Err(log) => {
                    return Err(format!(
                        "tansu ({}) did not start on {bootstrap} (attempt {attempt}, dir {}); \
                         the end of its log:\n{log}",
                        bin.display(),
                        dir.display()
                    ))
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Tansu's process id (for CPU accounting and SIGKILLs).
    pub fn pid(&self) -> String {
        std::fs::read_to_string(self.dir.join("tansu.pid"))
            .expect("read tansu.pid")
            .trim()
            .to_string()
    }

    /// Crashes the broker (SIGKILL) and starts it again on the same port with the same dir,
    /// so its SQLite storage (topics, records, committed offsets, groups) carries over, as it
    /// does for a real broker restart. Clients reconnect on their own.
    pub fn restart(&mut self) {
        self.kill_keeping_dir();
        let started = Instant::now();
        // The port was just released; if it is briefly not bindable, try again for a while:
        // the address can't change.
        let mut last = String::new();
        for _ in 0..10 {
            self.watchdog = spawn_watchdog(&self.bin, &self.dir, &self.bootstrap, self.storage);
            match wait_ready(&mut self.watchdog, &self.bootstrap, &self.dir) {
                Ok(()) => {
                    eprintln!(
                        "tansu: restarted on {} after {:.1?}",
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
            "tansu did not come back on {} (dir {}); the end of its log:\n{last}",
            self.bootstrap,
            self.dir.display()
        );
    }

    /// SIGKILLs Tansu (if it still runs) and reaps the watchdog, without closing its stdin
    /// first: that would tell it its owner has exited, and it would remove the dir.
    /// (`Child::wait` closes stdin, hence the `take`.)
    fn kill_keeping_dir(&mut self) {
        let stdin = self.watchdog.stdin.take();
        if self
            .watchdog
            .try_wait()
            .expect("poll the tansu watchdog")
            .is_none()
        {
            let _ = Command::new("kill").args(["-KILL", &self.pid()]).status();
        }
        // The watchdog shell exits once Tansu is gone.
        let _ = self.watchdog.wait();
        drop(stdin);
    }

    /// The last lines of Tansu's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir)
    }
}

impl Drop for TansuProcess {
    fn drop(&mut self) {
        // EOF on the watchdog's stdin stops Tansu; the watchdog exits with it.
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// Tansu on `bootstrap` with its data in `dir`, under a [`WATCHDOG`] shell.
fn spawn_watchdog(bin: &Path, dir: &Path, bootstrap: &str, storage: Storage) -> Child {
    let url = format!("tcp://{bootstrap}");
    Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("tansu-watchdog")
        .arg(dir)
        .arg(bin)
        .args(["broker", "--listener-url", &url])
        .args(["--advertised-listener-url", &url])
        .args(["--storage-engine", storage.url()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the tansu watchdog (sh): {e}"))
}

/// The Tansu binary: `$TANSU_BIN`, else the one `scripts/tansu.sh` installs (once, into a
/// cache outside the clone; its progress reaches the terminal).
pub fn tansu_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TANSU_BIN") {
        return bin.into();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("scripts/tansu.sh")
        .arg("path")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {root}/scripts/tansu.sh path: {e}"));
    assert!(
        out.status.success(),
        "{root}/scripts/tansu.sh path failed ({}); `make broker-install` installs the broker, \
         or set TANSU_BIN to a tansu binary of your own",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `tansu --version`, for reports.
pub fn tansu_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "tansu (version unknown)".into())
}

/// A loopback port free now (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("pick a free loopback port")
}

/// Waits until Tansu accepts connections and answers a metadata request with itself as a
/// broker. On failure returns the tail of its log.
fn wait_ready(watchdog: &mut Child, bootstrap: &str, dir: &Path) -> Result<(), String> {
    let addr: SocketAddr = bootstrap.parse().unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last_error = String::from("no connection yet");
    while Instant::now() < deadline {
        if let Some(status) = watchdog.try_wait().expect("poll the tansu watchdog") {
            return Err(format!("tansu exited ({status})\n{}", log_tail(dir)));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
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
        "not ready within {START_TIMEOUT:?} ({last_error})\n{}",
        log_tail(dir)
    ))
}

fn log_tail(dir: &Path) -> String {
    let mut log = String::new();
    let _ = std::fs::File::open(dir.join("tansu.log")).and_then(|mut f| f.read_to_string(&mut log));
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
