//! A child process (a test broker, Prometheus) that cannot outlive the process that started
//! it, however that one ends. Only std: benches include this file by `#[path]` too.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The watchdog: runs the command in the background and stops it once its own stdin reaches
/// EOF. Only the starting process holds the pipe's write end (std opens pipes
/// close-on-exec, so no other child inherits it), and the kernel closes it however that
/// process ends — normal exit, panic, or SIGKILL — so the command can't outlive it. No pid
/// polling, so no pid-reuse races. (`PR_SET_DEATHSIG` would fire when the *thread* that
/// spawned it ends.) SIGTERM first, SIGKILL after 5 s in case it doesn't stop. The shell
/// itself exits when the command does, which is how a caller notices an early death
/// (`Child::try_wait`). The dir is removed once the starting process has let go (unless
/// `WATCHBRIDGE_KEEP_TEST_DIRS`, or the older `TANSU_KEEP_DIR`, is set); if the command
/// died by itself, it stays for its log.
///
/// `$1` is the label (the command's output goes to `LABEL.log`, its pid to `LABEL.pid`),
/// `$2` the dir it runs in, the rest its command line.
const WATCHDOG: &str = r#"
label=$1; dir=$2; shift 2
cd "$dir" || exit 1
exec 3<&0
"$@" </dev/null 3<&- >>"$label.log" 2>&1 &
child=$!
echo "$child" >"$label.pid"
{
    read -r _ <&3
    touch owner-exited
    kill "$child"
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" || exit; sleep 0.5; done
    kill -9 "$child"
} >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$child" 2>/dev/null  # (dash would report "Terminated")
status=$?
kill "$watcher" 2>/dev/null
if [ -e owner-exited ] && [ -z "$WATCHBRIDGE_KEEP_TEST_DIRS$TANSU_KEEP_DIR" ]; then cd / && rm -rf "$dir"; fi
exit "$status"
"#;

/// Runs `command` in `dir` under a [`WATCHDOG`] shell, its output in `dir/LABEL.log` and its
/// pid in `dir/LABEL.pid`. Closing the returned child's stdin (dropping it, or the starting
/// process ending) stops the command and removes `dir`; `wait` on the child returns once the
/// command has exited.
pub fn spawn<S: AsRef<OsStr>>(label: &str, dir: &Path, command: &[S]) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg(format!("{label}-watchdog"))
        .arg(label)
        .arg(dir)
        .args(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the {label} watchdog (sh): {e}"))
}

/// The last 30 lines of `dir/LABEL.log`.
pub fn log_tail(dir: &Path, label: &str) -> String {
    let mut log = String::new();
    let _ = std::fs::File::open(dir.join(format!("{label}.log")))
        .and_then(|mut f| f.read_to_string(&mut log));
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
