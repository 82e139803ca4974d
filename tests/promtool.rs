//! What Prometheus's own tool says about the bridge's metrics and alert rules. `promtool
//! check metrics` lints the `/metrics` page (names, units, suffixes, help). `promtool check
//! rules` loads the alert rules (deploy/prometheus-alerts.yml), and `promtool test rules`
//! evaluates each alert against series written for it (deploy/prometheus-alerts.test.yml),
//! at least once where it must fire and once where it must not. promtool is Debian's (the `prometheus` package, which `make setup`
//! installs), else `$PROMTOOL_BIN`, else `promtool` on the `PATH`. Without it the tests fail
//! saying so: they never pass unchecked.

use serde_yaml::Value as Yaml;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use watchbridge::metrics::Metrics;

const RULES: &str = "deploy/prometheus-alerts.yml";
const RULE_TESTS: &str = "deploy/prometheus-alerts.test.yml";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn promtool() -> PathBuf {
    if let Some(bin) = std::env::var_os("PROMTOOL_BIN") {
        return bin.into();
    }
    let debian = Path::new("/usr/bin/promtool");
    if debian.is_file() {
        return debian.into();
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("promtool"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "NOT CHECKED: no promtool here to check {RULES}; `make setup` installs Debian's \
             prometheus package, which has it (or set PROMTOOL_BIN)"
        )
    })
}

/// `promtool ARGS…` in `dir`: whether it succeeded, and what it said.
fn run_promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    run_promtool_with(dir, args, "")
}

/// `promtool ARGS…` in `dir`, given `stdin`.
fn run_promtool_with(dir: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run promtool: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Every alert rule's name.
fn alert_names() -> Vec<String> {
    let rules = yaml(RULES);
    rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .map(|r| r["alert"].as_str().expect("an alert name").to_string())
        .collect()
}

/// Every family the bridge registers, each with a series (a labelled family is rendered
/// only once it has one), as `/metrics` shows them, passes promtool's lint: base units
/// (no `_ms`), `_total` on counters only, help on every family.
#[test]
fn promtool_lints_the_metrics_page() {
    let m = Metrics::new();
    m.watches_terminated.with_label_values(&["final"]).inc();
    m.polls_error.with_label_values(&["error", "timeout"]).inc();
    m.poll_duration.with_label_values(&["ok"]).observe(0.1);
    m.inputs_dead_lettered
        .with_label_values(&["not_json"])
        .inc();
    m.produce_failures
        .with_label_values(&["MsgSizeTooLarge"])
        .inc();
    m.consumer_errors
        .with_label_values(&["TopicAuthorizationFailed"])
        .inc();
    m.partition_watermark.with_label_values(&["0"]).set(1.7e9);
    m.watermark.set(1.7e9);
    m.watermark_lag.set(1.5);
    m.recovery_read_failures.with_label_values(&["0"]).inc();
    m.control_actions.with_label_values(&["stop"]).inc();
    m.transactions.with_label_values(&["committed"]).inc();
    m.partition_restarts_delayed
        .with_label_values(&["fenced"])
        .inc();
    m.consumer_lag.with_label_values(&["0"]).set(3);
    m.guarantee_info
        .with_label_values(&["recovery", "auto", ""])
        .set(1);
    m.schema_registry_requests
        .with_label_values(&["schema", "ok"])
        .inc();
    m.outputs_dead_lettered
        .with_label_values(&["not_in_schema"])
        .inc();
    let page = m.render();
    let missing: Vec<&str> = m
        .families()
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !page.contains(&format!("# TYPE {name} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "families with no series here (give each one above): {missing:?}"
    );
    let (ok, said) = run_promtool_with(&root(), &["check", "metrics"], &page);
    assert!(ok, "promtool check metrics:\n{said}\n{page}");
    // And it would say so about a name in milliseconds.
    let (ok, said) = run_promtool_with(
        &root(),
        &["check", "metrics"],
        "# HELP watchbridge_watermark_lag_ms x\n# TYPE watchbridge_watermark_lag_ms gauge\n\
         watchbridge_watermark_lag_ms 1\n",
    );
    assert!(!ok && said.contains("abbreviated units"), "{said}");
}

#[test]
fn promtool_loads_the_alert_rules() {
    let (ok, said) = run_promtool(&root(), &["check", "rules", RULES]);
    assert!(ok, "promtool check rules {RULES}:\n{said}");
    // Only alerts, no recording rules.
    let found = said
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("SUCCESS: ")?
                .strip_suffix(" rules found")
        })
        .and_then(|n| n.parse::<usize>().ok());
    assert_eq!(found, Some(alert_names().len()), "{said}");
}

