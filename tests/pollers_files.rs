//! The file pollers (`glob`, `sharded`) against real temporary directories.

use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::glob::{GlobArgs, GlobPoller, GlobTarget};
use watchbridge::pollers::sharded::{ShardedArgs, ShardedPoller};
use watchbridge::pollers::Resolve;

/// Write `path` (creating its directory) with modification time `ms` after the epoch.
fn write(path: &Path, content: &str, ms: i64) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
    let file = fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64))
        .unwrap();
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn glob_poller(pattern: &str, match_updated: bool, marker: Option<&str>) -> GlobPoller {
    GlobPoller::new(
        GlobArgs {
            glob: Some(pattern.to_string()),
            glob_match_updated: match_updated,
            glob_done_marker: marker.map(str::to_string),
            ..GlobArgs::default()
        }
        .config()
        .unwrap(),
    )
}

fn sharded_poller(pattern: &str, first_shard: &str) -> ShardedPoller {
    ShardedPoller::new(
        ShardedArgs {
            sharded_pattern: Some(pattern.to_string()),
            sharded_first_shard: first_shard.to_string(),
            ..ShardedArgs::default()
        }
        .config()
        .unwrap(),
    )
}

async fn poll<P>(poller: &P, input: &Value) -> Result<PollResult, PollError>
where
    P: Resolve,
{
    let target = poller.resolve(input, b"k").unwrap();
    poller.poll(Arc::new(target)).await
}

fn keys(result: &PollResult) -> Vec<String> {
    result
        .outputs
        .iter()
        .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
        .collect()
}

fn value(output: &Output) -> Value {
    serde_json::from_slice(&output.value).unwrap()
}

fn s(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

fn root(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().to_path_buf()
}

#[tokio::test]
async fn glob_emits_matching_files_as_they_appear() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*.csv", s(&data)), false, None);
    let acme = json!({"tenant": "acme"});

    let a = data.join("acme/a.csv");
    write(&a, "1,2\n", 1_764_511_200_250);
    write(&data.join("acme/notes.txt"), "x", 1_000);
    write(&data.join("other/z.csv"), "x", 1_000);
    fs::create_dir_all(data.join("acme/dir.csv")).unwrap();

    let first = poll(&poller, &acme).await.unwrap();
    assert!(!first.complete);
    assert_eq!(first.watermark, None);
    assert_eq!(keys(&first), [s(&a)]);
    assert_eq!(first.outputs[0].event_time, 1_764_511_200_250);
    assert_eq!(
        value(&first.outputs[0]),
        json!({
            "path": s(&a),
            "size": 4,
            "modified": "2025-11-30T14:00:00.25Z",
            "modified_ms": 1_764_511_200_250_i64,
        })
    );

    let b = data.join("acme/b.csv");
    write(&b, "", 2_000);
    let second = poll(&poller, &acme).await.unwrap();
    assert_eq!(keys(&second), [s(&a), s(&b)]);
    assert_eq!(second.outputs[1].event_time, 2_000);
    assert_eq!(value(&second.outputs[1])["size"], 0);
    assert!(!second.complete);
}

#[tokio::test]
async fn match_updated_makes_a_rewritten_file_new_again() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let pattern = format!("{}/{{/tenant}}/*.csv", s(&data));
    let by_path = glob_poller(&pattern, false, None);
    let by_version = glob_poller(&pattern, true, None);
    let acme = json!({"tenant": "acme"});
    let f = data.join("acme/f.csv");

    write(&f, "v1", 5_000);
    let v1 = poll(&by_version, &acme).await.unwrap();
    assert_eq!(keys(&v1), [format!("{}@5000000000", s(&f))]);
    assert_eq!(keys(&poll(&by_path, &acme).await.unwrap()), [s(&f)]);

    write(&f, "v2, longer", 7_000);
    let v2 = poll(&by_version, &acme).await.unwrap();
    assert_eq!(keys(&v2), [format!("{}@7000000000", s(&f))]);
    assert_ne!(v1.outputs[0].key, v2.outputs[0].key);
    assert_eq!(v2.outputs[0].event_time, 7_000);
    assert_eq!(value(&v2.outputs[0])["size"], 10);
    // Keyed by path, the rewrite is the same output.
    assert_eq!(keys(&poll(&by_path, &acme).await.unwrap()), [s(&f)]);
}

#[tokio::test]
async fn done_marker_makes_the_set_final_and_is_not_an_output() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*", s(&data)), false, Some("_DONE"));
    let acme = json!({"tenant": "acme"});
    let a = data.join("acme/a.csv");
    write(&a, "", 1_000);

    let before = poll(&poller, &acme).await.unwrap();
    assert!(!before.complete);
    // A file named like the marker elsewhere is not the marker.
    write(&data.join("other/_DONE"), "", 1_000);
    assert!(!poll(&poller, &acme).await.unwrap().complete);

    write(&data.join("acme/_DONE"), "", 3_000);
    let after = poll(&poller, &acme).await.unwrap();
    assert!(after.complete);
    assert_eq!(keys(&after), [s(&a)]);
}

