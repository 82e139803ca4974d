//! The operations files checked against the code, so they stay true: the Grafana dashboard
//! and the alert rules against the metrics the bridge registers (`src/metrics.rs`), the
//! deployment files and docs/configuration.md against `watchbridge run --help`, the compose
//! file's poller settings against its sample feeds, and the Kubernetes manifests against each
//! other.

mod support;

use prometheus::proto::MetricType;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::http_server::{Reply, TestServer};
use watchbridge::metrics::Metrics;

/// Variables read from the environment by something other than clap, so `--help` does not
/// list them: `WATCHBRIDGE_LOG` is `tracing_subscriber::EnvFilter`'s (src/main.rs). They
/// must be documented in docs/configuration.md all the same. (If one becomes a flag, its
/// documented default is checked against --help like any other.)
const ENV_ONLY: &[&str] = &["WATCHBRIDGE_LOG"];

/// Names that are not settings, shown on purpose: docs/configuration.md's example of the
/// error a misspelt variable gets.
const MISSPELT_ON_PURPOSE: &[&str] = &["WATCHBRIDGE_POLL_INTERVALL"];

/// Families the dashboard need not chart, each with its reason. Empty: every family the bridge
/// exports is on a panel.
const NOT_ON_DASHBOARD: &[&str] = &[];

const DASHBOARD: &str = "grafana/dashboards/watchbridge.json";
const COMPOSE: &str = "deploy/docker-compose.yml";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

/// Every file under `dir` (relative to the repository root), recursively, as relative paths.
fn files_under(dir: &str) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let rel = path.strip_prefix(base).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &root().join(dir), &mut out);
    out
}

// ---- metric names -----------------------------------------------------------------------

fn families() -> BTreeMap<String, MetricType> {
    Metrics::new().families().iter().cloned().collect()
}

/// The prefixes of the families the bridge exports: its own, and the standard process
/// metrics (`src/metrics/process.rs`).
const METRIC_PREFIXES: &[&str] = &["watchbridge_", "process_"];

/// Every `watchbridge_[a-z0-9_]+` or `process_[a-z0-9_]+` in `text` (a whole word; a bare
/// prefix is skipped).
fn metric_names_in(text: &str) -> Vec<String> {
    let mut names: Vec<(usize, String)> = METRIC_PREFIXES
        .iter()
        .flat_map(|prefix| names_with_prefix(text, prefix))
        .collect();
    names.sort();
    names.into_iter().map(|(_, name)| name).collect()
}

/// The names `prefix[a-z0-9_]+` in `text`, each with where it starts.
fn names_with_prefix(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find(prefix) {
        let start = from + i;
        let word_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let mut end = start + prefix.len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let bounded = (start == 0 || !word_char(bytes[start - 1]))
            && (end == bytes.len() || !word_char(bytes[end]));
        let name = text[start..end].trim_end_matches('_');
        if bounded && name.len() >= prefix.len() {
            names.push((start, name.to_string()));
        }
        from = end;
    }
    names
}

/// The family a scraped series name belongs to: itself, a histogram's `_bucket`/`_sum`/
/// `_count`. `None`: the bridge exports no such thing.
fn family_of(name: &str, families: &BTreeMap<String, MetricType>) -> Option<String> {
    if families.contains_key(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        (families.get(base) == Some(&MetricType::HISTOGRAM)).then(|| base.to_string())
    })
}

/// Check every metric name in `exprs` (each with where it came from); return the families
/// used.
fn check_metric_names<'a>(
    exprs: impl IntoIterator<Item = (String, &'a str)>,
    families: &BTreeMap<String, MetricType>,
) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (place, expr) in exprs {
        for name in metric_names_in(expr) {
            match family_of(&name, families) {
                Some(family) => {
                    used.insert(family);
                }
                None => unknown.push(format!("{place}: `{name}` in `{expr}`")),
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the bridge does not export (src/metrics.rs):\n{}",
        unknown.join("\n")
    );
    used
}

/// Parse every expression as PromQL (what Prometheus would refuse to load, or Grafana show
/// as a broken panel), after putting in values for Grafana's variables.
fn check_promql<'a>(exprs: impl IntoIterator<Item = (String, &'a str)>) {
    let mut bad = Vec::new();
    for (place, expr) in exprs {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "15s")
            .replace("$instance", ".*");
        if let Err(e) = promql_parser::parser::parse(&expr) {
            bad.push(format!("{place}: `{expr}`: {e}"));
        }
    }
    assert!(bad.is_empty(), "not PromQL:\n{}", bad.join("\n"));
}

/// The PromQL of a markdown file's ```promql blocks: a line that starts at the margin starts
/// an expression, an indented one continues it; `#` starts a comment.
fn promql_blocks(markdown: &str) -> Vec<String> {
    let mut exprs: Vec<String> = Vec::new();
    let mut inside = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            inside = line.trim() == "```promql";
            continue;
        }
        let code = line.split('#').next().unwrap().trim_end();
        if !inside || code.trim().is_empty() {
            continue;
        }
        match exprs.last_mut() {
            Some(last) if code.starts_with(' ') => {
                last.push('\n');
                last.push_str(code);
            }
            _ => exprs.push(code.to_string()),
        }
    }
    exprs
}

// ---- the dashboard ------------------------------------------------------------------------

fn dashboard() -> Json {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(inner) = p.get("panels") {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every PromQL expression: panel targets and template variable queries, with where each
/// is.
fn dashboard_exprs(dashboard: &Json) -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                let place = format!("panel {} target {}", p["title"], t["refId"]);
                exprs.push((place, expr.to_string()));
            }
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] == "query" {
            let query = v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .unwrap_or_default();
            exprs.push((format!("variable {}", v["name"]), query.to_string()));
        }
    }
    exprs
}

