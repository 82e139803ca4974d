//! The glob poller (`WATCHBRIDGE_POLLER=glob`): the regular files matching a path pattern
//! derived from the input, e.g. `/data/{/tenant}/*.csv`. Each file is one output, keyed by
//! its path (or by path and modification time, so a rewritten file is new again). The set is
//! final once a done-marker file appears in the watched directory, or once that directory is
//! made read-only. See `docs/pollers/glob.md`.

use super::files::{self, FileInfo};
use super::template::{RenderError, Template};
use super::{ConfigError, Resolve};
use crate::poll::{Output, PollError, PollResult, Poller};
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use super::files::{FollowSymlinks, GlobTarget, WalkLimits, DEFAULT_MAX_ENTRIES};

const VAR_GLOB: &str = "WATCHBRIDGE_GLOB";
const VAR_DONE_MARKER: &str = "WATCHBRIDGE_GLOB_DONE_MARKER";
const VAR_MAX_ENTRIES: &str = "WATCHBRIDGE_GLOB_MAX_ENTRIES";

/// Settings of the glob poller.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct GlobArgs {
    /// Path pattern of the files to watch, an absolute glob with `{/json/pointer}` and `{key}`
    /// placeholders filled from the input record, e.g. `/data/{/tenant}/*.csv`. Each
    /// substituted value must be one path segment and matches only itself.
    #[arg(long, env = "WATCHBRIDGE_GLOB", value_name = "WATCHBRIDGE_GLOB")]
    pub glob: Option<String>,

    /// Key each file by its path and modification time, so a rewritten file is emitted
    /// again (by default a path is emitted once).
    #[arg(
        long,
        env = "WATCHBRIDGE_GLOB_MATCH_UPDATED", value_name = "WATCHBRIDGE_GLOB_MATCH_UPDATED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub glob_match_updated: bool,

    /// Name of a file whose presence in the watched directory makes the set of files final
    /// (e.g. `_SUCCESS`). A file name, not a path. The marker itself is not an output.
    #[arg(
        long,
        env = "WATCHBRIDGE_GLOB_DONE_MARKER",
        value_name = "WATCHBRIDGE_GLOB_DONE_MARKER"
    )]
    pub glob_done_marker: Option<String>,

    /// Which symbolic links a listing follows: `inside` (those whose target is inside the
    /// watched directory, the pattern's literal prefix), `all`, or `never`. Cycles are
    /// always detected and left out.
    #[arg(
        long,
        env = "WATCHBRIDGE_GLOB_FOLLOW_SYMLINKS",
        value_name = "WATCHBRIDGE_GLOB_FOLLOW_SYMLINKS",
        value_enum,
        default_value_t = FollowSymlinks::Inside
    )]
    pub glob_follow_symlinks: FollowSymlinks,

    /// Most directory entries one poll looks at; a poll that would look at more fails
    /// (transient error `too_many_entries`) without outputs.
    #[arg(
        long,
        env = "WATCHBRIDGE_GLOB_MAX_ENTRIES",
        value_name = "WATCHBRIDGE_GLOB_MAX_ENTRIES",
        default_value_t = DEFAULT_MAX_ENTRIES,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub glob_max_entries: u64,
}

