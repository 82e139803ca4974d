//! What the file pollers ([`glob`](super::glob), [`sharded`](super::sharded)) share: turning
//! an input into a pattern and its watched directory, listing the matching files off the
//! async runtime, and describing each file as an output value.

use super::event_time::{format_rfc3339, from_system_time};
use super::template::{RenderError, Template, TemplateError, NAME_MAX, PATH_MAX};
use super::ConfigError;
use crate::clock::Millis;
use crate::poll::PollError;
use serde_json::{json, Map, Value};
use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Which symbolic links a listing follows.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FollowSymlinks {
    /// Only links whose target (fully resolved) is inside the watched directory.
    #[default]
    Inside,
    /// Every link, wherever it leads (cycles are still detected and left out).
    All,
    /// No link: symbolic links are left out.
    Never,
}

/// The default of `WATCHBRIDGE_GLOB_MAX_ENTRIES` and `WATCHBRIDGE_SHARDED_MAX_ENTRIES`.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// What bounds one poll's walk of the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkLimits {
    /// Which symbolic links a walk follows.
    pub follow: FollowSymlinks,
    /// Most directory entries one poll looks at; past it the poll fails (`too_many_entries`).
    pub max_entries: u64,
    /// The variable that sets `max_entries`, for the error message.
    pub max_entries_var: &'static str,
}

/// What one watch of a file poller looks at, derived from its input record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobTarget {
    /// The glob pattern, with every substituted value escaped to match only itself.
    pub pattern: String,
    /// The watched directory: the longest prefix of `pattern` made of whole path segments
    /// without a glob metacharacter (substituted values count as literal), e.g. `/data/a*`
    /// for `/data/{/tenant}/*.csv` and tenant `a*`.
    pub dir: PathBuf,
}

/// Parse a pattern template from the variable `var`: it must be a valid template, absolute,
/// and (with its placeholders filled) a valid glob pattern.
pub(crate) fn pattern_template(
    var: &'static str,
    poller: &str,
    text: Option<&str>,
) -> Result<Template, ConfigError> {
    let text = text.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
        ConfigError::new(
            var,
            format!(
                "is required when WATCHBRIDGE_POLLER={poller} (a path pattern such as \
                 /data/{{/tenant}}/*.csv)"
            ),
        )
    })?;
    let template =
        Template::parse(text).map_err(|e: TemplateError| ConfigError::new(var, e.to_string()))?;
    if !text.starts_with('/') {
        return Err(ConfigError::new(
            var,
            format!("`{text}` must be an absolute path (start with `/`)"),
        ));
    }
    if let Some((field, _)) = template.last_placeholders().first() {
        return Err(ConfigError::new(
            var,
            format!(
                "`{{{}}}` is for the HTTP poller's URL (incremental requests); a path pattern takes `{{key}}` and JSON pointers",
                field.name()
            ),
        ));
    }
    if let Err(e) = glob::Pattern::new(&template.with_placeholders_as("x")) {
        return Err(ConfigError::new(
            var,
            format!("`{text}` is not a valid glob pattern: {e}"),
        ));
    }
    Ok(template)
}

/// Fill the pattern template for one input.
pub(crate) fn resolve(
    template: &Template,
    value: &Value,
    key: &[u8],
) -> Result<GlobTarget, RenderError> {
    let (pattern, dir) = template.render_glob_dir(value, key)?;
    check_path_lengths(&dir)?;
    Ok(GlobTarget {
        pattern,
        dir: PathBuf::from(dir),
    })
}

/// The watched directory must be a path the kernel takes: every segment at most
/// [`NAME_MAX`] bytes, the whole under [`PATH_MAX`]. A longer one can only come from the
/// input (the template's own text is checked at start with short values), so it is refused
/// here and the input dead-lettered, rather than failing every poll with `ENAMETOOLONG`.
fn check_path_lengths(dir: &str) -> Result<(), RenderError> {
    if let Some(segment) = dir.split('/').find(|s| s.len() > NAME_MAX) {
        return Err(RenderError::Unusable(format!(
            "the watched directory has a segment longer than {NAME_MAX} bytes, the longest file name (NAME_MAX): `{}…`",
            segment.chars().take(40).collect::<String>()
        )));
    }
    if dir.len() >= PATH_MAX {
        return Err(RenderError::Unusable(format!(
            "the watched directory is longer than {} bytes, the longest path (PATH_MAX): `{}…`",
            PATH_MAX - 1,
            dir.chars().take(40).collect::<String>()
        )));
    }
    Ok(())
}