/// Each partition's watermark series keeps the instance that owns it, and says how to ask
/// that instance for the watches holding the partition back (the control API, on loopback
/// behind a token: no link a browser could follow).
#[test]
fn the_watermark_per_partition_says_where_to_ask_for_the_watches_holding_it_back() {
    let d = dashboard();
    let panel = panels(&d)
        .into_iter()
        .find(|p| p["title"] == "Watermark per partition")
        .expect("a watermark per partition panel");
    let expr = panel["targets"][0]["expr"].as_str().unwrap();
    assert!(expr.contains("by (partition, instance)"), "{expr}");
    let description = panel["description"].as_str().unwrap();
    assert!(
        description.contains("GET /watches?partition=P&holds_watermark=true")
            && description.contains("WATCHBRIDGE_CONTROL_ADDR"),
        "{description}"
    );
    assert!(panel["fieldConfig"]["defaults"]["links"].is_null());
}

#[test]
fn dashboard_queries_only_exported_metrics_and_charts_every_one() {
    let families = families();
    let d = dashboard();
    let exprs = dashboard_exprs(&d);
    assert!(
        exprs.len() > 20,
        "{DASHBOARD}: {} queries found",
        exprs.len()
    );
    let used = check_metric_names(
        exprs.iter().map(|(p, e)| (p.clone(), e.as_str())),
        &families,
    );
    check_promql(
        exprs
            .iter()
            .filter(|(place, _)| place.starts_with("panel "))
            .map(|(p, e)| (p.clone(), e.as_str())),
    );
    let missing: Vec<_> = families
        .keys()
        .filter(|f| !used.contains(*f) && !NOT_ON_DASHBOARD.contains(&f.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "exported but on no panel of {DASHBOARD} (chart them, or list them in NOT_ON_DASHBOARD \
         with a reason): {missing:?}"
    );
}

#[test]
fn dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable() {
    let d = dashboard();
    assert_eq!(d["uid"], "watchbridge");
    assert!(d["title"].is_string());
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["name"] == "DS_PROMETHEUS"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a datasource variable DS_PROMETHEUS of type prometheus"
    );
    let mut ids = BTreeSet::new();
    let mut rows = Vec::new();
    for p in panels(&d) {
        let title = p["title"].as_str().expect("every panel has a title");
        let id = p["id"].as_u64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} ({title}) twice");
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && grid["h"].as_u64().unwrap() > 0,
            "{title}: gridPos {grid}"
        );
        if p["type"] == "row" {
            rows.push(title.to_string());
            continue;
        }
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.unwrap_or_else(|| panic!("panel {title} has no targets"));
        for with_ds in std::iter::once(p).chain(targets) {
            assert_eq!(
                with_ds["datasource"]["uid"], "${DS_PROMETHEUS}",
                "panel {title}: datasource by the DS_PROMETHEUS variable"
            );
        }
    }
    for row in [
        "Throughput",
        "Watches",
        "Polls",
        "Dedup",
        "Watermarks",
        "Errors & DLQ",
        "Durable state",
        "Kafka",
    ] {
        assert!(rows.iter().any(|r| r == row), "no row {row:?} in {rows:?}");
    }
}

#[test]
fn docs_and_alert_rules_name_only_exported_metrics_and_operations_md_lists_every_one() {
    let families = families();
    // The alert rules: every `expr`.
    let rules = yaml("deploy/prometheus-alerts.yml");
    let mut exprs = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            let expr = rule["expr"].as_str().expect("expr");
            exprs.push((format!("alert {name}"), expr.to_string()));
        }
    }
    assert!(exprs.len() >= 6, "{} alert rules", exprs.len());
    check_metric_names(
        exprs.iter().map(|(p, e)| (p.clone(), e.as_str())),
        &families,
    );
    check_promql(exprs.iter().map(|(p, e)| (p.clone(), e.as_str())));
    // The PromQL examples of docs/operations.md.
    let examples = promql_blocks(&read("docs/operations.md"));
    assert!(examples.len() >= 8, "{examples:?}");
    check_metric_names(
        examples
            .iter()
            .map(|e| ("docs/operations.md".to_string(), e.as_str())),
        &families,
    );
    check_promql(
        examples
            .iter()
            .map(|e| ("docs/operations.md".to_string(), e.as_str())),
    );
    // Every name anywhere in the prose docs.
    for doc in [
        "docs/operations.md",
        "docs/configuration.md",
        "grafana/README.md",
        "deploy/README.md",
    ] {
        let text = read(doc);
        check_metric_names([(doc.to_string(), text.as_str())], &families);
    }
    // operations.md's metric table has a row per family.
    let ops = read("docs/operations.md");
    let documented: BTreeSet<String> = ops
        .lines()
        .filter(|l| {
            METRIC_PREFIXES
                .iter()
                .any(|p| l.starts_with(&format!("| `{p}")))
        })
        .flat_map(metric_names_in)
        .filter_map(|n| family_of(&n, &families))
        .collect();
    let missing: Vec<&str> = families
        .keys()
        .map(String::as_str)
        .filter(|f| !documented.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/operations.md's metric table: {missing:?}"
    );
}

// ---- alerts and their runbooks -------------------------------------------------------------

/// Where the alerts' `runbook_url`s point: docs/operations.md as the repository shows it.
const RUNBOOK_BASE: &str =
    "https://github.com/watchbridge/watchbridge/blob/main/docs/operations.md";

