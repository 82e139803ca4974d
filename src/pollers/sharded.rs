//! The sharded-files poller (`WATCHBRIDGE_POLLER=sharded`): the shards of one output written
//! as `PREFIX-SSSSS-of-NNNNN[SUFFIX]` (Beam's and Hadoop's naming), found by a path pattern
//! derived from the input, e.g. `/out/{/job}/part-*-of-*`. Each shard file is one output;
//! the watermark is the modification time of the last shard before the first missing one;
//! the set is final once all N shards exist. See `docs/pollers/sharded.md`.
//!
//! Shard numbers start at 0 or 1 (`WATCHBRIDGE_SHARDED_FIRST_SHARD`). With `auto`, a shard
//! numbered 0 means 0-based and a shard numbered N (the count) means 1-based; while neither
//! has been seen the numbering is taken as 1-based. That guess only matters for the
//! watermark: completeness needs N distinct numbers, which a 0-based set reaches only with
//! shard 0 and a 1-based one only with shard N, so a finished set is never misjudged.

use super::files::{self, FileInfo};
use super::template::{RenderError, Template};
use super::{ConfigError, Resolve};
use crate::clock::Millis;
use crate::poll::{Output, PollError, PollResult, Poller};
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use super::files::{FollowSymlinks, GlobTarget, WalkLimits, DEFAULT_MAX_ENTRIES};

const VAR_PATTERN: &str = "WATCHBRIDGE_SHARDED_PATTERN";
const VAR_FIRST_SHARD: &str = "WATCHBRIDGE_SHARDED_FIRST_SHARD";
const VAR_MAX_ENTRIES: &str = "WATCHBRIDGE_SHARDED_MAX_ENTRIES";

/// Settings of the sharded-files poller.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ShardedArgs {
    /// Path pattern of the shard files, an absolute glob with `{/json/pointer}` and `{key}`
    /// placeholders filled from the input record, e.g. `/out/{/job}/part-*-of-*`. Each
    /// substituted value must be one path segment and matches only itself. Matched files
    /// whose names do not end in `-SSSSS-of-NNNNN` (plus an optional suffix) are ignored.
    #[arg(
        long,
        env = "WATCHBRIDGE_SHARDED_PATTERN",
        value_name = "WATCHBRIDGE_SHARDED_PATTERN"
    )]
    pub sharded_pattern: Option<String>,

    /// Number of the first shard: `0` (Beam, Hadoop: `00000-of-00010` .. `00009-of-00010`),
    /// `1` (`1-of-10` .. `10-of-10`) or `auto` (0-based once a shard 0 is seen, 1-based
    /// once a shard N is seen, 1-based until then).
    #[arg(
        long,
        env = "WATCHBRIDGE_SHARDED_FIRST_SHARD",
        value_name = "WATCHBRIDGE_SHARDED_FIRST_SHARD",
        default_value = "auto"
    )]
    pub sharded_first_shard: String,

    /// Which symbolic links a listing follows: `inside` (those whose target is inside the
    /// watched directory, the pattern's literal prefix), `all`, or `never`. Cycles are
    /// always detected and left out.
    #[arg(
        long,
        env = "WATCHBRIDGE_SHARDED_FOLLOW_SYMLINKS",
        value_name = "WATCHBRIDGE_SHARDED_FOLLOW_SYMLINKS",
        value_enum,
        default_value_t = FollowSymlinks::Inside
    )]
    pub sharded_follow_symlinks: FollowSymlinks,

    /// Most directory entries one poll looks at; a poll that would look at more fails
    /// (transient error `too_many_entries`) without outputs.
    #[arg(
        long,
        env = "WATCHBRIDGE_SHARDED_MAX_ENTRIES",
        value_name = "WATCHBRIDGE_SHARDED_MAX_ENTRIES",
        default_value_t = DEFAULT_MAX_ENTRIES,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub sharded_max_entries: u64,
}