#[tokio::test]
async fn read_only_directory_makes_the_set_final() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*.csv", s(&data)), false, None);
    let acme = json!({"tenant": "acme"});
    let dir = data.join("acme");
    write(&dir.join("a.csv"), "", 1_000);

    chmod(&dir, 0o755);
    assert!(!poll(&poller, &acme).await.unwrap().complete);
    // Any write bit left means still open.
    chmod(&dir, 0o575);
    assert!(!poll(&poller, &acme).await.unwrap().complete);
    // Judged by the bits, so this holds even when the test runs as root.
    chmod(&dir, 0o555);
    let result = poll(&poller, &acme).await;
    chmod(&dir, 0o755);
    let result = result.unwrap();
    assert!(result.complete);
    assert_eq!(keys(&result), [s(&dir.join("a.csv"))]);
}

#[tokio::test]
async fn a_directory_that_does_not_exist_yet_is_empty_and_open() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let glob = glob_poller(
        &format!("{}/{{/tenant}}/*.csv", s(&data)),
        false,
        Some("_DONE"),
    );
    let sharded = sharded_poller(&format!("{}/{{/tenant}}/part-*-of-*", s(&data)), "auto");
    let input = json!({"tenant": "later"});
    assert_eq!(
        poll(&glob, &input).await.unwrap(),
        PollResult::incomplete(vec![])
    );
    assert_eq!(
        poll(&sharded, &input).await.unwrap(),
        PollResult::incomplete(vec![])
    );
    write(&data.join("later/x.csv"), "", 1_000);
    assert_eq!(poll(&glob, &input).await.unwrap().outputs.len(), 1);
}

#[tokio::test]
async fn a_file_that_vanishes_before_its_stat_is_skipped() {
    // A dangling symlink is listed by the glob and then not found by the stat: the same
    // path as a file deleted between the two.
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*.csv", s(&data)), false, None);
    write(&data.join("acme/a.csv"), "", 1_000);
    std::os::unix::fs::symlink(data.join("acme/gone"), data.join("acme/b.csv")).unwrap();
    // A symlink to a file is followed.
    std::os::unix::fs::symlink(data.join("acme/a.csv"), data.join("acme/c.csv")).unwrap();
    let result = poll(&poller, &json!({"tenant": "acme"})).await.unwrap();
    assert_eq!(
        keys(&result),
        [s(&data.join("acme/a.csv")), s(&data.join("acme/c.csv"))]
    );
}

#[test]
fn substituted_values_must_be_one_segment() {
    let glob = glob_poller("/data/{/tenant}/*.csv", false, None);
    let sharded = sharded_poller("/out/{/tenant}/part-*-of-*", "auto");
    for (evil, why) in [
        ("../x", "contains `/`"),
        ("a/b", "contains `/`"),
        ("..", "contains `..`"),
        (".", "is `.`"),
        ("", "is empty"),
    ] {
        let input = json!({ "tenant": evil });
        for e in [
            glob.resolve(&input, b"k").unwrap_err(),
            sharded.resolve(&input, b"k").unwrap_err(),
        ] {
            let reason = e.to_string();
            assert!(reason.contains("`{/tenant}`"), "{evil:?}: {reason}");
            assert!(reason.contains(why), "{evil:?}: {reason}");
        }
    }
    let e = glob.resolve(&json!({"other": 1}), b"k").unwrap_err();
    assert!(e.to_string().contains("/tenant"), "{e}");
}

/// A value too long for a file name (NAME_MAX, 255 bytes), or one that makes the watched
/// directory longer than a path may be (PATH_MAX, 4096 bytes), is the input's fault: it is
/// refused when the watch is resolved (the input is dead-lettered), not retried as an IO
/// error at every poll.
#[tokio::test]
async fn values_too_long_for_a_path_are_refused_not_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = s(&root(&tmp));
    let glob = glob_poller(&format!("{dir}/{{/tenant}}/*.csv"), false, None);
    let sharded = sharded_poller(&format!("{dir}/{{/tenant}}/part-*-of-*"), "auto");
    let suffixed = glob_poller(&format!("{dir}/{{/tenant}}-logs/*.csv"), false, None);
    let long = json!({ "tenant": "a".repeat(256) });
    for e in [
        glob.resolve(&long, b"k").unwrap_err(),
        sharded.resolve(&long, b"k").unwrap_err(),
    ] {
        assert!(e.to_string().contains("longer than 255 bytes"), "{e}");
    }
    // 251 bytes and `-logs`: a 256-byte directory name.
    let e = suffixed
        .resolve(&json!({ "tenant": "a".repeat(251) }), b"k")
        .unwrap_err();
    assert!(e.to_string().contains("longer than 255 bytes"), "{e}");
    // Twenty 250-byte segments: each a valid name, the path too long.
    let deep = glob_poller(
        &format!("{dir}/{}*.csv", "{/tenant}/".repeat(20)),
        false,
        None,
    );
    let e = deep
        .resolve(&json!({ "tenant": "a".repeat(250) }), b"k")
        .unwrap_err();
    assert!(e.to_string().contains("longer than 4095 bytes"), "{e}");
    // At the limits, a watch polls (an empty, open set).
    let ok = json!({ "tenant": "a".repeat(255) });
    let result = poll(&glob, &ok).await.unwrap();
    assert!(result.outputs.is_empty() && !result.complete);
}