/// The anchor GitHub gives a markdown heading: lower case, punctuation other than `-` and
/// `_` dropped, spaces to `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading of a markdown file (outside code blocks): its level, its text, and the
/// text of its section (up to the next heading of the same level or above).
fn sections(markdown: &str) -> Vec<(usize, String, String)> {
    let mut headings = Vec::new();
    let mut fenced = false;
    let lines: Vec<&str> = markdown.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if level > 0 && line[level..].starts_with(' ') {
            headings.push((i, level, line[level..].trim().to_string()));
        }
    }
    headings
        .iter()
        .enumerate()
        .map(|(n, (i, level, text))| {
            let end = headings[n + 1..]
                .iter()
                .find(|(_, l, _)| l <= level)
                .map_or(lines.len(), |(j, _, _)| *j);
            (*level, text.clone(), lines[i + 1..end].join("\n"))
        })
        .collect()
}

/// Every alert has a `runbook_url` into docs/operations.md whose anchor is a section there
/// named after the alert, under "Alerts worth setting"; the section shows the rule's
/// expression (and its `for`), and says what the alert means and what to check.
#[test]
fn every_alert_has_a_runbook_section_in_operations_md() {
    let ops = read("docs/operations.md");
    let sections = sections(&ops);
    let anchors: BTreeSet<String> = sections.iter().map(|(_, h, _)| github_anchor(h)).collect();
    let alerts_section = sections
        .iter()
        .find(|(level, h, _)| *level == 2 && h == "Alerts worth setting")
        .map(|(_, _, text)| text.as_str())
        .expect("docs/operations.md has a section \"Alerts worth setting\"");
    let no_space = |s: &str| s.split_whitespace().collect::<String>();
    let rules = yaml("deploy/prometheus-alerts.yml");
    let mut wrong = Vec::new();
    let mut count = 0;
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            count += 1;
            let name = rule["alert"].as_str().expect("alert name");
            let expr = rule["expr"].as_str().expect("expr");
            let anchor = github_anchor(name);
            let want = format!("{RUNBOOK_BASE}#{anchor}");
            match rule["annotations"]["runbook_url"].as_str() {
                Some(url) if url == want => {}
                other => wrong.push(format!("{name}: runbook_url {other:?}, want {want}")),
            }
            if !anchors.contains(&anchor) {
                wrong.push(format!("{name}: no heading with anchor #{anchor}"));
                continue;
            }
            let Some((_, _, text)) = sections
                .iter()
                .find(|(level, h, _)| *level == 3 && h == name)
            else {
                wrong.push(format!("{name}: its anchor is not a `### {name}` section"));
                continue;
            };
            if !alerts_section.contains(&format!("### {name}\n")) {
                wrong.push(format!("{name}: not under \"Alerts worth setting\""));
            }
            let shown: Vec<String> = promql_blocks(text).iter().map(|e| no_space(e)).collect();
            if !shown.contains(&no_space(expr)) {
                wrong.push(format!(
                    "{name}: its section's promql block is not the rule's expression `{expr}` \
                     (shown: {shown:?})"
                ));
            }
            if let Some(hold) = rule["for"].as_str() {
                if !text.contains(&format!("# for: {hold}")) {
                    wrong.push(format!("{name}: its section does not say `# for: {hold}`"));
                }
            }
            for part in ["**Means:**", "**Check"] {
                if !text.contains(part) {
                    wrong.push(format!("{name}: its section has no {part}"));
                }
            }
        }
    }
    assert!(count >= 19, "{count} alert rules");
    assert!(wrong.is_empty(), "alert runbooks:\n{}", wrong.join("\n"));
}

/// The links within docs/operations.md point at headings it has.
#[test]
fn operations_md_links_to_its_own_headings() {
    let ops = read("docs/operations.md");
    let anchors: BTreeSet<String> = sections(&ops)
        .iter()
        .map(|(_, h, _)| github_anchor(h))
        .collect();
    let mut broken = Vec::new();
    for (i, _) in ops.match_indices("](#") {
        let rest = &ops[i + 3..];
        let anchor = &rest[..rest.find(')').expect("a link ends")];
        if !anchors.contains(anchor) {
            broken.push(anchor.to_string());
        }
    }
    assert!(broken.is_empty(), "links to no heading: {broken:?}");
}

// ---- variables ----------------------------------------------------------------------------

/// `watchbridge run --help`: each `WATCHBRIDGE_*` variable with its `[default: …]`, if any.
fn help_variables() -> BTreeMap<String, Option<String>> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") {
            command.env_remove(name);
        }
    }
    let out = command
        .args(["run", "--help"])
        .output()
        .expect("run watchbridge");
    assert!(out.status.success(), "watchbridge run --help failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut vars = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('-') {
            current = None; // the next option
        } else if let Some(rest) = line.strip_prefix("[env: ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            assert!(name.starts_with("WATCHBRIDGE_"), "--help: {line}");
            assert!(
                vars.insert(name.clone(), None).is_none(),
                "{name} twice in --help"
            );
            current = Some(name);
        } else if let Some(rest) = line.strip_prefix("[default: ") {
            let name = current
                .as_ref()
                .unwrap_or_else(|| panic!("--help: {line} without [env]"));
            let value = rest
                .strip_suffix(']')
                .unwrap_or_else(|| panic!("--help: {line}"));
            vars.insert(name.clone(), Some(value.to_string()));
        }
    }
    assert!(
        vars.len() > 30,
        "parsed {} variables from --help:\n{text}",
        vars.len()
    );
    vars
}

/// Every `WATCHBRIDGE_[A-Z0-9_]+` in `text`; one followed by `*` (or ending in `_`) is a
/// prefix, returned with a trailing `*`.
fn variables_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("WATCHBRIDGE_") {
        let start = from + i;
        let mut end = start + "WATCHBRIDGE_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = &text[start..end];
        if name.ends_with('_') || bytes.get(end) == Some(&b'*') {
            names.push(format!("{}*", name));
        } else {
            names.push(name.to_string());
        }
        from = end;
    }
    names
}