impl Default for ShardedArgs {
    fn default() -> Self {
        Self {
            sharded_pattern: None,
            sharded_first_shard: "auto".into(),
            sharded_follow_symlinks: FollowSymlinks::Inside,
            sharded_max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// Where shard numbers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstShard {
    /// Decide from the shards present; see the module docs.
    Auto,
    Zero,
    One,
}

/// The sharded-files poller's checked settings.
#[derive(Debug, Clone)]
pub struct ShardedConfig {
    pattern: Template,
    first_shard: FirstShard,
    walk: WalkLimits,
}

impl ShardedConfig {
    pub fn pattern(&self) -> &Template {
        &self.pattern
    }

    pub fn first_shard(&self) -> FirstShard {
        self.first_shard
    }

    pub fn walk(&self) -> WalkLimits {
        self.walk
    }
}

impl ShardedArgs {
    /// Check the settings. Every error names its variable.
    pub fn config(&self) -> Result<ShardedConfig, ConfigError> {
        let pattern =
            files::pattern_template(VAR_PATTERN, "sharded", self.sharded_pattern.as_deref())?;
        let first_shard = match self.sharded_first_shard.trim() {
            "auto" | "" => FirstShard::Auto,
            "0" => FirstShard::Zero,
            "1" => FirstShard::One,
            other => {
                return Err(ConfigError::new(
                    VAR_FIRST_SHARD,
                    format!("`{other}` is not one of `auto`, `0` or `1`"),
                ))
            }
        };
        Ok(ShardedConfig {
            pattern,
            first_shard,
            walk: WalkLimits {
                follow: self.sharded_follow_symlinks,
                max_entries: self.sharded_max_entries.max(1),
                max_entries_var: VAR_MAX_ENTRIES,
            },
        })
    }
}

/// Watches the shards of one output; see the module docs.
#[derive(Debug, Clone)]
pub struct ShardedPoller {
    config: Arc<ShardedConfig>,
}

impl ShardedPoller {
    pub fn new(config: ShardedConfig) -> Self {
        Self {
            config: Arc::new(config),
        }
    }
}

impl Resolve for ShardedPoller {
    fn resolve(&self, value: &Value, key: &[u8]) -> Result<GlobTarget, RenderError> {
        files::resolve(&self.config.pattern, value, key)
    }
}

impl Poller for ShardedPoller {
    type Input = GlobTarget;

    fn poll(
        &self,
        input: Arc<GlobTarget>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let config = Arc::clone(&self.config);
        files::blocking(move |cancel| poll_blocking(&config, &input, cancel))
    }
}

/// One shard file.
#[derive(Debug)]
struct Shard {
    index: u64,
    of: u64,
    file: FileInfo,
}

fn poll_blocking(
    config: &ShardedConfig,
    target: &GlobTarget,
    cancel: &AtomicBool,
) -> Result<PollResult, PollError> {
    if files::watched_dir(&target.dir)?.is_none() {
        return Ok(PollResult::incomplete(Vec::new()));
    }
    let mut shards = Vec::new();
    for file in files::list(target, None, &config.walk, cancel)? {
        let parsed = file
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_shard_name);
        match parsed {
            Some((index, of)) => shards.push(Shard { index, of, file }),
            None => tracing::debug!(
                path = %crate::pollers::files::shown_path(&file.path),
                "matched file is not named PREFIX-SSSSS-of-NNNNN; ignored"
            ),
        }
    }
    let progress = assess(&shards, config.first_shard)?;
    let outputs = shards.iter().map(output).collect();
    Ok(PollResult {
        outputs,
        watermark: progress.watermark,
        complete: progress.complete,
        host_wait: None,
    })
}

fn output(shard: &Shard) -> Output {
    let mut value = shard.file.json();
    value.insert("shard".into(), shard.index.into());
    value.insert("of".into(), shard.of.into());
    let value = serde_json::to_vec(&Value::Object(value)).unwrap_or_default();
    Output::new(shard.file.path_bytes(), value, shard.file.modified_ms())
}

/// `(shard, count)` from the last `-<digits>-of-<digits>` in a file name; anything may
/// precede it and a suffix (`.avro`) may follow.
fn parse_shard_name(name: &str) -> Option<(u64, u64)> {
    name.rmatch_indices("-of-").find_map(|(at, _)| {
        let before = &name[..at];
        let index_at = before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if index_at == before.len() || !before[..index_at].ends_with('-') {
            return None;
        }
        let after = &name[at + "-of-".len()..];
        let count_len = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if count_len == 0 {
            return None;
        }
        let index = before[index_at..].parse().ok()?;
        let of = after[..count_len].parse().ok()?;
        Some((index, of))
    })
}

/// What the shards present say about the whole set.
#[derive(Debug, PartialEq, Eq)]
struct Progress {
    watermark: Option<Millis>,
    complete: bool,
}

fn inconsistent(message: String) -> PollError {
    PollError::transient("inconsistent_shards", message)
}

fn assess(shards: &[Shard], first_shard: FirstShard) -> Result<Progress, PollError> {
    let Some(first) = shards.first() else {
        return Ok(Progress {
            watermark: None,
            complete: false,
        });
    };
    let count = first.of;
    if let Some(other) = shards.iter().find(|s| s.of != count) {
        return Err(inconsistent(format!(
            "{} is one of {count} shards but {} is one of {}",
            crate::pollers::files::shown_path(&first.file.path),
            crate::pollers::files::shown_path(&other.file.path),
            other.of
        )));
    }
    if count == 0 {
        return Err(inconsistent(format!(
            "{} says there are 0 shards",
            crate::pollers::files::shown_path(&first.file.path)
        )));
    }
    let base = match first_shard {
        FirstShard::Zero => 0,
        FirstShard::One => 1,
        FirstShard::Auto => {
            let zero = shards.iter().find(|s| s.index == 0);
            let last = shards.iter().find(|s| s.index == count);
            match (zero, last) {
                (Some(zero), Some(last)) => {
                    return Err(inconsistent(format!(
                        "both shard 0 ({}) and shard {count} ({}) of {count} exist: neither \
                         0-based nor 1-based numbering fits",
                        crate::pollers::files::shown_path(&zero.file.path),
                        crate::pollers::files::shown_path(&last.file.path)
                    )))
                }
                (Some(_), None) => 0,
                (None, _) => 1,
            }
        }
    };
    let end = base + count - 1;
    if let Some(out) = shards.iter().find(|s| s.index < base || s.index > end) {
        return Err(inconsistent(format!(
            "{} is shard {}, outside {base}..={end} (shards of {count} numbered from {base}; \
             see {VAR_FIRST_SHARD})",
            crate::pollers::files::shown_path(&out.file.path),
            out.index
        )));
    }
    // A shard number matched by several files (e.g. two suffixes) counts once, at the
    // latest of their times.
    let mut times: BTreeMap<u64, Millis> = BTreeMap::new();
    for s in shards {
        let t = s.file.modified_ms();
        times
            .entry(s.index)
            .and_modify(|m| *m = (*m).max(t))
            .or_insert(t);
    }
    let watermark = (base..=end).map_while(|i| times.get(&i).copied()).last();
    Ok(Progress {
        watermark,
        complete: times.len() as u64 == count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::{Duration, SystemTime};

    #[test]
    fn shard_names_are_the_last_index_of_count() {
        assert_eq!(parse_shard_name("part-00003-of-00010"), Some((3, 10)));
        assert_eq!(parse_shard_name("out-00000-of-00003.avro"), Some((0, 3)));
        assert_eq!(parse_shard_name("a-1-of-2-b-7-of-9.txt"), Some((7, 9)));
        // A later `-of-` that is not a shard number does not hide an earlier one.
        assert_eq!(parse_shard_name("x-2-of-4-of-y"), Some((2, 4)));
        assert_eq!(parse_shard_name("-5-of-6"), Some((5, 6)));
        for not_a_shard in [
            "part-00003",
            "00003-of-00010",
            "part-x-of-10",
            "part-3-of-",
            "part-3-of-x",
            "part3-of-10",
            "part-99999999999999999999-of-1",
            "",
        ] {
            assert_eq!(parse_shard_name(not_a_shard), None, "{not_a_shard}");
        }
    }

    fn shards(list: &[(u64, u64, i64)]) -> Vec<Shard> {
        list.iter()
            .map(|&(index, of, ms)| Shard {
                index,
                of,
                file: FileInfo {
                    path: PathBuf::from(format!("/o/p-{index}-of-{of}-{ms}")),
                    size: 0,
                    modified: SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64),
                },
            })
            .collect()
    }

    fn progress(watermark: Option<Millis>, complete: bool) -> Progress {
        Progress {
            watermark,
            complete,
        }
    }

    #[test]
    fn watermark_stops_at_the_first_gap_and_all_shards_complete() {
        let s = shards(&[
            (1, 10, 100),
            (2, 10, 300),
            (3, 10, 200),
            (7, 10, 50),
            (8, 10, 60),
        ]);
        for first in [FirstShard::Auto, FirstShard::One] {
            assert_eq!(assess(&s, first).unwrap(), progress(Some(200), false));
        }
        // 0-based, shard 0 missing: no watermark.
        assert_eq!(assess(&s, FirstShard::Zero).unwrap(), progress(None, false));
        assert_eq!(
            assess(&[], FirstShard::Auto).unwrap(),
            progress(None, false)
        );

        let all: Vec<_> = (1..=3).map(|i| (i, 3, i as i64 * 10)).collect();
        assert_eq!(
            assess(&shards(&all), FirstShard::Auto).unwrap(),
            progress(Some(30), true)
        );
        let zero_based = shards(&[(0, 3, 5), (1, 3, 6), (2, 3, 7)]);
        for first in [FirstShard::Auto, FirstShard::Zero] {
            assert_eq!(assess(&zero_based, first).unwrap(), progress(Some(7), true));
        }
        // Auto before shard 0 or N shows up: 1-based, but never complete.
        let partial = shards(&[(1, 3, 6), (2, 3, 7)]);
        assert_eq!(
            assess(&partial, FirstShard::Auto).unwrap(),
            progress(Some(7), false)
        );
        // Duplicate numbers count once, at their latest time.
        let dup = shards(&[(1, 2, 6), (1, 2, 9), (2, 2, 3)]);
        assert_eq!(
            assess(&dup, FirstShard::Auto).unwrap(),
            progress(Some(3), true)
        );
        let dup = shards(&[(1, 2, 6), (1, 2, 9)]);
        assert_eq!(
            assess(&dup, FirstShard::Auto).unwrap(),
            progress(Some(9), false)
        );
    }

    #[test]
    fn shards_that_cannot_belong_together_are_an_error() {
        let err = |list: &[(u64, u64, i64)], first| assess(&shards(list), first).unwrap_err();
        let e = err(&[(1, 3, 0), (2, 4, 0)], FirstShard::Auto);
        assert_eq!(e.kind, "inconsistent_shards");
        assert!(!e.permanent);
        assert!(
            e.message.contains("/o/p-1-of-3-0") && e.message.contains("/o/p-2-of-4-0"),
            "{e}"
        );
        let e = err(&[(0, 3, 0), (3, 3, 0)], FirstShard::Auto);
        assert!(e.message.contains("neither"), "{e}");
        let e = err(&[(3, 3, 0)], FirstShard::Zero);
        assert!(e.message.contains("outside 0..=2"), "{e}");
        let e = err(&[(0, 3, 0)], FirstShard::One);
        assert!(e.message.contains("outside 1..=3"), "{e}");
        let e = err(&[(5, 3, 0)], FirstShard::Auto);
        assert!(e.message.contains("is shard 5, outside 1..=3"), "{e}");
        let e = err(&[(0, 0, 0)], FirstShard::Auto);
        assert!(e.message.contains("0 shards"), "{e}");
    }

    #[test]
    fn first_shard_setting_is_checked() {
        let args = |first: &str| ShardedArgs {
            sharded_pattern: Some("/out/{/job}/part-*-of-*".into()),
            sharded_first_shard: first.into(),
            ..ShardedArgs::default()
        };
        assert_eq!(
            args("auto").config().unwrap().first_shard(),
            FirstShard::Auto
        );
        assert_eq!(args("0").config().unwrap().first_shard(), FirstShard::Zero);
        assert_eq!(args("1").config().unwrap().first_shard(), FirstShard::One);
        let e = args("2").config().unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_SHARDED_FIRST_SHARD");
        let e = ShardedArgs::default().config().unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_SHARDED_PATTERN");
        assert!(e.message.contains("WATCHBRIDGE_POLLER=sharded"), "{e}");
    }
}