/// Run filesystem work on tokio's blocking pool. A panic there is a failed poll, not a crash.
///
/// `work` is handed a flag that is raised when this future is dropped: a poll that timed out
/// or was abandoned at shutdown. A walk checks it at every entry and stops, so it never
/// outlives its poll by more than one filesystem call.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce(&AtomicBool) -> Result<T, PollError> + Send + 'static,
) -> Result<T, PollError> {
    let cancel = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(Arc::clone(&cancel));
    match tokio::task::spawn_blocking(move || work(&cancel)).await {
        Ok(result) => result,
        Err(e) => Err(PollError::transient(
            "panic",
            format!("file listing task failed: {e}"),
        )),
    }
}

/// Raises its flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A path for a message or log line: file names are outside content (whoever writes the
/// directory chooses them), so escaped and bounded ([`crate::logging::outside`]).
pub(crate) fn shown_path(path: &Path) -> String {
    crate::logging::outside(&path.to_string_lossy()).to_string()
}

/// An IO failure on `path`, as a transient poll error; a name or path too long
/// (`ENAMETOOLONG`) is permanent, since retrying the same name cannot help.
pub(crate) fn io_error(doing: &str, path: &Path, e: &io::Error) -> PollError {
    let message = format!("cannot {doing} {}: {e}", shown_path(path));
    if e.kind() == io::ErrorKind::InvalidFilename {
        PollError::permanent("name_too_long", message)
    } else {
        PollError::transient("io", message)
    }
}

/// The watched directory's metadata, or `None` if it does not exist (yet).
pub(crate) fn watched_dir(dir: &Path) -> Result<Option<Metadata>, PollError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(Some(m)),
        Ok(_) => Err(PollError::transient(
            "io",
            format!("{} is not a directory", shown_path(dir)),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read directory", dir, &e)),
    }
}

/// Whether the directory has been made read-only: no write bit at all in its permission
/// bits. Judged by the bits, not `access(2)`, which says "writable" to root whatever they are.
pub(crate) fn is_read_only(dir: &Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.permissions().mode() & 0o222 == 0
}

/// Whether anything exists at `path` (a symlink counts, even a dangling one).
pub(crate) fn exists(path: &Path) -> Result<bool, PollError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("check", path, &e)),
    }
}

/// A regular file that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileInfo {
    pub path: PathBuf,
    pub size: u64,
    pub modified: SystemTime,
}

impl FileInfo {
    pub fn modified_ms(&self) -> Millis {
        from_system_time(self.modified)
    }

    /// The modification time in nanoseconds since the epoch (negative before 1970).
    pub fn modified_ns(&self) -> i128 {
        match self.modified.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        }
    }

    /// The path's bytes: the output key.
    pub fn path_bytes(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        self.path.as_os_str().as_bytes().to_vec()
    }

    /// `{"path", "size", "modified" (RFC 3339, UTC), "modified_ms"}`; callers add fields.
    pub fn json(&self) -> Map<String, Value> {
        let ms = self.modified_ms();
        let value = json!({
            "path": self.path.to_string_lossy(),
            "size": self.size,
            "modified": format_rfc3339(ms),
            "modified_ms": ms,
        });
        match value {
            Value::Object(map) => map,
            _ => unreachable!("json! of an object literal is an object"),
        }
    }
}

/// The regular files matching the target's pattern, except `skip`, in the order of a
/// depth-first walk with each directory's names sorted.
///
/// The walk starts at the watched directory (`target.dir`; symbolic links on the way to it
/// are followed: they are the operator's layout) and goes down one pattern segment at a
/// time: a literal segment is looked up, a wildcard segment lists its directory, and `**`
/// walks everything below with [`walkdir`], whose loop detection leaves out a link back to
/// a directory it is already in. Symbolic links below the watched directory are followed as
/// `limits.follow` says (by default only those that resolve inside it). Every entry looked at
/// counts towards `limits.max_entries`; past it the poll fails (`too_many_entries`), as it
/// does (`cancelled`) once `cancel` is raised.
///
/// Directories are left out, and so are broken links and files that vanish mid-walk; a
/// directory that cannot be read is an error naming it.
pub(crate) fn list(
    target: &GlobTarget,
    skip: Option<&Path>,
    limits: &WalkLimits,
    cancel: &AtomicBool,
) -> Result<Vec<FileInfo>, PollError> {
    let segments = segments(&target.pattern, &target.dir)?;
    let root = match std::fs::canonicalize(&target.dir) {
        Ok(root) => root,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("resolve", &target.dir, &e)),
    };
    let mut walk = Walk {
        root,
        shown_root: &target.dir,
        limits,
        cancel,
        skip,
        walked: 0,
        files: Vec::new(),
    };
    walk.segments(&target.dir, &segments)?;
    Ok(walk.files)
}

