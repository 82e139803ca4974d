//! What the file pollers ([`glob`](super::glob), [`sharded`](super::sharded)) share: turning
//! an input into a pattern and its watched directory, listing the matching files off the
//! async runtime, and describing each file as an output value.

use super::event_time::{format_rfc3339, from_system_time};
use super::template::{RenderError, Template, TemplateError};
use super::ConfigError;
use crate::clock::Millis;
use crate::poll::PollError;
use serde_json::{json, Map, Value};
use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

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
    Ok(GlobTarget {
        pattern,
        dir: PathBuf::from(dir),
    })
}

/// Run filesystem work on tokio's blocking pool. A panic there is a failed poll, not a crash.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PollError> + Send + 'static,
) -> Result<T, PollError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(PollError::transient(
            "panic",
            format!("file listing task failed: {e}"),
        )),
    }
}

/// An IO failure on `path`, as a transient poll error.
pub(crate) fn io_error(doing: &str, path: &Path, e: &io::Error) -> PollError {
    PollError::transient("io", format!("cannot {doing} {}: {e}", path.display()))
}

/// The watched directory's metadata, or `None` if it does not exist (yet).
pub(crate) fn watched_dir(dir: &Path) -> Result<Option<Metadata>, PollError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(Some(m)),
        Ok(_) => Err(PollError::transient(
            "io",
            format!("{} is not a directory", dir.display()),
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

/// The regular files (symlinks followed) matching `pattern`, in the glob's order, except
/// `skip`. Directories are left out; a file that vanishes between the listing and its stat
/// is left out; a directory that cannot be read is an error naming it.
pub(crate) fn list(pattern: &str, skip: Option<&Path>) -> Result<Vec<FileInfo>, PollError> {
    let paths = glob::glob(pattern).map_err(|e| {
        PollError::permanent("pattern", format!("`{pattern}` is not a glob pattern: {e}"))
    })?;
    let mut files = Vec::new();
    for entry in paths {
        let path = match entry {
            Ok(path) => path,
            Err(e) if e.error().kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("list directory", e.path(), e.error())),
        };
        if skip.is_some_and(|s| s == path) {
            continue;
        }
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("read", &path, &e)),
        };
        if !meta.is_file() {
            continue;
        }
        let modified = meta
            .modified()
            .map_err(|e| io_error("read the modification time of", &path, &e))?;
        files.push(FileInfo {
            path,
            size: meta.len(),
            modified,
        });
    }
    Ok(files)
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

    #[tokio::test]
    async fn a_panic_in_the_listing_is_a_transient_error() {
        let e = blocking::<()>(|| panic!("boom")).await.unwrap_err();
        assert_eq!(e.kind, "panic");
        assert!(!e.permanent);
        assert_eq!(blocking(|| Ok(7)).await, Ok(7));
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