/// The variables `text` names that neither --help nor [`ENV_ONLY`] knows.
fn unknown_variables(text: &str, help: &BTreeMap<String, Option<String>>) -> Vec<String> {
    // `NAME_FILE` of a secret read from a file (`config::SECRETS_FROM_FILES`) is real too.
    let from_file = |name: &str| {
        name.strip_suffix("_FILE")
            .is_some_and(|base| watchbridge::config::SECRETS_FROM_FILES.contains(&base))
    };
    // Names the bridge reserves (`WATCHBRIDGE_TEST_*`, the scripts' `WATCHBRIDGE_CACHE`, …).
    let reserved = |name: &str| {
        name.starts_with(watchbridge::config::known::TEST_PREFIX)
            || watchbridge::config::known::RESERVED.contains(&name)
    };
    let known = |name: &str| {
        help.contains_key(name)
            || ENV_ONLY.contains(&name)
            || from_file(name)
            || reserved(name)
            || MISSPELT_ON_PURPOSE.contains(&name)
    };
    variables_in(text)
        .into_iter()
        .filter(|name| match name.strip_suffix('*') {
            Some(prefix) => !help.keys().any(|k| k.starts_with(prefix)) && !reserved(prefix),
            None => !known(name),
        })
        .collect()
}

#[test]
fn every_yaml_in_deploy_and_grafana_provisioning_parses() {
    let mut files: Vec<String> = files_under("deploy");
    files.extend(files_under("grafana/provisioning"));
    files.retain(|f| f.ends_with(".yml") || f.ends_with(".yaml"));
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        // One document per file (serde_yaml refuses several).
        let value = yaml(file);
        assert!(value.is_mapping(), "{file}: a mapping at the top");
        if file.starts_with("deploy/k8s/") {
            assert!(
                value["apiVersion"].is_string() && value["kind"].is_string(),
                "{file}"
            );
        }
    }
    let kinds: BTreeSet<String> = files
        .iter()
        .filter(|f| f.starts_with("deploy/k8s/"))
        .map(|f| yaml(f)["kind"].as_str().unwrap().to_string())
        .collect();
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodMonitor",
        "Kustomization",
    ] {
        assert!(kinds.contains(kind), "no {kind} in deploy/k8s: {kinds:?}");
    }
    // The kustomization lists files that exist.
    for r in yaml("deploy/k8s/kustomization.yaml")["resources"]
        .as_sequence()
        .unwrap()
    {
        let r = r.as_str().unwrap();
        assert!(
            root().join("deploy/k8s").join(r).is_file(),
            "kustomization: {r}"
        );
    }
    // The provisioned datasource is the compose Prometheus; the dashboards provider reads
    // the directory compose mounts the dashboards at.
    let ds = yaml("grafana/provisioning/datasources/prometheus.yaml");
    assert_eq!(ds["datasources"][0]["type"], "prometheus");
    assert_eq!(ds["datasources"][0]["url"], "http://prometheus:9090");
    let provider = yaml("grafana/provisioning/dashboards/watchbridge.yaml");
    assert_eq!(provider["providers"][0]["type"], "file");
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let grafana = &yaml(COMPOSE)["services"]["grafana"];
    let mounts: Vec<&str> = grafana["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        mounts.contains(&format!("../grafana/dashboards:{path}:ro").as_str()),
        "compose mounts the dashboards at {path}: {mounts:?}"
    );
    assert!(mounts.contains(&"../grafana/provisioning:/etc/grafana/provisioning:ro"));
}

#[test]
fn deploy_and_grafana_files_name_only_variables_the_bridge_has() {
    let help = help_variables();
    let mut files = files_under("deploy");
    files.extend(files_under("grafana"));
    let mut unknown = Vec::new();
    let mut named = 0;
    for file in &files {
        let text = read(file);
        named += variables_in(&text).len();
        unknown.extend(
            unknown_variables(&text, &help)
                .into_iter()
                .map(|v| format!("{file}: {v}")),
        );
    }
    assert!(
        named > 30,
        "{named} variables named in deploy/ and grafana/"
    );
    assert!(
        unknown.is_empty(),
        "not in `watchbridge run --help` (nor ENV_ONLY):\n{}",
        unknown.join("\n")
    );
}

/// docs/configuration.md's tables: variable → default cell, in order.
fn documented_variables() -> Vec<(String, String)> {
    let text = read("docs/configuration.md");
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `WATCHBRIDGE_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "", variable, default, meaning…, ""
        assert!(cells.len() >= 5, "docs/configuration.md: {line}");
        let name = cells[1]
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .filter(|n| !n.contains('`'))
            .unwrap_or_else(|| panic!("docs/configuration.md: one variable per row: {line}"));
        rows.push((name.to_string(), cells[2].to_string()));
    }
    rows
}