/// One segment of the pattern below the watched directory.
#[derive(Debug)]
enum Segment {
    /// Matches only this name (glob escapes undone).
    Literal(String),
    /// Matches names in one directory.
    Glob(glob::Pattern),
    /// `**` and every segment after it, matched against paths relative to where it starts.
    Recursive(glob::Pattern),
}

fn bad_pattern(pattern: &str, e: impl std::fmt::Display) -> PollError {
    PollError::permanent("pattern", format!("`{pattern}` is not a glob pattern: {e}"))
}

/// The pattern's segments below `dir`, its literal prefix.
fn segments(pattern: &str, dir: &Path) -> Result<Vec<Segment>, PollError> {
    let skip = dir
        .to_str()
        .unwrap_or_default()
        .split('/')
        .filter(|s| !s.is_empty())
        .count();
    let rest: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty())
        .skip(skip)
        .collect();
    let mut segments = Vec::with_capacity(rest.len());
    for (i, segment) in rest.iter().enumerate() {
        if *segment == "**" {
            let tail = rest[i..].join("/");
            let tail = glob::Pattern::new(&tail).map_err(|e| bad_pattern(pattern, e))?;
            segments.push(Segment::Recursive(tail));
            break;
        }
        segments.push(match unescape(segment) {
            Some(name) => Segment::Literal(name),
            None => {
                Segment::Glob(glob::Pattern::new(segment).map_err(|e| bad_pattern(pattern, e))?)
            }
        });
    }
    Ok(segments)
}