#[tokio::test]
async fn metacharacters_in_values_match_only_themselves() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*.csv", s(&data)), false, None);
    write(&data.join("acme/f.csv"), "", 1_000);
    write(&data.join("ab/h.csv"), "", 1_000);
    let star = data.join("*/g.csv");
    write(&star, "", 1_000);
    let question = data.join("a?/q.csv");
    write(&question, "", 1_000);

    let target = poller.resolve(&json!({"tenant": "*"}), b"k").unwrap();
    assert_eq!(target.dir, data.join("*"));
    let result = poller.poll(Arc::new(target)).await.unwrap();
    assert_eq!(keys(&result), [s(&star)]);

    let target = poller.resolve(&json!({"tenant": "a?"}), b"k").unwrap();
    assert_eq!(target.dir, data.join("a?"));
    let result = poller.poll(Arc::new(target)).await.unwrap();
    assert_eq!(keys(&result), [s(&question)]);

    // No directory literally named so: nothing, even though `acme` would match `a*`.
    let result = poll(&poller, &json!({"tenant": "a*"})).await.unwrap();
    assert_eq!(result, PollResult::incomplete(vec![]));

    // The watched directory is the literal one, so its marker is too.
    let marked = glob_poller(
        &format!("{}/{{/tenant}}/*.csv", s(&data)),
        false,
        Some("_DONE"),
    );
    write(&data.join("acme/_DONE"), "", 1_000);
    assert!(
        !poll(&marked, &json!({"tenant": "*"}))
            .await
            .unwrap()
            .complete
    );
    write(&data.join("*/_DONE"), "", 1_000);
    assert!(
        poll(&marked, &json!({"tenant": "*"}))
            .await
            .unwrap()
            .complete
    );
}

#[test]
fn the_watched_directory_is_the_literal_prefix() {
    let glob = glob_poller("/data/{/tenant}/*/x-{key}.csv", false, None);
    let target = glob.resolve(&json!({"tenant": "a*"}), b"k").unwrap();
    assert_eq!(
        target,
        GlobTarget {
            pattern: "/data/a[*]/*/x-k.csv".into(),
            dir: PathBuf::from("/data/a*"),
        }
    );
}

#[tokio::test]
async fn an_unreadable_directory_is_a_transient_io_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = glob_poller(&format!("{}/{{/tenant}}/*/*.csv", s(&data)), false, None);
    let locked = data.join("acme/locked");
    write(&locked.join("x.csv"), "", 1_000);
    chmod(&locked, 0o000);
    // Root reads it anyway; then there is no error to see.
    let can_read = fs::read_dir(&locked).is_ok();
    let result = poll(&poller, &json!({"tenant": "acme"})).await;
    chmod(&locked, 0o755);
    if can_read {
        assert_eq!(result.unwrap().outputs.len(), 1);
    } else {
        let e = result.unwrap_err();
        assert_eq!(e.kind, "io");
        assert!(!e.permanent);
        assert!(e.message.contains(&s(&locked)), "{e}");
    }
}

#[tokio::test]
async fn glob_config_errors_name_the_variable() {
    let args = |pattern: Option<&str>, marker: Option<&str>| GlobArgs {
        glob: pattern.map(str::to_string),
        glob_match_updated: false,
        glob_done_marker: marker.map(str::to_string),
        ..GlobArgs::default()
    };
    let e = args(None, None).config().unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_GLOB");
    assert!(
        e.to_string().starts_with("WATCHBRIDGE_GLOB: is required"),
        "{e}"
    );
    let e = args(Some("data/{/tenant}/*.csv"), None)
        .config()
        .unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_GLOB");
    assert!(e.message.contains("absolute"), "{e}");
    let e = args(Some("/data/{tenant}/*.csv"), None)
        .config()
        .unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_GLOB");
    assert!(e.message.contains("unknown placeholder"), "{e}");
    let e = args(Some("/data/*.csv"), Some("sub/_DONE"))
        .config()
        .unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_GLOB_DONE_MARKER");
    assert!(e.message.contains("`/`"), "{e}");
    let e = args(Some("/data/*.csv"), Some("..")).config().unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_GLOB_DONE_MARKER");

    let sharded = |pattern: Option<&str>, first: &str| ShardedArgs {
        sharded_pattern: pattern.map(str::to_string),
        sharded_first_shard: first.to_string(),
        ..ShardedArgs::default()
    };
    let e = sharded(None, "auto").config().unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_SHARDED_PATTERN");
    assert!(e.message.contains("WATCHBRIDGE_POLLER=sharded"), "{e}");
    let e = sharded(Some("out/part-*"), "auto").config().unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_SHARDED_PATTERN");
    let e = sharded(Some("/out/part-*"), "first").config().unwrap_err();
    assert_eq!(e.var, "WATCHBRIDGE_SHARDED_FIRST_SHARD");
}