/// A default cell that is one code span is a literal default; anything else describes one.
fn literal_default(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

#[test]
fn configuration_md_documents_every_run_variable_with_its_default() {
    let help = help_variables();
    let rows = documented_variables();
    let mut documented = BTreeMap::new();
    for (name, default) in &rows {
        assert!(
            documented.insert(name.clone(), default.clone()).is_none(),
            "{name} documented twice in docs/configuration.md"
        );
    }
    let expected: BTreeSet<&str> = help
        .keys()
        .map(String::as_str)
        .chain(ENV_ONLY.iter().copied())
        .collect();
    let got: BTreeSet<&str> = documented.keys().map(String::as_str).collect();
    assert_eq!(
        got.difference(&expected).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "documented in docs/configuration.md but not in --help (nor ENV_ONLY)"
    );
    assert_eq!(
        expected.difference(&got).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "in --help (or ENV_ONLY) but not documented in docs/configuration.md"
    );
    let mut wrong = Vec::new();
    for (name, cell) in &documented {
        let Some(from_help) = help.get(name) else {
            // Not yet a flag: the documented value is all there is to check.
            assert!(!cell.is_empty(), "{name}: empty default cell");
            continue;
        };
        match (literal_default(cell), from_help) {
            (Some(doc), Some(help)) if doc == help => {}
            (None, None) => {}
            (doc, help) => wrong.push(format!(
                "{name}: docs/configuration.md says {cell}{}, --help says {}",
                if doc.is_some() {
                    ""
                } else {
                    " (a description: no literal default)"
                },
                help.as_ref()
                    .map_or("no default".into(), |h| format!("[default: {h}]")),
            )),
        }
    }
    assert!(wrong.is_empty(), "defaults disagree:\n{}", wrong.join("\n"));
    // Prose elsewhere in the docs names only real variables too.
    for doc in ["docs/configuration.md", "docs/operations.md"] {
        let unknown = unknown_variables(&read(doc), &help);
        assert!(
            unknown.is_empty(),
            "{doc} names unknown variables: {unknown:?}"
        );
    }
}

/// The default of each setting of `run` in the code: clap's default value, by variable.
fn code_defaults() -> BTreeMap<String, String> {
    use clap::Args;
    let run = watchbridge::config::RunArgs::augment_args(clap::Command::new("run"));
    run.get_arguments()
        .filter_map(|arg| {
            let name = arg.get_env()?.to_str()?.to_string();
            let values: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            (!values.is_empty()).then(|| (name, values.join(",")))
        })
        .collect()
}

/// A duration as the docs write it (`24h`, `24 h`, `7 days`, `1h 30m`), if it is one.
fn doc_duration(text: &str) -> Option<Duration> {
    let mut compact = String::new();
    let mut chars = text.trim().chars().peekable();
    while let Some(c) = chars.next() {
        compact.push(c);
        // `24 h` → `24h`: humantime wants the unit against the number.
        if c.is_ascii_digit() && chars.peek() == Some(&' ') {
            chars.next();
        }
    }
    humantime::parse_duration(&compact).ok()
}

/// Every default the docs state agrees with the code's (clap's default value of the
/// setting): the default column of docs/configuration.md's and the README's tables, and a
/// default said in prose right after the variable: `` `WATCHBRIDGE_X` (24 h) ``,
/// `(7 days by default)`, `(default 30 s)`, ``(default `0.0.0.0:9898`)``. Durations are
/// compared as durations (`60s` is `1m`).
#[test]
fn every_default_the_docs_state_agrees_with_the_code() {
    let code = code_defaults();
    assert!(code.len() > 50, "{code:?}");
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(doc_duration("7 days"), Some(7 * day));
    assert_eq!(doc_duration("24 h"), Some(day));
    assert_eq!(doc_duration("1h 30m"), Some(Duration::from_secs(5400)));
    assert_eq!(doc_duration("below"), None);
    let agree = |doc: &str, code: &str| {
        doc == code
            || (doc == "\"\"" && code.is_empty())
            || matches!((doc_duration(doc), doc_duration(code)), (Some(a), Some(b)) if a == b)
    };
    let mut docs = vec!["README.md".to_string()];
    docs.extend(
        files_under("docs")
            .into_iter()
            .filter(|f| f.ends_with(".md")),
    );
    let mut wrong = Vec::new();
    let mut compared = 0;
    for doc in &docs {
        let text = read(doc);
        for line in text.lines().filter(|l| l.starts_with("| `WATCHBRIDGE_")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let (Some(name), Some(cell)) = (
                cells
                    .get(1)
                    .and_then(|c| c.strip_prefix('`')?.strip_suffix('`')),
                cells.get(2),
            ) else {
                continue;
            };
            let (Some(code), Some(documented)) = (code.get(name), literal_default(cell)) else {
                continue;
            };
            compared += 1;
            if !agree(documented, code) {
                wrong.push(format!(
                    "{doc}: {name} `{documented}` in a table, the code {code}"
                ));
            }
        }
        for (at, _) in text.match_indices("` (") {
            let Some(start) = text[..at].rfind("`WATCHBRIDGE_") else {
                continue;
            };
            let name = &text[start + 1..at];
            let Some(code) = code.get(name) else {
                continue;
            };
            let inner = &text[at + 3..];
            let Some(inner) = inner.split(')').next() else {
                continue;
            };
            let said = inner
                .trim_start_matches("default")
                .trim_start_matches(':')
                .trim_end_matches("by default")
                .trim();
            // A code span said to be the default, or a duration: anything else is prose.
            let span = said
                .strip_prefix('`')
                .and_then(|s| s.strip_suffix('`'))
                .filter(|s| !s.contains('`') && inner.contains("default"));
            let documented = match (span, doc_duration(said)) {
                (Some(span), _) => span,
                (None, Some(_)) if doc_duration(code).is_some() => said,
                _ => continue,
            };
            compared += 1;
            if !agree(documented, code) {
                wrong.push(format!("{doc}: `{name}` ({inner}), the code {code}"));
            }
        }
    }
    assert!(compared > 60, "compared {compared}");
    assert!(
        wrong.is_empty(),
        "defaults disagree with the code:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_listed_exception_is_still_needed() {
    let help = help_variables();
    for name in ENV_ONLY {
        assert!(
            !help.contains_key(*name),
            "{name} is in `watchbridge run --help` now: remove it from ENV_ONLY"
        );
    }
    let families = families();
    for name in NOT_ON_DASHBOARD {
        assert!(
            families.contains_key(*name),
            "NOT_ON_DASHBOARD names {name}, not a family"
        );
    }
}

// ---- the deployment files against each other and the bridge -------------------------------

fn duration(text: &str) -> Duration {
    humantime::parse_duration(text).unwrap_or_else(|e| panic!("`{text}`: {e}"))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn kubernetes_and_compose_agree_with_the_bridge_settings() {
    let config = yaml("deploy/k8s/configmap.yaml");
    let data = &config["data"];
    let deployment = yaml("deploy/k8s/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], *labels);

    // A stop, which ends within the shutdown timeout plus its margin, fits in the grace
    // period.
    let shutdown = duration(data["WATCHBRIDGE_SHUTDOWN_TIMEOUT"].as_str().unwrap());
    let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap());
    assert!(
        grace > shutdown + watchbridge::bridge::STOP_MARGIN,
        "terminationGracePeriodSeconds {grace:?} <= {shutdown:?} + the stop's margin"
    );

    // The config map and the (optional) secret are what the container reads.
    let env_from = container["envFrom"].as_sequence().unwrap();
    let config_name = config["metadata"]["name"].as_str().unwrap();
    let secret = yaml("deploy/k8s/secret.yaml");
    assert!(env_from
        .iter()
        .any(|e| e["configMapRef"]["name"] == config_name));
    assert!(env_from
        .iter()
        .any(|e| e["secretRef"]["name"] == secret["metadata"]["name"]
            && e["secretRef"]["optional"] == true));
    let secret_data = secret["stringData"].as_mapping().unwrap();
    assert!(secret_data
        .keys()
        .any(|k| k.as_str().unwrap().starts_with("KAFKA_SASL_")));
    assert!(read("deploy/k8s/secret.yaml").contains("EXAMPLE ONLY"));

    // Probes and ports: the metrics address's port, by name.
    let port = port_of(data["WATCHBRIDGE_METRICS_ADDR"].as_str().unwrap());
    let ports = container["ports"].as_sequence().unwrap();
    let metrics = ports
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(metrics["containerPort"].as_u64(), Some(port));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert!(container["resources"]["requests"].is_mapping());
    assert!(container["resources"]["limits"].is_mapping());
    let service = yaml("deploy/k8s/service.yaml");
    assert_eq!(service["spec"]["selector"], *labels);
    assert_eq!(service["spec"]["ports"][0]["port"].as_u64(), Some(port));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    let monitor = yaml("deploy/k8s/podmonitor.yaml");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"][0]["path"],
        "/metrics"
    );

    // The image exposes that port and runs the binary as a non-root user.
    let dockerfile = read("deploy/Dockerfile");
    assert!(
        dockerfile.contains(&format!("\nEXPOSE {port}\n")),
        "Dockerfile EXPOSE {port}"
    );
    assert!(dockerfile.contains("cargo build --release --locked"));
    assert!(dockerfile.contains("\nUSER 10001"), "a non-root user");
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(10001));
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/watchbridge\"]"));

    // Compose: the bridge on the compose broker, scraped where Prometheus looks, given time
    // to stop.
    let compose = yaml(COMPOSE);
    let services = &compose["services"];
    for service in ["kafka", "feeds", "watchbridge", "prometheus", "grafana"] {
        assert!(services[service].is_mapping(), "compose service {service}");
    }
    assert!(services["kafka"]["image"]
        .as_str()
        .unwrap()
        .starts_with("apache/kafka:"));
    assert_eq!(
        services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"],
        "broker,controller"
    );
    let bridge = &services["watchbridge"];
    assert_eq!(bridge["build"]["context"], "..");
    assert_eq!(bridge["build"]["dockerfile"], "deploy/Dockerfile");
    let env = &bridge["environment"];
    assert_eq!(env["WATCHBRIDGE_BROKERS"], "kafka:9092");
    let compose_port = port_of(env["WATCHBRIDGE_METRICS_ADDR"].as_str().unwrap());
    let prometheus = yaml("deploy/prometheus.yml");
    assert_eq!(
        prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0],
        format!("watchbridge:{compose_port}").as_str()
    );
    let stop = duration(bridge["stop_grace_period"].as_str().unwrap());
    let shutdown = duration(env["WATCHBRIDGE_SHUTDOWN_TIMEOUT"].as_str().unwrap());
    assert!(
        stop > shutdown + watchbridge::bridge::STOP_MARGIN,
        "stop_grace_period {stop:?} <= {shutdown:?} + the stop's margin"
    );
}

