//! Tansu (`scripts/tansu.sh`), the default test broker, as a [`BrokerProcess`].
//!
//! Only std and rdkafka: a bench includes this file (and `broker_process.rs`) alone.

use super::broker_process::{installed_path, BrokerProcess, Launch};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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

impl BrokerProcess {
    /// Tansu (the binary `bin`) on a free loopback port with `storage` in a new temp dir
    /// named `prefix…`, once it answers. (Tansu panics on a port already taken; another
    /// is tried.)
    pub fn tansu(bin: &Path, storage: Storage, prefix: &str) -> Result<BrokerProcess, String> {
        Self::tansu_on(bin, storage, prefix, None)
    }

    /// [`BrokerProcess::tansu`] on the given port (`Some(&[port])`) or a free one.
    pub fn tansu_on(
        bin: &Path,
        storage: Storage,
        prefix: &str,
        on: Option<&[u16]>,
    ) -> Result<BrokerProcess, String> {
        eprintln!("tansu: starting with {}", storage.describe());
        let command = |_dir: &Path, ports: &[u16]| -> Vec<OsString> {
            let url = format!("tcp://127.0.0.1:{}", ports[0]);
            [
                bin.as_os_str(),
                "broker".as_ref(),
                "--listener-url".as_ref(),
                url.as_ref(),
                "--advertised-listener-url".as_ref(),
                url.as_ref(),
                "--storage-engine".as_ref(),
                storage.url().as_ref(),
            ]
            .iter()
            .map(|a| a.to_os_string())
            .collect()
        };
        BrokerProcess::start(&Launch {
            name: "tansu",
            prefix,
            ports: 1,
            start_timeout: Duration::from_secs(30),
            command: &command,
            on,
        })
    }
}

/// The Tansu binary: `$TANSU_BIN`, else the one `scripts/tansu.sh` installs (once, into a
/// cache outside the clone; its progress reaches the terminal).
pub fn tansu_bin() -> PathBuf {
    match std::env::var_os("TANSU_BIN") {
        Some(bin) => bin.into(),
        None => installed_path("tansu.sh", "or set TANSU_BIN to a tansu binary of your own"),
    }
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