#[test]
fn settings_are_read_from_the_environment() {
    // The only test in this binary that reads these variables.
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        glob: GlobArgs,
        #[command(flatten)]
        sharded: ShardedArgs,
    }
    let vars = [
        ("WATCHBRIDGE_GLOB", "/data/{/tenant}/*.csv"),
        ("WATCHBRIDGE_GLOB_MATCH_UPDATED", "true"),
        ("WATCHBRIDGE_GLOB_DONE_MARKER", "_SUCCESS"),
        ("WATCHBRIDGE_SHARDED_PATTERN", "/out/{/job}/part-*-of-*"),
        ("WATCHBRIDGE_SHARDED_FIRST_SHARD", "0"),
    ];
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let cli = Cli::try_parse_from(["watchbridge"]);
    std::env::set_var("WATCHBRIDGE_GLOB_MATCH_UPDATED", "false");
    let off = Cli::try_parse_from(["watchbridge"]);
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    let defaults = Cli::try_parse_from(["watchbridge"]).unwrap();

    let cli = cli.unwrap();
    assert_eq!(cli.glob.glob.as_deref(), Some("/data/{/tenant}/*.csv"));
    assert!(cli.glob.glob_match_updated);
    assert_eq!(cli.glob.glob_done_marker.as_deref(), Some("_SUCCESS"));
    let config = cli.glob.config().unwrap();
    assert!(config.match_updated());
    assert_eq!(config.done_marker(), Some("_SUCCESS"));
    assert_eq!(
        cli.sharded.config().unwrap().first_shard(),
        watchbridge::pollers::sharded::FirstShard::Zero
    );
    assert!(!off.unwrap().glob.glob_match_updated);
    assert_eq!(defaults.glob, GlobArgs::default());
    assert_eq!(defaults.sharded, ShardedArgs::default());
}

// ---- sharded ----

fn shard_path(dir: &Path, index: u64, of: u64) -> PathBuf {
    dir.join(format!("part-{index:05}-of-{of:05}.avro"))
}

#[tokio::test]
async fn sharded_watermark_stops_at_the_first_gap_until_all_shards_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = sharded_poller(&format!("{}/{{/job}}/*", s(&data)), "auto");
    let job = json!({"job": "j1"});
    let dir = data.join("j1");
    // Shards 1, 2, 3, 7 and 8 of 10; times out of order so only "shard 3's" is right.
    let times =
        |i: u64| -> i64 { 100_000 + [0, 50, 30, 40, 0, 0, 0, 90, 80, 0, 10][i as usize] * 1000 };
    for i in [1, 2, 3, 7, 8] {
        write(&shard_path(&dir, i, 10), "x", times(i));
    }
    write(&dir.join("_SUCCESS"), "", 1);
    write(&dir.join("part-README-of-all"), "", 1);
    fs::create_dir_all(dir.join("part-00009-of-00010.avro.d")).unwrap();

    let partial = poll(&poller, &job).await.unwrap();
    assert!(!partial.complete);
    assert_eq!(partial.watermark, Some(times(3)));
    let expected: Vec<_> = [1, 2, 3, 7, 8]
        .iter()
        .map(|&i| s(&shard_path(&dir, i, 10)))
        .collect();
    assert_eq!(keys(&partial), expected);
    let seven = &partial.outputs[3];
    assert_eq!(seven.event_time, times(7));
    assert_eq!(
        value(seven),
        json!({
            "path": s(&shard_path(&dir, 7, 10)),
            "size": 1,
            "modified": "1970-01-01T00:03:10Z",
            "modified_ms": times(7),
            "shard": 7,
            "of": 10,
        })
    );

    for i in [4, 5, 6, 9, 10] {
        write(&shard_path(&dir, i, 10), "x", times(i));
    }
    let all = poll(&poller, &job).await.unwrap();
    assert!(all.complete);
    assert_eq!(all.outputs.len(), 10);
    assert_eq!(all.watermark, Some(times(10)));
}

