//! The `watchbridge` binary as a user runs it.

use std::process::Command;

fn watchbridge(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_watchbridge"))
        .args(args)
        .env_remove("WATCHBRIDGE_TERMINATION")
        .env_remove("WATCHBRIDGE_POLL_INTERVAL")
        .output()
        .expect("run watchbridge");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_termination_prints_the_normal_form() {
    let (code, out, _) = watchbridge(&["check-termination", "any( total(5m),stable(90s) )"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "any(total(5m), stable(1m 30s))");
}

#[test]
fn check_termination_points_at_the_bad_token() {
    let (code, _, err) = watchbridge(&["check-termination", "any(total(5m), stabel(1m))"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown condition `stabel`"), "{err}");
    assert!(err.contains("                 ^^^^^^"), "{err}");
}

#[test]
fn demo_runs_every_watch_to_an_end_and_dedups() {
    let (code, out, err) = watchbridge(&[
        "demo",
        "--inputs",
        "7",
        "--poll-interval",
        "50ms",
        "--termination",
        "any(total(2s), stable(400ms))",
        "--metrics",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("  start  ").count(), 7, "{out}");
    assert_eq!(out.matches("  end    ").count(), 7, "{out}");
    assert!(out.contains("(final)"), "{out}");
    assert!(out.contains("user-6 (failed)"), "{out}");
    // Every output line is new: no output key is printed twice.
    let mut keys: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("  new "))
        .filter_map(|l| l.split(" -> ").nth(1)?.split(' ').next())
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "an output was emitted twice:\n{out}");
    assert!(
        out.contains("watchbridge_duplicates_suppressed_total"),
        "{out}"
    );
}

#[test]
fn demo_rejects_a_bad_termination_naming_the_variable() {
    let (code, _, err) = watchbridge(&["demo", "--termination", "polls(0)"]);
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_TERMINATION"), "{err}");
}