/// Each alert has a test case where it fires and one where it does not.
#[test]
fn every_alert_is_tested_firing_and_not_firing() {
    let tests = yaml(RULE_TESTS);
    assert_eq!(
        tests["rule_files"][0].as_str(),
        Path::new(RULES).file_name().unwrap().to_str(),
        "{RULE_TESTS} tests {RULES}"
    );
    // alert name -> (cases firing, cases not firing)
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for test in tests["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let fires = case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty());
            let entry = cases.entry(name).or_default();
            if fires {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    let mut missing = Vec::new();
    for alert in alert_names() {
        match cases.remove(&alert) {
            Some((f, n)) if f > 0 && n > 0 => {}
            Some((f, n)) => missing.push(format!("{alert}: {f} firing, {n} not firing")),
            None => missing.push(format!("{alert}: not tested")),
        }
    }
    assert!(
        missing.is_empty(),
        "{RULE_TESTS} must test each alert firing and not firing:\n{}",
        missing.join("\n")
    );
    assert!(
        cases.is_empty(),
        "{RULE_TESTS} tests alerts {RULES} does not have: {:?}",
        cases.keys().collect::<Vec<_>>()
    );
}

#[test]
fn promtool_unit_tests_of_the_alert_rules_pass() {
    let (ok, said) = run_promtool(&root().join("deploy"), &["test", "rules", file(RULE_TESTS)]);
    assert!(ok, "promtool test rules {RULE_TESTS}:\n{said}");
}

/// The unit tests would catch a rule that changed: the same tests on a copy of the rules
/// with one alert's `for` lengthened, or one threshold raised, fail.
#[test]
fn promtool_unit_tests_fail_for_a_changed_rule() {
    let rules = read(RULES);
    let tests = read(RULE_TESTS);
    for (alert, change, changed) in [
        (
            "WatchbridgeNotReady",
            "held for 20m, not 10m",
            rules.replacen(
                "expr: watchbridge_ready == 0\n        for: 10m",
                "expr: watchbridge_ready == 0\n        for: 20m",
                1,
            ),
        ),
        (
            "WatchbridgeWatermarkLagHigh",
            "at an hour, not 30 minutes",
            rules.replacen(
                "watchbridge_watermark_lag_seconds) > 30 * 60",
                "watchbridge_watermark_lag_seconds) > 60 * 60",
                1,
            ),
        ),
        (
            "WatchbridgeNoWatermark",
            "without its `unless`",
            rules.replacen(
                "          unless on (instance) watchbridge_watermark_timestamp_seconds\n",
                "",
                1,
            ),
        ),
    ] {
        assert_ne!(changed, rules, "{change}: the edit did not apply");
        let dir = tempfile::tempdir().unwrap();
        let rules_file = Path::new(RULES).file_name().unwrap();
        std::fs::write(dir.path().join(rules_file), &changed).unwrap();
        std::fs::write(dir.path().join("tests.yml"), &tests).unwrap();
        let (ok, said) = run_promtool(dir.path(), &["test", "rules", "tests.yml"]);
        assert!(
            !ok,
            "promtool test rules passed with {alert} {change}: the tests do not check it\n{said}"
        );
        assert!(
            said.contains(&format!("alertname: {alert},")),
            "promtool test rules failed with {alert} {change}, but not on {alert}:\n{said}"
        );
    }
}

fn file(rel: &str) -> &str {
    Path::new(rel).file_name().unwrap().to_str().unwrap()
}