#[tokio::test]
async fn zero_based_shards_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let job = json!({"job": "j"});
    let dir = data.join("j");
    let pattern = format!("{}/{{/job}}/part-*-of-*", s(&data));
    for first in ["auto", "0"] {
        let poller = sharded_poller(&pattern, first);
        write(&shard_path(&dir, 1, 3), "", 2_000);
        let r = poll(&poller, &job).await.unwrap();
        assert!(!r.complete, "{first}");
        write(&shard_path(&dir, 0, 3), "", 1_000);
        write(&shard_path(&dir, 2, 3), "", 3_000);
        let r = poll(&poller, &job).await.unwrap();
        assert!(r.complete, "{first}");
        assert_eq!(r.watermark, Some(3_000), "{first}");
        assert_eq!(value(&r.outputs[0])["shard"], 0);
        assert_eq!(value(&r.outputs[0])["of"], 3);
        fs::remove_dir_all(&dir).unwrap();
    }
    // Numbered from 1 by setting, shard 0 does not fit.
    write(&shard_path(&dir, 0, 3), "", 1_000);
    let e = poll(&sharded_poller(&pattern, "1"), &job)
        .await
        .unwrap_err();
    assert_eq!(e.kind, "inconsistent_shards");
    assert!(e.message.contains("part-00000-of-00003.avro"), "{e}");
}

/// `WATCHBRIDGE_SHARDED_MATCH_UPDATED`: a rewritten shard is a new version of the same
/// path (its modification time), new again to a watch's seen set; by default the same.
#[tokio::test]
async fn a_rewritten_shard_is_new_again_with_match_updated() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let job = json!({"job": "j"});
    let pattern = format!("{}/{{/job}}/part-*-of-*", s(&data));
    let by_version = ShardedPoller::new(
        ShardedArgs {
            sharded_pattern: Some(pattern.clone()),
            sharded_match_updated: true,
            ..ShardedArgs::default()
        }
        .config()
        .unwrap(),
    );
    let by_path = sharded_poller(&pattern, "auto");
    let shard = shard_path(&data.join("j"), 0, 1);
    write(&shard, "v1", 1_000);
    let mut seen = watchbridge::seen::SeenSet::new();
    let mut seen_by_path = watchbridge::seen::SeenSet::new();
    let first = poll(&by_version, &job).await.unwrap().outputs;
    assert_eq!(first[0].version.as_deref(), Some(&b"1000000000"[..]));
    assert_eq!(seen.take_new(first).len(), 1);
    let by_path_first = poll(&by_path, &job).await.unwrap().outputs;
    assert_eq!(by_path_first[0].version, None);
    assert_eq!(seen_by_path.take_new(by_path_first).len(), 1);
    write(&shard, "v2", 2_000);
    let again = poll(&by_version, &job).await.unwrap().outputs;
    assert_eq!(seen.take_new(again.clone()).len(), 1, "the rewrite is new");
    assert_eq!(seen.take_new(again).len(), 0, "once");
    let by_path_again = poll(&by_path, &job).await.unwrap().outputs;
    assert_eq!(seen_by_path.take_new(by_path_again).len(), 0);
}

#[tokio::test]
async fn shards_disagreeing_on_the_count_are_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let poller = sharded_poller(&format!("{}/{{/job}}/part-*-of-*", s(&data)), "auto");
    let dir = data.join("j");
    write(&shard_path(&dir, 1, 3), "", 1_000);
    write(&shard_path(&dir, 2, 4), "", 1_000);
    let e = poll(&poller, &json!({"job": "j"})).await.unwrap_err();
    assert_eq!(e.kind, "inconsistent_shards");
    assert!(!e.permanent);
    assert!(e.message.contains("part-00001-of-00003.avro"), "{e}");
    assert!(e.message.contains("part-00002-of-00004.avro"), "{e}");

    fs::remove_file(shard_path(&dir, 2, 4)).unwrap();
    write(&shard_path(&dir, 4, 3), "", 1_000);
    let e = poll(&poller, &json!({"job": "j"})).await.unwrap_err();
    assert_eq!(e.kind, "inconsistent_shards");
    assert!(e.message.contains("outside 1..=3"), "{e}");
}

