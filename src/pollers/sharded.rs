//! The sharded-files poller (`WATCHBRIDGE_POLLER=sharded`): the shards of one output written
//! as `PREFIX-SSSSS-of-NNNNN[SUFFIX]` (Beam's and Hadoop's naming), found by a path pattern
//! derived from the input, e.g. `/out/{/job}/part-*-of-*`. Each shard file is one output;
//! the watermark is the modification time of the last shard before the first missing one;
//! the set is final once all N shards exist. See `docs/pollers/sharded.md`.
//!
//! Shard numbers start at 0 or 1 (`WATCHBRIDGE_SHARDED_FIRST_SHARD`); the names, the
//! numbering and the watermark are [`super::shards`]'s, which the object-store poller
//! shares.

use super::files::{self, FileInfo};
pub use super::shards::FirstShard;
use super::shards::{self, parse_shard_name};
use super::template::{RenderError, Template};
use super::{ConfigError, Resolve};
use crate::poll::{Output, PollError, PollResult, Poller};
use serde_json::Value;
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

    /// Emit a rewritten shard again: its modification time is its version (header
    /// `watchbridge-item-version`; by default a shard's path is emitted once).
    #[arg(
        long,
        env = "WATCHBRIDGE_SHARDED_MATCH_UPDATED", value_name = "WATCHBRIDGE_SHARDED_MATCH_UPDATED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub sharded_match_updated: bool,
}

impl Default for ShardedArgs {
    fn default() -> Self {
        Self {
            sharded_pattern: None,
            sharded_first_shard: "auto".into(),
            sharded_follow_symlinks: FollowSymlinks::Inside,
            sharded_max_entries: DEFAULT_MAX_ENTRIES,
            sharded_match_updated: false,
        }
    }
}

/// The sharded-files poller's checked settings.
#[derive(Debug, Clone)]
pub struct ShardedConfig {
    pattern: Template,
    first_shard: FirstShard,
    walk: WalkLimits,
    match_updated: bool,
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
        let first_shard = FirstShard::parse(VAR_FIRST_SHARD, &self.sharded_first_shard)?;
        Ok(ShardedConfig {
            pattern,
            first_shard,
            walk: WalkLimits {
                follow: self.sharded_follow_symlinks,
                max_entries: self.sharded_max_entries.max(1),
                max_entries_var: VAR_MAX_ENTRIES,
            },
            match_updated: self.sharded_match_updated,
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
    shard: shards::Shard,
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
            Some((index, of)) => shards.push(Shard {
                shard: shards::Shard {
                    index,
                    of,
                    time: file.modified_ms(),
                    name: crate::pollers::files::shown_path(&file.path),
                },
                file,
            }),
            None => tracing::debug!(
                path = %crate::pollers::files::shown_path(&file.path),
                "matched file is not named PREFIX-SSSSS-of-NNNNN; ignored"
            ),
        }
    }
    let found: Vec<shards::Shard> = shards.iter().map(|s| s.shard.clone()).collect();
    let progress = shards::assess(&found, config.first_shard, VAR_FIRST_SHARD)?;
    let outputs = shards
        .iter()
        .map(|s| output(s, config.match_updated))
        .collect();
    Ok(PollResult {
        outputs,
        watermark: progress.watermark,
        complete: progress.complete,
        host_wait: None,
    })
}

/// A shard's output; with `match_updated`, its modification time (ns) is its version.
fn output(shard: &Shard, match_updated: bool) -> Output {
    let mut value = shard.file.json();
    value.insert("shard".into(), shard.shard.index.into());
    value.insert("of".into(), shard.shard.of.into());
    let value = serde_json::to_vec(&Value::Object(value)).unwrap_or_default();
    let output = Output::new(shard.file.path_bytes(), value, shard.file.modified_ms());
    match match_updated {
        true => output.with_version(shard.file.modified_ns().to_string()),
        false => output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
