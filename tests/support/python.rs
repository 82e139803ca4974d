//! The tests' Python tools (tests/python/), run with the venv of
//! tests/python/requirements.txt (made once by scripts/python-venv.sh, in the cache outside
//! the clone).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The venv's python, the venv created on first use (once per test binary; concurrent
/// binaries wait for each other in the script).
pub fn venv_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let output = Command::new(root.join("scripts/python-venv.sh"))
                .arg("tests/python/requirements.txt")
                .stderr(Stdio::inherit())
                .output()
                .expect("cannot run scripts/python-venv.sh");
            assert!(
                output.status.success(),
                "scripts/python-venv.sh tests/python/requirements.txt failed ({})",
                output.status
            );
            PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
        })
        .clone()
}

/// Run tests/python/avro_tool.py with `args`, each of `stdin_lines` a line of its input, and
/// whatever it ends with.
pub fn run_avro_tool(args: &[&str], stdin_lines: &[String]) -> Output {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/avro_tool.py");
    let mut child = Command::new(venv_python())
        .arg(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start avro_tool.py");
    let mut input = String::new();
    for line in stdin_lines {
        input.push_str(line);
        input.push('\n');
    }
    // Written from a thread: the tool may answer before it has read everything.
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let output = child.wait_with_output().expect("avro_tool.py");
    let _ = writer.join();
    output
}

/// Run tests/python/avro_tool.py and return its output lines; panics with its stderr if it
/// fails.
pub fn avro_tool(args: &[&str], stdin_lines: &[String]) -> Vec<String> {
    let output = run_avro_tool(args, stdin_lines);
    assert!(
        output.status.success(),
        "avro_tool.py {args:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