/// The worked examples in docs/pollers/glob.md and docs/pollers/sharded.md, byte for byte.
#[tokio::test]
async fn the_documented_examples_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let glob = glob_poller(
        &format!("{}/{{/tenant}}/*.csv", s(&data)),
        false,
        Some("_SUCCESS"),
    );
    let dir = data.join("acme");
    write(
        &dir.join("2026-11-30.csv"),
        &"x".repeat(1200),
        1796047200000,
    );
    write(&dir.join("readme.txt"), "", 1);
    let r = poll(&glob, &json!({"tenant": "acme"})).await.unwrap();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(
        keys(&r)[0].replacen(&s(&data), "/data", 1),
        "/data/acme/2026-11-30.csv"
    );
    assert_eq!(
        String::from_utf8(r.outputs[0].value.to_vec())
            .unwrap()
            .replacen(&s(&data), "/data", 1),
        r#"{"modified":"2026-11-30T14:00:00Z","modified_ms":1796047200000,"path":"/data/acme/2026-11-30.csv","size":1200}"#
    );
    write(&dir.join("2026-12-01.csv"), &"x".repeat(310), 1796117400500);
    write(&dir.join("_SUCCESS"), "", 1);
    let r = poll(&glob, &json!({"tenant": "acme"})).await.unwrap();
    assert!(r.complete);
    assert_eq!(
        String::from_utf8(r.outputs[1].value.to_vec())
            .unwrap()
            .replacen(&s(&data), "/data", 1),
        r#"{"modified":"2026-12-01T09:30:00.5Z","modified_ms":1796117400500,"path":"/data/acme/2026-12-01.csv","size":310}"#
    );
    assert_eq!(r.outputs[1].event_time, 1796117400500);

    let sharded = sharded_poller(&format!("{}/{{/job}}/part-*-of-*", s(&data)), "auto");
    let job = json!({"job": "daily-2026-11-30"});
    let dir = data.join("daily-2026-11-30");
    write(
        &dir.join("part-00000-of-00003.avro"),
        &"x".repeat(4096),
        1796050930000,
    );
    write(
        &dir.join("part-00002-of-00003.avro"),
        &"x".repeat(2048),
        1796050985000,
    );
    let r = poll(&sharded, &job).await.unwrap();
    assert_eq!((r.watermark, r.complete), (Some(1796050930000), false));
    let values: Vec<_> = r
        .outputs
        .iter()
        .map(|o| {
            String::from_utf8(o.value.to_vec())
                .unwrap()
                .replacen(&s(&data), "/out", 1)
        })
        .collect();
    assert_eq!(
        values,
        [
            r#"{"modified":"2026-11-30T15:02:10Z","modified_ms":1796050930000,"of":3,"path":"/out/daily-2026-11-30/part-00000-of-00003.avro","shard":0,"size":4096}"#,
            r#"{"modified":"2026-11-30T15:03:05Z","modified_ms":1796050985000,"of":3,"path":"/out/daily-2026-11-30/part-00002-of-00003.avro","shard":2,"size":2048}"#,
        ]
    );
    write(&dir.join("part-00001-of-00003.avro"), "", 1796050960000);
    let r = poll(&sharded, &job).await.unwrap();
    assert_eq!((r.watermark, r.complete), (Some(1796050985000), true));
}

// ---- hostile directories: symlinks, cycles, huge directories, slow walks (issue 17) ----

use std::os::unix::fs::symlink;
use watchbridge::pollers::glob::FollowSymlinks;

fn glob_walking(pattern: &str, follow: FollowSymlinks, max_entries: u64) -> GlobPoller {
    GlobPoller::new(
        GlobArgs {
            glob: Some(pattern.to_string()),
            glob_follow_symlinks: follow,
            glob_max_entries: max_entries,
            ..GlobArgs::default()
        }
        .config()
        .unwrap(),
    )
}

/// A runtime of its own, so a walk that never ends (the bug) cannot hang the test binary:
/// it is left behind with `shutdown_background`.
fn runtime(blocking_threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(blocking_threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Poll once; a poll still running after `limit` fails the test.
fn poll_within<P: Resolve>(
    poller: &P,
    input: &Value,
    limit: Duration,
) -> Result<PollResult, PollError> {
    let rt = runtime(4);
    let target = Arc::new(poller.resolve(input, b"k").unwrap());
    let result = rt.block_on(async { tokio::time::timeout(limit, poller.poll(target)).await });
    rt.shutdown_background();
    result.unwrap_or_else(|_| panic!("the poll did not end within {limit:?}"))
}

fn sorted_keys(result: &PollResult) -> Vec<String> {
    let mut k = keys(result);
    k.sort();
    k
}

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn symlinks_out_of_the_watched_directory_are_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp).join("data");
    let secret = root(&tmp).join("etc/shadow");
    write(&secret, "root:x:0:0", 1_000);
    write(&data.join("acme/ok.csv"), "", 2_000);
    write(&data.join("acme/sub/real.csv"), "", 3_000);
    symlink(&secret, data.join("acme/x.csv")).unwrap();
    symlink(data.join("acme/sub/real.csv"), data.join("acme/inner.csv")).unwrap();
    // Relative, through the parent and back in: still inside.
    symlink("../acme/ok.csv", data.join("acme/again.csv")).unwrap();
    let acme = json!({"tenant": "acme"});
    let pattern = format!("{}/{{/tenant}}/*.csv", s(&data));
    let keys_with = |follow| {
        let poller = glob_walking(&pattern, follow, 1_000);
        sorted_keys(&poll_within(&poller, &acme, LIMIT).unwrap())
    };
    let acme_dir = data.join("acme");
    let k = |name: &str| s(&acme_dir.join(name));

    // The default: only links that stay inside the watched directory.
    let default = glob_poller(&pattern, false, None);
    let result = poll_within(&default, &acme, LIMIT).unwrap();
    assert_eq!(
        sorted_keys(&result),
        [k("again.csv"), k("inner.csv"), k("ok.csv")]
    );
    // A followed link is described by its target, under the link's own path.
    let inner = result
        .outputs
        .iter()
        .find(|o| o.key == k("inner.csv").as_bytes())
        .unwrap();
    assert_eq!(inner.event_time, 3_000);
    assert_eq!(
        keys_with(FollowSymlinks::Inside),
        [k("again.csv"), k("inner.csv"), k("ok.csv")]
    );
    assert_eq!(
        keys_with(FollowSymlinks::All),
        [k("again.csv"), k("inner.csv"), k("ok.csv"), k("x.csv")]
    );
    assert_eq!(keys_with(FollowSymlinks::Never), [k("ok.csv")]);

    // The sharded poller walks the same way.
    let out = root(&tmp).join("out");
    write(&out.join("job/part-00000-of-00002"), "", 1_000);
    symlink(&secret, out.join("job/part-00001-of-00002")).unwrap();
    let sharded = sharded_poller(&format!("{}/{{/job}}/part-*", s(&out)), "0");
    let result = poll_within(&sharded, &json!({"job": "job"}), LIMIT).unwrap();
    assert_eq!(keys(&result), [s(&out.join("job/part-00000-of-00002"))]);
    assert!(!result.complete, "the shard outside must not count");
}