impl Default for GlobArgs {
    fn default() -> Self {
        Self {
            glob: None,
            glob_match_updated: false,
            glob_done_marker: None,
            glob_follow_symlinks: FollowSymlinks::Inside,
            glob_max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// The glob poller's checked settings.
#[derive(Debug, Clone)]
pub struct GlobConfig {
    pattern: Template,
    match_updated: bool,
    done_marker: Option<String>,
    walk: WalkLimits,
}

impl GlobConfig {
    pub fn pattern(&self) -> &Template {
        &self.pattern
    }

    pub fn match_updated(&self) -> bool {
        self.match_updated
    }

    pub fn done_marker(&self) -> Option<&str> {
        self.done_marker.as_deref()
    }

    pub fn walk(&self) -> WalkLimits {
        self.walk
    }
}

impl GlobArgs {
    /// Check the settings. Every error names its variable.
    pub fn config(&self) -> Result<GlobConfig, ConfigError> {
        let pattern = files::pattern_template(VAR_GLOB, "glob", self.glob.as_deref())?;
        let done_marker = match self.glob_done_marker.as_deref() {
            None | Some("") => None,
            Some(name) => {
                let problem = if name == "." || name == ".." {
                    Some("is `.` or `..`")
                } else if name.contains('/') {
                    Some("contains `/`")
                } else if name.contains('\0') {
                    Some("contains NUL")
                } else {
                    None
                };
                if let Some(problem) = problem {
                    return Err(ConfigError::new(
                        VAR_DONE_MARKER,
                        format!(
                            "`{name}` {problem}: it must be a file name in the watched \
                             directory, such as _SUCCESS"
                        ),
                    ));
                }
                Some(name.to_string())
            }
        };
        Ok(GlobConfig {
            pattern,
            match_updated: self.glob_match_updated,
            done_marker,
            walk: WalkLimits {
                follow: self.glob_follow_symlinks,
                max_entries: self.glob_max_entries.max(1),
                max_entries_var: VAR_MAX_ENTRIES,
            },
        })
    }
}

/// Watches the files matching a pattern; see the module docs.
#[derive(Debug, Clone)]
pub struct GlobPoller {
    config: Arc<GlobConfig>,
}

impl GlobPoller {
    pub fn new(config: GlobConfig) -> Self {
        Self {
            config: Arc::new(config),
        }
    }
}

impl Resolve for GlobPoller {
    fn resolve(&self, value: &Value, key: &[u8]) -> Result<GlobTarget, RenderError> {
        files::resolve(&self.config.pattern, value, key)
    }
}

impl Poller for GlobPoller {
    type Input = GlobTarget;

    fn poll(
        &self,
        input: Arc<GlobTarget>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let config = Arc::clone(&self.config);
        files::blocking(move |cancel| poll_blocking(&config, &input, cancel))
    }
}

fn poll_blocking(
    config: &GlobConfig,
    target: &GlobTarget,
    cancel: &AtomicBool,
) -> Result<PollResult, PollError> {
    let Some(dir) = files::watched_dir(&target.dir)? else {
        return Ok(PollResult::incomplete(Vec::new()));
    };
    let marker = config.done_marker.as_ref().map(|m| target.dir.join(m));
    // Decide finality before listing: whatever was written before the marker appeared (or
    // the directory was locked) is then in this listing. Listing first could miss a file
    // written between the listing and the check.
    let complete = files::is_read_only(&dir)
        || match &marker {
            Some(marker) => files::exists(marker)?,
            None => false,
        };
    let outputs = files::list(target, marker.as_deref(), &config.walk, cancel)?
        .iter()
        .map(|f| output(f, config.match_updated))
        .collect();
    Ok(PollResult {
        outputs,
        watermark: None,
        complete,
        host_wait: None,
    })
}

fn output(file: &FileInfo, match_updated: bool) -> Output {
    let mut key = file.path_bytes();
    if match_updated {
        key.extend_from_slice(format!("@{}", file.modified_ns()).as_bytes());
    }
    let value = serde_json::to_vec(&Value::Object(file.json())).unwrap_or_default();
    Output::new(key, value, file.modified_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        glob: GlobArgs,
    }

    #[test]
    fn flags_parse_with_and_without_values() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.glob)
        };
        let a = parse(&["--glob", "/d/*", "--glob-match-updated"]).unwrap();
        assert!(a.glob_match_updated);
        assert_eq!(a.glob.as_deref(), Some("/d/*"));
        for (text, expected) in [("true", true), ("false", false), ("1", true), ("no", false)] {
            let a = parse(&["--glob-match-updated", text]).unwrap();
            assert_eq!(a.glob_match_updated, expected, "{text}");
        }
        assert!(!parse(&[]).unwrap().glob_match_updated);
        assert!(parse(&["--glob-match-updated", "maybe"]).is_err());
        let a = parse(&["--glob-done-marker", "_SUCCESS"]).unwrap();
        assert_eq!(a.glob_done_marker.as_deref(), Some("_SUCCESS"));
    }

    #[test]
    fn done_marker_must_be_a_file_name() {
        let args = |marker: &str| GlobArgs {
            glob: Some("/data/*".into()),
            glob_match_updated: false,
            glob_done_marker: Some(marker.into()),
            ..GlobArgs::default()
        };
        for bad in ["a/b", "/abs", ".", "..", "x\0y"] {
            let e = args(bad).config().unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_GLOB_DONE_MARKER", "{bad:?}");
            assert!(
                e.to_string().starts_with("WATCHBRIDGE_GLOB_DONE_MARKER: "),
                "{e}"
            );
        }
        let c = args("_SUCCESS").config().unwrap();
        assert_eq!(c.done_marker(), Some("_SUCCESS"));
        assert_eq!(args("").config().unwrap().done_marker(), None);
    }
}