/// What a poll holds per item besides the response bytes: about 100 bytes of bookkeeping
/// and 16 bytes of the page being parsed (docs/pollers/http.md, "Memory").
const BYTES_PER_ITEM: u64 = 116;

/// The rest of the process beside polling, in the memory formula of docs/operations.md
/// ("Memory of polling").
const REST_OF_THE_PROCESS: u64 = 512 << 20;

/// A size as the bridge's settings take it: bytes, or with KiB, MiB or GiB.
fn setting_bytes(text: &str) -> u64 {
    let text = text.trim();
    for (unit, factor) in [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)] {
        if let Some(n) = text.strip_suffix(unit) {
            return n.trim().parse::<u64>().unwrap() * factor;
        }
    }
    text.parse()
        .unwrap_or_else(|e| panic!("size `{text}`: {e}"))
}

/// A Kubernetes memory quantity (`1536Mi`, `2Gi`, `512M`, bytes).
fn quantity_bytes(text: &str) -> u64 {
    for (unit, factor) in [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ] {
        if let Some(n) = text.strip_suffix(unit) {
            return n.parse::<u64>().unwrap() * factor;
        }
    }
    text.parse()
        .unwrap_or_else(|e| panic!("quantity `{text}`: {e}"))
}

/// The pod's memory limit covers the worst case of polling with the config map's settings
/// (each unset one at its default from `watchbridge run --help`), plus the rest of the
/// process; the request equals the limit; docs/operations.md shows the arithmetic with
/// these numbers.
#[test]
fn kubernetes_memory_limit_covers_the_worst_case_of_polling() {
    let help = help_variables();
    let config = yaml("deploy/k8s/configmap.yaml");
    let setting = |name: &str| -> String {
        config["data"][name]
            .as_str()
            .map(str::to_string)
            .or_else(|| help.get(name).cloned().flatten())
            .unwrap_or_else(|| panic!("{name}: neither in configmap.yaml nor defaulted"))
    };
    assert_eq!(
        config["data"]["WATCHBRIDGE_POLLER"], "http",
        "the formula is the HTTP poller's"
    );
    let in_flight: u64 = setting("WATCHBRIDGE_MAX_IN_FLIGHT").parse().unwrap();
    let poll_bytes = setting_bytes(&setting("WATCHBRIDGE_HTTP_MAX_POLL_BYTES"));
    let poll_items: u64 = setting("WATCHBRIDGE_HTTP_MAX_POLL_ITEMS").parse().unwrap();
    let page_bytes = setting_bytes(&setting("WATCHBRIDGE_HTTP_MAX_BYTES"));
    assert!(
        page_bytes <= poll_bytes,
        "a page ({page_bytes} B) counts within the poll's budget ({poll_bytes} B)"
    );
    let polling = in_flight * (poll_bytes + poll_items * BYTES_PER_ITEM);
    let worst = polling + REST_OF_THE_PROCESS;

    let deployment = yaml("deploy/k8s/deployment.yaml");
    let resources = &deployment["spec"]["template"]["spec"]["containers"][0]["resources"];
    let limit = quantity_bytes(
        resources["limits"]["memory"]
            .as_str()
            .expect("a memory limit"),
    );
    let request = quantity_bytes(resources["requests"]["memory"].as_str().expect("a request"));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        limit >= worst,
        "memory limit {:.0} MiB < {in_flight} × ({poll_bytes} B + {poll_items} × \
         {BYTES_PER_ITEM} B) + {:.0} MiB = {:.0} MiB",
        mib(limit),
        mib(REST_OF_THE_PROCESS),
        mib(worst)
    );
    assert_eq!(request, limit, "the memory request equals the limit");

    // The docs' arithmetic is this one.
    let ops = read("docs/operations.md");
    let section = ops
        .split("### Memory of polling")
        .nth(1)
        .expect("docs/operations.md has a section \"Memory of polling\"");
    let shown = [
        format!("WATCHBRIDGE_MAX_IN_FLIGHT={in_flight}"),
        format!("{in_flight} × ({} MiB + ", poll_bytes >> 20),
        format!("= {:.0} MiB of polling", mib(polling)),
        format!("{:.0} MiB for the rest", mib(REST_OF_THE_PROCESS)),
        format!("{} MiB (deployment.yaml", with_thousands(limit >> 20)),
    ];
    for text in shown {
        assert!(
            section.contains(&text),
            "docs/operations.md, \"Memory of polling\", does not show `{text}`"
        );
    }
}