#[test]
fn a_symlink_to_a_sibling_tenant_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    write(&data.join("other-tenant/secret.csv"), "", 1_000);
    write(&data.join("other-tenant/deep/secret.csv"), "", 1_000);
    write(&data.join("acme/own/a.csv"), "", 2_000);
    write(&data.join("acme/b.csv"), "", 2_000);
    symlink("../other-tenant", data.join("acme/other")).unwrap();
    // A link to a directory inside the tenant's own is walked.
    symlink("own", data.join("acme/mine")).unwrap();
    let acme = json!({"tenant": "acme"});
    let a = |p: &str| s(&data.join("acme").join(p));

    let star = glob_poller(&format!("{}/{{/tenant}}/*/*.csv", s(&data)), false, None);
    let result = poll_within(&star, &acme, LIMIT).unwrap();
    assert_eq!(sorted_keys(&result), [a("mine/a.csv"), a("own/a.csv")]);

    let deep = glob_poller(&format!("{}/{{/tenant}}/**/*.csv", s(&data)), false, None);
    let result = poll_within(&deep, &acme, LIMIT).unwrap();
    assert_eq!(
        sorted_keys(&result),
        [a("b.csv"), a("mine/a.csv"), a("own/a.csv")]
    );
    assert!(
        !keys(&result).iter().any(|k| k.contains("secret")),
        "{:?}",
        keys(&result)
    );

    // `all` follows it, `never` follows no link at all.
    let pattern = format!("{}/{{/tenant}}/**/*.csv", s(&data));
    let all = glob_walking(&pattern, FollowSymlinks::All, 1_000);
    assert_eq!(
        sorted_keys(&poll_within(&all, &acme, LIMIT).unwrap()),
        [
            a("b.csv"),
            a("mine/a.csv"),
            a("other/deep/secret.csv"),
            a("other/secret.csv"),
            a("own/a.csv")
        ]
    );
    let never = glob_walking(&pattern, FollowSymlinks::Never, 1_000);
    assert_eq!(
        sorted_keys(&poll_within(&never, &acme, LIMIT).unwrap()),
        [a("b.csv"), a("own/a.csv")]
    );
    // `**` last: every file below.
    let everything = glob_poller(&format!("{}/{{/tenant}}/**", s(&data)), false, None);
    assert_eq!(
        sorted_keys(&poll_within(&everything, &acme, LIMIT).unwrap()),
        [a("b.csv"), a("mine/a.csv"), a("own/a.csv")]
    );
}

#[test]
fn a_symlink_cycle_under_double_star_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let acme = data.join("acme");
    write(&acme.join("y.csv"), "", 1_000);
    write(&acme.join("a/b/x.csv"), "", 1_000);
    symlink(".", acme.join("self")).unwrap();
    symlink("../..", acme.join("a/b/up")).unwrap();
    symlink("../b", acme.join("a/b/again")).unwrap();
    let input = json!({"tenant": "acme"});
    let pattern = format!("{}/{{/tenant}}/**/*.csv", s(&data));
    for follow in [FollowSymlinks::Inside, FollowSymlinks::All] {
        let poller = glob_walking(&pattern, follow, 1_000_000);
        let result = poll_within(&poller, &input, LIMIT).unwrap();
        // Each file once, under its path without a link (the cycles are left out).
        assert_eq!(
            sorted_keys(&result),
            [s(&acme.join("a/b/x.csv")), s(&acme.join("y.csv"))],
            "{follow:?}"
        );
    }
}

