//! A Kerberos realm of one test binary (MIT krb5's KDC, `krb5kdc`, on a free loopback port,
//! its database in a temp dir): principals with their keys in keytabs, and the `krb5.conf`
//! that names it, for the Kafka node's and the bridge's GSSAPI logins.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::broker_process::free_port;
use super::watchdog;

pub const REALM: &str = "WATCHBRIDGE.TEST";

pub struct Kdc {
    pub dir: PathBuf,
    /// For `KRB5_CONFIG` and Java's `java.security.krb5.conf`.
    pub krb5_conf: PathBuf,
    _kdc: Child,
}

/// A command of MIT krb5's admin tools (in /usr/sbin), with this realm's files.
fn krb5(dir: &Path, program: &str) -> Command {
    let mut command = Command::new(Path::new("/usr/sbin").join(program));
    command
        .env("KRB5_CONFIG", dir.join("krb5.conf"))
        .env("KRB5_KDC_PROFILE", dir.join("kdc.conf"))
        .current_dir(dir);
    command
}

fn run(mut command: Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (`make setup` installs krb5-kdc)"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Kdc {
    /// A new realm with its KDC running (it stops when the test binary ends).
    #[allow(clippy::zombie_processes)] // kept for the binary's life; the watchdog stops it
    pub fn start() -> Kdc {
        let dir = tempfile::Builder::new()
            .prefix("watchbridge-kdc-")
            .tempdir()
            .unwrap()
            .keep();
        let port = free_port();
        let krb5_conf = dir.join("krb5.conf");
        std::fs::write(
            &krb5_conf,
            format!(
                "[libdefaults]\n default_realm = {REALM}\n dns_lookup_realm = false\n \
                 dns_lookup_kdc = false\n rdns = false\n udp_preference_limit = 1\n\
                 [realms]\n {REALM} = {{\n  kdc = 127.0.0.1:{port}\n }}\n"
            ),
        )
        .unwrap();
        let d = dir.display();
        std::fs::write(
            dir.join("kdc.conf"),
            format!(
                "[kdcdefaults]\n kdc_ports = {port}\n kdc_tcp_ports = {port}\n[realms]\n \
                 {REALM} = {{\n  database_name = {d}/principal\n  key_stash_file = {d}/stash\n  \
                 acl_file = {d}/kadm5.acl\n }}\n"
            ),
        )
        .unwrap();
        let mut create = krb5(&dir, "kdb5_util");
        create.args(["create", "-s", "-r", REALM, "-P", "watchbridge-master"]);
        run(create, "kdb5_util create");
        let command = [
            "env".to_string(),
            format!("KRB5_CONFIG={}", krb5_conf.display()),
            format!("KRB5_KDC_PROFILE={}", dir.join("kdc.conf").display()),
            "/usr/sbin/krb5kdc".to_string(),
            "-n".to_string(),
        ];
        let kdc = watchdog::spawn("kdc", &dir, &command);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the KDC did not listen: {}",
                watchdog::log_tail(&dir, "kdc")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Kdc {
            dir,
            krb5_conf,
            _kdc: kdc,
        }
    }

    /// `principal@REALM` with a random key, written to a keytab of its own: its path.
    pub fn principal(&self, principal: &str) -> PathBuf {
        let keytab = self
            .dir
            .join(format!("{}.keytab", principal.replace('/', "_")));
        let full = format!("{principal}@{REALM}");
        let mut add = krb5(&self.dir, "kadmin.local");
        add.args(["-q", &format!("addprinc -randkey {full}")]);
        run(add, "kadmin.local addprinc");
        let mut export = krb5(&self.dir, "kadmin.local");
        export.args(["-q", &format!("ktadd -k {} {full}", keytab.display())]);
        run(export, "kadmin.local ktadd");
        keytab
    }
}