/// `1536` as `1,536`.
fn with_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A drain takes one pod at a time, and the replicas spread over zones and hosts without
/// blocking a schedule.
#[test]
fn kubernetes_disruption_budget_and_spread() {
    let deployment = yaml("deploy/k8s/deployment.yaml");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pdb = yaml("deploy/k8s/pdb.yaml");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["kind"], "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"].as_u64(), Some(1));
    assert!(pdb["spec"]["minAvailable"].is_null(), "one of the two only");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *labels);
    let listed = yaml("deploy/k8s/kustomization.yaml")["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|r| r == "pdb.yaml");
    assert!(listed, "kustomization.yaml lists pdb.yaml");

    let spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        .as_sequence()
        .expect("topologySpreadConstraints");
    let keys: Vec<&str> = spread
        .iter()
        .map(|c| c["topologyKey"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    );
    for c in spread {
        assert_eq!(c["whenUnsatisfiable"], "ScheduleAnyway", "{c:?}");
        assert_eq!(c["maxSkew"].as_u64(), Some(1), "{c:?}");
        assert_eq!(c["labelSelector"]["matchLabels"], *labels, "{c:?}");
    }

    // The liveness probe restarts an instance soon after /healthz fails (it already waited
    // out the stall timeout), but not on one slow answer.
    let liveness = &deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"];
    let failing_for = liveness["periodSeconds"].as_u64().unwrap()
        * liveness["failureThreshold"].as_u64().unwrap();
    assert!(
        (20..=60).contains(&failing_for),
        "liveness restarts after {failing_for} s of failures"
    );
    assert!(liveness["failureThreshold"].as_u64().unwrap() >= 2);
}

/// Every way of scraping the bridge names the job `watchbridge`, which is what the alert
/// rules select; no pod carries an annotation that would make an annotation-based scrape
/// give it another job name.
#[test]
fn every_scrape_names_the_job_the_alerts_select() {
    let rules = read("deploy/prometheus-alerts.yml");
    let selected: BTreeSet<&str> = rules
        .match_indices("job=\"")
        .map(|(i, m)| {
            let rest = &rules[i + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(
        selected,
        BTreeSet::from(["watchbridge"]),
        "jobs the rules select"
    );

    let compose = yaml("deploy/prometheus.yml");
    assert_eq!(compose["scrape_configs"][0]["job_name"], "watchbridge");
    let k8s = yaml("deploy/prometheus-k8s-scrape.yml");
    let job = &k8s["scrape_configs"][0];
    assert_eq!(job["job_name"], "watchbridge");
    assert_eq!(job["kubernetes_sd_configs"][0]["role"], "pod");
    let keeps: Vec<(&str, &str)> = job["relabel_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "keep")
        .map(|r| {
            (
                r["source_labels"][0].as_str().unwrap(),
                r["regex"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keeps,
        [
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                "watchbridge"
            ),
            ("__meta_kubernetes_pod_container_port_name", "metrics"),
        ]
    );

    let monitor = yaml("deploy/k8s/podmonitor.yaml");
    let relabel = &monitor["spec"]["podMetricsEndpoints"][0]["relabelings"];
    assert!(
        relabel
            .as_sequence()
            .unwrap()
            .iter()
            .any(|r| r["targetLabel"] == "job"
                && r["replacement"] == "watchbridge"
                && r["action"] == "replace"
                && r["sourceLabels"].is_null()),
        "podmonitor.yaml sets job=watchbridge: {relabel:?}"
    );

    let deployment = yaml("deploy/k8s/deployment.yaml");
    let annotations = deployment["spec"]["template"]["metadata"]["annotations"].as_mapping();
    let scrape: Vec<_> = annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str().unwrap().starts_with("prometheus.io/"))
        .collect();
    assert!(
        scrape.is_empty(),
        "an annotation-based scrape would name the job after its own config: {scrape:?}"
    );
}

/// The compose bridge's poller settings, run with `watchbridge poll-once` against the
/// sample feeds served as compose serves them (plain files over HTTP).
#[tokio::test(flavor = "multi_thread")]
async fn compose_poller_settings_read_the_sample_feeds() {
    let feeds = root().join("deploy/sample-feeds");
    let server = TestServer::start(move |seen| {
        let path = seen.target.trim_start_matches('/');
        match std::fs::read(feeds.join(path)) {
            Ok(body) if !path.contains("..") => Reply::status(200, body),
            _ => Reply::status(404, "not found"),
        }
    })
    .await;
    let compose = yaml(COMPOSE);
    let env: Vec<(String, String)> = compose["services"]["watchbridge"]["environment"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_string(),
                v.as_str().unwrap().to_string(),
            )
        })
        .filter(|(k, _)| k.starts_with("WATCHBRIDGE_HTTP_") || k == "WATCHBRIDGE_POLLER")
        .map(|(k, v)| (k, v.replace("http://feeds:8080", &server.url(""))))
        .collect();
    assert!(env
        .iter()
        .any(|(k, v)| k == "WATCHBRIDGE_HTTP_URL" && v.starts_with("http://127.0.0.1")));
    for (input, keys) in [
        (r#"{"id": 1}"#, vec!["e1", "e2"]),
        (r#"{"id": 2}"#, vec!["signup", "first-login"]),
        (r#"{"id": 3}"#, vec![]),
    ] {
        let env = env.clone();
        let out = tokio::task::spawn_blocking(move || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
            for (name, _) in std::env::vars() {
                if name.starts_with("WATCHBRIDGE_") {
                    command.env_remove(name);
                }
            }
            command
                .args(["poll-once", "--input", input])
                .envs(env)
                .output()
                .expect("run watchbridge")
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "poll-once {input}: {stderr}");
        let got: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let line: Json = serde_json::from_str(l).unwrap();
                assert!(
                    line["event_time"]
                        .as_str()
                        .unwrap()
                        .starts_with("2026-11-30T"),
                    "{l}"
                );
                line["key"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(got, keys, "poll-once {input}");
    }
}

/// `config -q` of a Compose client on the compose file: the file as Compose itself reads
/// it (its schema, service references, durations, port and volume syntax), which the YAML
/// checks above do not cover. No engine is needed for it. The client is the `docker compose`
/// CLI plugin where there is one, else `docker-compose` (Debian's package, 1.29: the
/// Compose file format without a `version:`), which `make setup` installs. Without either
/// the test fails, saying the check was not made: it never passes unchecked. A broken copy
/// of the file must be refused, so a client that accepts anything cannot pass it either.
#[test]
fn docker_compose_file_is_valid_for_a_compose_client() {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let (program, prefix): (&str, &[&str]) = if works("docker", &["compose", "version"]) {
        ("docker", &["compose"])
    } else if works("docker-compose", &["version"]) {
        ("docker-compose", &[])
    } else {
        panic!(
            "NOT CHECKED: no Compose client here (`docker compose` or `docker-compose`) to \
             validate {COMPOSE}; `make setup` installs Debian's docker-compose"
        );
    };
    let deploy = root().join("deploy");
    // (`--project-directory`: relative paths resolve against deploy/, wherever the file is.)
    let config = |file: &Path| {
        let out = Command::new(program)
            .args(prefix)
            .arg("--project-directory")
            .arg(&deploy)
            .arg("-f")
            .arg(file)
            .args(["config", "-q"])
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("{program} {prefix:?}: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (valid, stderr) = config(&root().join(COMPOSE));
    assert!(
        valid,
        "{program} {prefix:?} -f {COMPOSE} config -q: {stderr}"
    );

    // The same file with a mistake in it: an option Compose does not know, and a
    // dependency on a service that does not exist. Each must be refused.
    let original = read(COMPOSE);
    for (mistake, broken) in [
        (
            "an unknown option",
            original.replacen(
                "    stop_grace_period: 45s",
                "    stop_grace_period: 45s\n    stop_grace_perod: 45s",
                1,
            ),
        ),
        (
            "a dependency on no service",
            original.replacen("      - prometheus\n", "      - prometheuss\n", 1),
        ),
    ] {
        assert_ne!(broken, original, "{mistake}: the edit did not apply");
        let copy = tempfile::Builder::new()
            .prefix("docker-compose-")
            .suffix(".yml")
            .tempfile()
            .unwrap();
        std::fs::write(copy.path(), &broken).unwrap();
        let (valid, stderr) = config(copy.path());
        assert!(
            !valid,
            "{program} {prefix:?} config -q accepted {COMPOSE} with {mistake}: it validates \
             nothing"
        );
        eprintln!("{mistake}: refused: {}", stderr.trim());
    }
}
