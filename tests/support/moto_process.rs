//! moto in server mode (`python -m moto.server`), a real S3-API server on a free loopback
//! port, from the venv of tests/moto/requirements.txt (made once by scripts/python-venv.sh,
//! in the cache outside the clone). Killed when dropped.
//!
//! Only std: a bench includes this file alone.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The venv's python, the venv created on first use (once per process; concurrent
/// processes wait for each other in the script).
pub fn moto_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let output = Command::new(root.join("scripts/python-venv.sh"))
                .arg("tests/moto/requirements.txt")
                .stderr(Stdio::inherit())
                .output()
                .expect("cannot run scripts/python-venv.sh");
            assert!(
                output.status.success(),
                "scripts/python-venv.sh tests/moto/requirements.txt failed ({})",
                output.status
            );
            PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
        })
        .clone()
}

/// A running moto server.
pub struct MotoProcess {
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
    /// Holds moto's log; `None` only while starting.
    _dir: Option<tempfile::TempDir>,
}

/// How moto checks the requests' credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Any credentials, signed or not (moto's default).
    Any,
    /// Only access keys moto's IAM knows, with a matching signature
    /// (`INITIAL_NO_AUTH_ACTION_COUNT=0`): any other key is refused with 403
    /// `InvalidAccessKeyId`.
    Iam,
}

impl MotoProcess {
    /// moto on a free loopback port, once it answers.
    pub fn start(auth: Auth) -> MotoProcess {
        let python = moto_python();
        let dir = tempfile::Builder::new().prefix("moto-").tempdir().unwrap();
        let log = dir.path().join("moto.log");
        for _attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap()
                .port();
            let mut command = Command::new(&python);
            command
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(std::fs::File::create(&log).unwrap());
            if auth == Auth::Iam {
                command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
            }
            let child = command.spawn().expect("cannot start moto");
            let mut moto = MotoProcess {
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                child,
                log: log.clone(),
                _dir: None,
            };
            if moto.wait_ready(Duration::from_secs(60)) {
                moto._dir = Some(dir);
                return moto;
            }
            eprintln!(
                "moto: not ready on port {port}; trying another:\n{}",
                moto.log()
            );
        }
        panic!("moto did not start");
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if http_status(self.addr, "GET", "/moto-api/") == Some(200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Create a bucket (moto's default auth mode only: the request is unsigned).
    pub fn create_bucket(&self, bucket: &str) {
        let status = http_status(self.addr, "PUT", &format!("/{bucket}"));
        assert_eq!(status, Some(200), "create bucket {bucket}: {}", self.log());
    }
}

impl Drop for MotoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of one plain HTTP/1.1 request, or `None` if there was no answer.
fn http_status(addr: SocketAddr, method: &str, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