#[test]
fn a_directory_over_the_entry_cap_fails_the_poll() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    let acme = data.join("acme");
    for i in 0..2_000 {
        write(&acme.join(format!("f{i:05}.csv")), "", 1_000);
    }
    write(&acme.join("_SUCCESS"), "", 1_000);
    let input = json!({"tenant": "acme"});
    let pattern = format!("{}/{{/tenant}}/*.csv", s(&data));

    let capped = GlobPoller::new(
        GlobArgs {
            glob: Some(pattern.clone()),
            glob_done_marker: Some("_SUCCESS".into()),
            glob_max_entries: 1_000,
            ..GlobArgs::default()
        }
        .config()
        .unwrap(),
    );
    // An error, not a partial result: the marker is there, but the set cannot be final
    // when not every file was seen.
    let e = poll_within(&capped, &input, LIMIT)
        .map(|r| (r.outputs.len(), r.complete))
        .unwrap_err();
    assert_eq!(e.kind, "too_many_entries");
    assert!(!e.permanent);
    assert!(e.message.contains("WATCHBRIDGE_GLOB_MAX_ENTRIES"), "{e}");
    assert!(e.message.contains("1000"), "{e}");
    assert!(e.message.contains(&s(&acme)), "{e}");
    // The same again on the next poll, until the directory shrinks or the cap is raised.
    assert_eq!(
        poll_within(&capped, &input, LIMIT).unwrap_err().kind,
        "too_many_entries"
    );

    let enough = glob_walking(&pattern, FollowSymlinks::Inside, 2_001);
    assert_eq!(
        poll_within(&enough, &input, LIMIT).unwrap().outputs.len(),
        2_000
    );

    // A walk that would never end (a symlink graph whose paths double at each level)
    // meets the cap too.
    let dag = data.join("dag");
    for level in 0..40 {
        let dir = dag.join(format!("d{level:02}"));
        fs::create_dir_all(&dir).unwrap();
        write(&dir.join("f.csv"), "", 1_000);
        for link in ["l", "r"] {
            symlink(format!("../d{:02}", level + 1), dir.join(link)).unwrap();
        }
    }
    let poller = glob_walking(
        &format!("{}/{{/tenant}}/**/*.csv", s(&data)),
        FollowSymlinks::Inside,
        10_000,
    );
    let e = poll_within(&poller, &json!({"tenant": "dag"}), LIMIT).unwrap_err();
    assert_eq!(e.kind, "too_many_entries", "{e}");

    // The sharded poller has its own cap.
    let sharded = ShardedPoller::new(
        ShardedArgs {
            sharded_pattern: Some(format!("{}/{{/job}}/*", s(&data))),
            sharded_max_entries: 10,
            ..ShardedArgs::default()
        }
        .config()
        .unwrap(),
    );
    let e = poll_within(&sharded, &json!({"job": "acme"}), LIMIT).unwrap_err();
    assert_eq!(e.kind, "too_many_entries");
    assert!(e.message.contains("WATCHBRIDGE_SHARDED_MAX_ENTRIES"), "{e}");
}

#[test]
fn a_timed_out_walk_stops_and_shutdown_does_not_wait_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = root(&tmp);
    // Paths double at each of 40 levels: a walk that would take forever.
    let dag = data.join("dag");
    for level in 0..40 {
        let dir = dag.join(format!("d{level:02}"));
        fs::create_dir_all(&dir).unwrap();
        for link in ["l", "r"] {
            symlink(format!("../d{:02}", level + 1), dir.join(link)).unwrap();
        }
    }
    write(&data.join("small/a.csv"), "", 1_000);
    let pattern = format!("{}/{{/tenant}}/**/*.csv", s(&data));
    let poller = glob_walking(&pattern, FollowSymlinks::Inside, u64::MAX);

    // One blocking thread: while the timed-out walk holds it, no other poll can run.
    let rt = runtime(1);
    let slow = Arc::new(poller.resolve(&json!({"tenant": "dag"}), b"k").unwrap());
    let timed_out = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(200), poller.poll(slow)).await
    });
    assert!(
        timed_out.is_err(),
        "the walk was expected to outlive its poll"
    );

    let small = Arc::new(poller.resolve(&json!({"tenant": "small"}), b"k").unwrap());
    let next = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), poller.poll(small)).await });
    let Ok(next) = next else {
        rt.shutdown_background();
        panic!("the timed-out walk still holds the blocking thread 5 s after its poll ended");
    };
    assert_eq!(keys(&next.unwrap()), [s(&data.join("small/a.csv"))]);

    // A runtime shut down with a walk running (timed out again) does not wait for it.
    let slow = Arc::new(poller.resolve(&json!({"tenant": "dag"}), b"k").unwrap());
    let _ = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(200), poller.poll(slow)).await
    });
    let (done, dropped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(rt); // waits for blocking tasks, as a process's runtime does at its end
        let _ = done.send(());
    });
    dropped
        .recv_timeout(Duration::from_secs(5))
        .expect("dropping the runtime waited more than 5 s for a walk");
}