/// The name a segment without a glob metacharacter stands for (the escapes of
/// [`glob::Pattern::escape`] undone), or `None` if it has one.
fn unescape(segment: &str) -> Option<String> {
    let mut name = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(c) = rest.chars().next() {
        if let Some(escaped) = ["[*]", "[?]", "[[]", "[]]"]
            .iter()
            .find(|e| rest.starts_with(**e))
        {
            name.push_str(&escaped[1..2]);
            rest = &rest[3..];
        } else if matches!(c, '*' | '?' | '[') {
            return None;
        } else {
            name.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    Some(name)
}

/// How names are matched: as the `glob` crate's `glob()` does (`*` matches a leading `.`),
/// with `*` never crossing a `/` (it matters for `**` patterns, matched as relative paths).
const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// One poll's walk.
struct Walk<'a> {
    /// The watched directory, resolved.
    root: PathBuf,
    /// The watched directory as the pattern names it, for messages.
    shown_root: &'a Path,
    limits: &'a WalkLimits,
    cancel: &'a AtomicBool,
    skip: Option<&'a Path>,
    walked: u64,
    files: Vec<FileInfo>,
}

impl Walk<'_> {
    /// Account for one more entry looked at.
    fn step(&mut self) -> Result<(), PollError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(PollError::transient(
                "cancelled",
                format!(
                    "the listing of {} was stopped: its poll ended (timed out, or the bridge is \
                     stopping)",
                    shown_path(self.shown_root)
                ),
            ));
        }
        self.walked += 1;
        if self.walked > self.limits.max_entries {
            return Err(PollError::transient(
                "too_many_entries",
                format!(
                    "more than {} directory entries under {} to look at ({}); narrow the \
                     pattern, clear out the directory or raise the limit",
                    self.limits.max_entries,
                    shown_path(self.shown_root),
                    self.limits.max_entries_var
                ),
            ));
        }
        Ok(())
    }

    /// Whether the walk may follow the symbolic link at `path`.
    fn may_follow(&self, path: &Path) -> bool {
        let follow = match self.limits.follow {
            FollowSymlinks::All => true,
            FollowSymlinks::Never => false,
            // A link that cannot be resolved (broken, a cycle) is left out as well.
            FollowSymlinks::Inside => {
                std::fs::canonicalize(path).is_ok_and(|target| target.starts_with(&self.root))
            }
        };
        if !follow {
            tracing::debug!(
                path = %shown_path(path),
                follow = ?self.limits.follow,
                "symbolic link not followed"
            );
        }
        follow
    }

    /// What is at `path`, a link followed where allowed; `None` to leave it out.
    fn stat(&self, path: &Path) -> Result<Option<Metadata>, PollError> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", path, &e)),
        };
        if !meta.file_type().is_symlink() {
            return Ok(Some(meta));
        }
        if !self.may_follow(path) {
            return Ok(None);
        }
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(m)),
            // Broken, or a cycle of links (ELOOP) with `all`.
            Err(_) => Ok(None),
        }
    }

    fn segments(&mut self, dir: &Path, segments: &[Segment]) -> Result<(), PollError> {
        let Some((segment, rest)) = segments.split_first() else {
            return Ok(());
        };
        match segment {
            Segment::Literal(name) => {
                self.step()?;
                self.visit(dir.join(name), rest)
            }
            Segment::Glob(pattern) => {
                for name in self.read_dir(dir)? {
                    let matches = name
                        .to_str()
                        .is_some_and(|n| pattern.matches_with(n, MATCH));
                    if matches {
                        self.visit(dir.join(name), rest)?;
                    }
                }
                Ok(())
            }
            Segment::Recursive(tail) => self.recursive(dir, tail),
        }
    }

    /// Go on at `path` with the segments after the one it matched.
    fn visit(&mut self, path: PathBuf, rest: &[Segment]) -> Result<(), PollError> {
        let Some(meta) = self.stat(&path)? else {
            return Ok(());
        };
        if rest.is_empty() {
            if meta.is_file() {
                self.found(path, &meta)?;
            }
            Ok(())
        } else if meta.is_dir() {
            self.segments(&path, rest)
        } else {
            Ok(())
        }
    }

    /// The names in `dir`, sorted; each counts as an entry looked at.
    fn read_dir(&mut self, dir: &Path) -> Result<Vec<std::ffi::OsString>, PollError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("list directory", dir, &e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            self.step()?;
            match entry {
                Ok(entry) => names.push(entry.file_name()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("list directory", dir, &e)),
            }
        }
        names.sort();
        Ok(names)
    }

    /// `**`: everything below `dir` whose path relative to it matches `tail`.
    fn recursive(&mut self, dir: &Path, tail: &glob::Pattern) -> Result<(), PollError> {
        let mut entries = walkdir::WalkDir::new(dir)
            .min_depth(1)
            .follow_links(self.limits.follow != FollowSymlinks::Never)
            .sort_by_file_name()
            .into_iter();
        while let Some(entry) = entries.next() {
            self.step()?;
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    if let Some(ancestor) = e.loop_ancestor() {
                        tracing::debug!(
                            path = %shown_path(e.path().unwrap_or(dir)),
                            ancestor = %shown_path(ancestor),
                            "symbolic link back to a directory being walked: not followed"
                        );
                        continue;
                    }
                    let path = e.path().unwrap_or(dir).to_path_buf();
                    match e.into_io_error() {
                        // Broken links, entries deleted mid-walk.
                        Some(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Some(e) => return Err(io_error("list directory", &path, &e)),
                        None => continue,
                    }
                }
            };
            if entry.path_is_symlink() && !self.may_follow(entry.path()) {
                if entry.file_type().is_dir() {
                    entries.skip_current_dir();
                }
                continue;
            }
            if !entry.file_type().is_file() {
                continue;
            }
            let relative = entry.path().strip_prefix(dir).unwrap_or(entry.path());
            if !tail.matches_path_with(relative, MATCH) {
                continue;
            }
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(_) => continue, // gone since it was listed
            };
            self.found(entry.into_path(), &meta)?;
        }
        Ok(())
    }

    fn found(&mut self, path: PathBuf, meta: &Metadata) -> Result<(), PollError> {
        if self.skip.is_some_and(|s| s == path) {
            return Ok(());
        }
        let modified = meta
            .modified()
            .map_err(|e| io_error("read the modification time of", &path, &e))?;
        self.files.push(FileInfo {
            path,
            size: meta.len(),
            modified,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pattern_templates_must_be_given_absolute_and_valid() {
        let var = "WATCHBRIDGE_X";
        let e = pattern_template(var, "glob", None).unwrap_err();
        assert_eq!(e.var, var);
        assert!(
            e.message
                .contains("is required when WATCHBRIDGE_POLLER=glob"),
            "{e}"
        );
        assert!(pattern_template(var, "glob", Some("  ")).is_err());
        let e = pattern_template(var, "glob", Some("data/*.csv")).unwrap_err();
        assert!(e.message.contains("absolute"), "{e}");
        let e = pattern_template(var, "glob", Some("{/dir}/*.csv")).unwrap_err();
        assert!(e.message.contains("absolute"), "{e}");
        let e = pattern_template(var, "glob", Some("/data/{tenant}/*")).unwrap_err();
        assert!(e.message.contains("unknown placeholder"), "{e}");
        let e = pattern_template(var, "glob", Some("/data/[a/*")).unwrap_err();
        assert!(e.message.contains("not a valid glob pattern"), "{e}");
        let e = pattern_template(var, "glob", Some("/data/a**/*")).unwrap_err();
        assert!(e.message.contains("not a valid glob pattern"), "{e}");
        assert!(pattern_template(var, "glob", Some("/data/{/t}/**/*.csv")).is_ok());
    }

    #[test]
    fn file_values_carry_path_size_and_time() {
        let f = FileInfo {
            path: PathBuf::from("/d/a.csv"),
            size: 12,
            modified: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_511_200_250),
        };
        assert_eq!(
            Value::Object(f.json()),
            json!({
                "path": "/d/a.csv",
                "size": 12,
                "modified": "2025-11-30T14:00:00.25Z",
                "modified_ms": 1_764_511_200_250_i64,
            })
        );
        assert_eq!(f.modified_ns(), 1_764_511_200_250_000_000);
        assert_eq!(f.path_bytes(), b"/d/a.csv");
        let before = FileInfo {
            modified: SystemTime::UNIX_EPOCH - Duration::from_nanos(1_500_000),
            ..f
        };
        assert_eq!(before.modified_ns(), -1_500_000);
        assert_eq!(before.modified_ms(), -1);
    }

    #[test]
    fn patterns_split_into_segments_below_the_watched_directory() {
        let kinds = |pattern: &str, dir: &str| {
            segments(pattern, Path::new(dir))
                .unwrap()
                .iter()
                .map(|s| match s {
                    Segment::Literal(name) => format!("={name}"),
                    Segment::Glob(p) => format!("~{p}"),
                    Segment::Recursive(p) => format!("**{p}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds("/data/acme/*.csv", "/data/acme"), ["~*.csv"]);
        assert_eq!(
            kinds("/data/*/a[*]b[?][[][]]/x.csv", "/data"),
            ["~*", "=a*b?[]", "=x.csv"]
        );
        assert_eq!(kinds("/data/a.csv", "/data"), ["=a.csv"]);
        assert_eq!(kinds("/*.csv", "/"), ["~*.csv"]);
        assert_eq!(
            kinds("/d/x/**/b/**/*.csv", "/d/x"),
            ["**".to_string() + "**/b/**/*.csv"]
        );
        assert_eq!(kinds("/d/x/y*/**", "/d/x"), ["~y*", "****"]);
        // `**` matches no directory as well as many, and `*` stays within a segment.
        let tail = glob::Pattern::new("**/b/**/*.csv").unwrap();
        for yes in ["b/z.csv", "a/b/z.csv", "a/b/c/d/z.csv", "b/.z.csv"] {
            assert!(tail.matches_path_with(Path::new(yes), MATCH), "{yes}");
        }
        for no in ["z.csv", "a/z.csv", "bb/z.csv"] {
            assert!(!tail.matches_path_with(Path::new(no), MATCH), "{no}");
        }
        assert!(!glob::Pattern::new("*.csv")
            .unwrap()
            .matches_path_with(Path::new("a/z.csv"), MATCH));
    }

    #[tokio::test]
    async fn a_panic_in_the_listing_is_a_transient_error() {
        let e = blocking::<()>(|_| panic!("boom")).await.unwrap_err();
        assert_eq!(e.kind, "panic");
        assert!(!e.permanent);
        assert_eq!(blocking(|_| Ok(7)).await, Ok(7));
    }

    #[test]
    fn a_watched_path_that_is_a_file_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "").unwrap();
        let e = watched_dir(&file).unwrap_err();
        assert_eq!(e.kind, "io");
        assert!(e.message.contains("not a directory"), "{e}");
        assert!(watched_dir(&tmp.path().join("missing")).unwrap().is_none());
        assert!(watched_dir(tmp.path()).unwrap().is_some());
    }
}
