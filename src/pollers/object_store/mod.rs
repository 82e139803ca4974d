//! The object-store poller (`WATCHBRIDGE_POLLER=object_store`): the objects under a prefix
//! of an S3, GCS or Azure bucket (or a local directory) derived from the input, e.g.
//! `s3://bucket/tenants/{/tenant}/`. Each object is one output, keyed by its location (or by
//! location and ETag, so a rewritten object is new again), stamped with its last-modified
//! time. The set is final once a done-marker object exists under the prefix. See
//! `docs/pollers/object_store.md`.
//!
//! A poll is one listing, paged by the store, with no request per object: listing 10,000
//! objects is 10 requests on S3. With `WATCHBRIDGE_OBJECT_INCREASING_NAMES`, a poll lists
//! only the keys after the last one the watch has listed (S3's `start-after`, GCS's
//! `startOffset`), saved with the watch's state so a restart goes on from it too; a listing
//! cut by the poll's deadline gives what it has listed, and the next poll goes on after it.

mod store;

pub use store::Scheme;

use crate::clock::Millis;
use crate::poll::{Output, PollError, PollResult, Poller};
use crate::pollers::event_time::format_rfc3339;
use crate::pollers::shards::{self, FirstShard};
use crate::pollers::template::{RenderError, Template, TemplateError};
use crate::pollers::{ConfigError, OutputKeyReader, Resolve};
use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use url::Url;

const VAR_URL: &str = "WATCHBRIDGE_OBJECT_URL";
const VAR_MATCH_UPDATED: &str = "WATCHBRIDGE_OBJECT_MATCH_UPDATED";
const VAR_DONE_MARKER: &str = "WATCHBRIDGE_OBJECT_DONE_MARKER";
const VAR_INCREASING_NAMES: &str = "WATCHBRIDGE_OBJECT_INCREASING_NAMES";
const VAR_SHARDS: &str = "WATCHBRIDGE_OBJECT_SHARDS";

/// Settings of the object-store poller.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ObjectArgs {
    /// The prefix to watch, a URL (`s3://`, `gs://`, `az://`, `file://`) with
    /// `{/json/pointer}` and `{key}` placeholders in its path filled from the input record,
    /// e.g. `s3://bucket/tenants/{/tenant}/`. Each substituted value must be one path
    /// segment. Credentials and an S3 endpoint come from the environment (AWS_*, GOOGLE_*,
    /// AZURE_*).
    #[arg(
        long,
        env = "WATCHBRIDGE_OBJECT_URL",
        value_name = "WATCHBRIDGE_OBJECT_URL"
    )]
    pub object_url: Option<String>,

    /// Key each object by its location and ETag, so a rewritten object is emitted again (by
    /// default a location is emitted once).
    #[arg(
        long,
        env = "WATCHBRIDGE_OBJECT_MATCH_UPDATED", value_name = "WATCHBRIDGE_OBJECT_MATCH_UPDATED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub object_match_updated: bool,

    /// Name of an object, relative to the watched prefix, whose presence makes the set of
    /// objects final (e.g. `_SUCCESS`). The marker itself is not an output.
    #[arg(
        long,
        env = "WATCHBRIDGE_OBJECT_DONE_MARKER",
        value_name = "WATCHBRIDGE_OBJECT_DONE_MARKER"
    )]
    pub object_done_marker: Option<String>,

    /// New objects are named after every object already under the prefix (time-stamped or
    /// numbered names): each poll lists only the keys after the last one listed. An object
    /// written later under a smaller name is then never seen.
    #[arg(
        long,
        env = "WATCHBRIDGE_OBJECT_INCREASING_NAMES", value_name = "WATCHBRIDGE_OBJECT_INCREASING_NAMES",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub object_increasing_names: bool,

    /// Read objects named `PREFIX-SSSSS-of-NNNNN` as the shards of one output, as the
    /// sharded poller does: the watermark is the time of the last shard before the first
    /// missing one, and the set is final once all N exist. `off`, or where shard numbers
    /// start: `auto`, `0` or `1`.
    #[arg(
        long,
        env = "WATCHBRIDGE_OBJECT_SHARDS",
        value_name = "WATCHBRIDGE_OBJECT_SHARDS",
        default_value = "off"
    )]
    pub object_shards: String,
}

impl Default for ObjectArgs {
    fn default() -> Self {
        Self {
            object_url: None,
            object_match_updated: false,
            object_done_marker: None,
            object_increasing_names: false,
            object_shards: "off".into(),
        }
    }
}

/// The object-store poller's checked settings.
#[derive(Debug, Clone)]
pub struct ObjectConfig {
    /// `scheme://bucket` (`file://` for a local directory): one store for every watch.
    base: String,
    scheme: Scheme,
    /// The prefix's path, a template.
    path: Template,
    match_updated: bool,
    done_marker: Option<String>,
    increasing_names: bool,
    /// Where shard numbers start, when objects are read as shards.
    shards: Option<FirstShard>,
    /// The engine's deadline of a poll: a listing stops short of it
    /// ([`LISTING_SHARE`]) and gives what it has.
    poll_timeout: Duration,
}

/// The share of `WATCHBRIDGE_POLL_TIMEOUT` a listing takes before it stops and gives what it
/// has listed: the rest leaves the page in flight time to be dropped and the result to reach
/// the engine before its own deadline turns the whole poll into a `timeout`.
const LISTING_SHARE: f64 = 0.8;

impl ObjectConfig {
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }
}

impl ObjectArgs {
    /// Check the settings. Every error names its variable.
    pub fn config(&self, poll_timeout: Duration) -> Result<ObjectConfig, ConfigError> {
        let text = self
            .object_url
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                ConfigError::new(
                    VAR_URL,
                    "is required when WATCHBRIDGE_POLLER=object_store (a URL such as \
                     s3://bucket/tenants/{/tenant}/)",
                )
            })?;
        let template = Template::parse(text)
            .map_err(|e: TemplateError| ConfigError::new(VAR_URL, e.to_string()))?;
        if let Some((field, _)) = template.last_placeholders().first() {
            return Err(ConfigError::new(
                VAR_URL,
                format!(
                    "`{{{}}}` is for the HTTP poller's URL; an object URL takes `{{key}}` and JSON pointers",
                    field.name()
                ),
            ));
        }
        if let Some((placeholder, _)) = template.origin_placeholders().first() {
            return Err(ConfigError::new(
                VAR_URL,
                format!(
                    "`{placeholder}` is in the scheme or bucket of `{}`: one store serves every \
                     watch, so placeholders may stand only in the path",
                    crate::logging::url(text)
                ),
            ));
        }
        let sample = template.with_placeholders_as("x");
        let url = Url::parse(&sample).map_err(|e| {
            ConfigError::new(
                VAR_URL,
                format!("`{}` is not a URL: {e}", crate::logging::url(text)),
            )
        })?;
        let scheme = Scheme::of(&url).ok_or_else(|| {
            ConfigError::new(
                VAR_URL,
                format!(
                    "`{}` names no object store: the scheme must be s3, gs, az (or azure, abfs, \
                     abfss, adl) or file",
                    url.scheme()
                ),
            )
        })?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(ConfigError::new(
                VAR_URL,
                "takes no query or fragment: the store's settings come from the environment",
            ));
        }
        if scheme != Scheme::Local && url.host_str().is_none_or(str::is_empty) {
            return Err(ConfigError::new(
                VAR_URL,
                format!("`{}` names no bucket", crate::logging::url(text)),
            ));
        }
        // Placeholders stand only in the path (checked above): split the template's text
        // after its authority.
        let after_scheme = text.find("://").map_or(0, |i| i + 3);
        let path_at = text[after_scheme..]
            .find('/')
            .map_or(text.len(), |i| after_scheme + i);
        let base = text[..path_at].to_string();
        let path = Template::parse(&text[path_at..])
            .map_err(|e: TemplateError| ConfigError::new(VAR_URL, e.to_string()))?;
        let done_marker = match self.object_done_marker.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(name) => {
                if name
                    .split('/')
                    .any(|s| s.is_empty() || s == "." || s == "..")
                {
                    return Err(ConfigError::new(
                        VAR_DONE_MARKER,
                        format!(
                            "`{}` must be an object name relative to the watched prefix, such \
                             as _SUCCESS (no empty, `.` or `..` segment)",
                            crate::logging::outside(name)
                        ),
                    ));
                }
                Some(name.to_string())
            }
        };
        if self.object_increasing_names && self.object_match_updated {
            return Err(ConfigError::new(
                VAR_INCREASING_NAMES,
                format!(
                    "cannot be used with {VAR_MATCH_UPDATED}: a listing after the last key \
                     never sees an older object rewritten; leave one of them false"
                ),
            ));
        }
        let shards = match self.object_shards.trim() {
            "off" | "" => None,
            other => Some(FirstShard::parse(VAR_SHARDS, other).map_err(|mut e| {
                e.message = format!("{}, or `off`", e.message);
                e
            })?),
        };
        Ok(ObjectConfig {
            shards,
            base,
            scheme,
            path,
            match_updated: self.object_match_updated,
            done_marker,
            increasing_names: self.object_increasing_names,
            poll_timeout,
        })
    }
}

/// What one watch lists: its prefix, fixed when the watch starts, and where its next
/// listing starts.
#[derive(Debug)]
pub struct ObjectTarget {
    prefix: Path,
    marker: Option<Path>,
    /// Written only after a poll succeeded, so a failed or timed-out poll never makes a
    /// later one skip keys whose objects were not emitted.
    progress: Mutex<Progress>,
}

impl ObjectTarget {
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }
}

/// Where a watch's listings go on from; saved with the watch's state (`resume_state`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    /// With increasing names: the last key listed; every poll lists after it.
    #[serde(rename = "after", skip_serializing_if = "Option::is_none", default)]
    after: Option<String>,
    /// Without: the last key a listing cut by its deadline gave; the next poll lists after
    /// it, and the one after that from the start again.
    #[serde(rename = "cont", skip_serializing_if = "Option::is_none", default)]
    continue_at: Option<String>,
    /// With increasing names and `WATCHBRIDGE_OBJECT_SHARDS`: the shards listed so far.
    #[serde(rename = "shards", skip_serializing_if = "Vec::is_empty", default)]
    shards: Vec<SavedShard>,
}

/// Watches the objects under a prefix; see the module docs. One store (connection pool,
/// credentials) serves every watch.
pub struct ObjectStorePoller {
    store: Arc<dyn ObjectStore>,
    config: Arc<ObjectConfig>,
}

impl std::fmt::Debug for ObjectStorePoller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorePoller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ObjectStorePoller {
    /// Build the store from the URL's scheme and bucket and the environment's credentials.
    pub fn new(config: ObjectConfig) -> Result<Self, ConfigError> {
        Self::with_options(config, &[])
    }

    /// [`new`](Self::new), with `object_store` configuration keys (`aws_endpoint`,
    /// `aws_access_key_id`, …) set over the environment's (tests, benches).
    pub fn with_options(
        config: ObjectConfig,
        options: &[(&str, &str)],
    ) -> Result<Self, ConfigError> {
        let store = store::build(VAR_URL, config.scheme, &config.base, options)?;
        Ok(Self::with_store(config, store))
    }

    /// With a store built elsewhere (tests, benches).
    pub fn with_store(config: ObjectConfig, store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            config: Arc::new(config),
        }
    }
}

impl Resolve for ObjectStorePoller {
    fn resolve(&self, value: &Value, key: &[u8]) -> Result<ObjectTarget, RenderError> {
        let rendered = self.config.path.render_segments(value, key)?;
        // `Path::from` splits on `/`, drops empty segments and encodes what a key may not
        // hold; substituted values are single segments (no `/`, no `..`), so the prefix
        // is the template's own directories plus one segment per value.
        let prefix = Path::from(rendered.as_str());
        let marker = self
            .config
            .done_marker
            .as_deref()
            .map(|m| m.split('/').fold(prefix.clone(), |p, s| p.join(s)));
        Ok(ObjectTarget {
            prefix,
            marker,
            progress: Mutex::new(Progress::default()),
        })
    }

    fn output_key_reader(&self) -> Option<OutputKeyReader> {
        let match_updated = self.config.match_updated;
        Some(Arc::new(move |value: &[u8]| {
            let value: Value = serde_json::from_slice(value).ok()?;
            let location = value.get("location")?.as_str()?;
            let tag = if match_updated {
                Some(value.get("e_tag")?.as_str().unwrap_or_default())
            } else {
                None
            };
            Some(output_key(location, tag))
        }))
    }

    fn resume(&self, input: &ObjectTarget, state: &[u8]) {
        match serde_json::from_slice::<Progress>(state) {
            Ok(progress) => *lock(&input.progress) = progress,
            Err(e) => tracing::warn!(
                prefix = %input.prefix,
                error = %e,
                "saved listing position unreadable; listing from the start"
            ),
        }
    }
}

impl Poller for ObjectStorePoller {
    type Input = ObjectTarget;

    fn poll(
        &self,
        input: Arc<ObjectTarget>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let store = Arc::clone(&self.store);
        let config = Arc::clone(&self.config);
        let exchange = Arc::new(store::Exchange::default());
        store::EXCHANGE.scope(Arc::clone(&exchange), async move {
            let result = poll(&*store, &config, &input, &exchange).await;
            tracing::debug!(
                prefix = %input.prefix,
                requests = exchange.requests(),
                ok = result.is_ok(),
                "object listing"
            );
            result
        })
    }

    fn rate_key(&self, _input: &ObjectTarget) -> Option<Arc<str>> {
        Some(Arc::from(self.config.base.as_str()))
    }

    fn resume_state(&self, input: &ObjectTarget) -> Option<Vec<u8>> {
        let progress = lock(&input.progress);
        if *progress == Progress::default() {
            return None;
        }
        Some(serde_json::to_vec(&*progress).expect("strings serialize"))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One poll: the marker first, then one listing.
async fn poll(
    store: &dyn ObjectStore,
    config: &ObjectConfig,
    target: &ObjectTarget,
    exchange: &store::Exchange,
) -> Result<PollResult, PollError> {
    let shown = format!("{}/{}", config.base, target.prefix);
    // Decide finality before listing: whatever was written before the marker is then in
    // this listing (the stores list with read-after-write consistency). Seen in the listing
    // instead, the marker could have been written after an earlier page was read.
    let marker_found = match &target.marker {
        None => false,
        Some(marker) => match store.head(marker).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => {
                return Err(store::poll_error(
                    config.scheme,
                    &format!("look for the done marker {}/{marker}", config.base),
                    &e,
                    exchange,
                ))
            }
        },
    };
    let start = {
        let progress = lock(&target.progress);
        if config.increasing_names {
            progress.after.clone()
        } else {
            progress.continue_at.clone()
        }
    };
    let mut listing = match &start {
        Some(after) => store.list_with_offset(Some(&target.prefix), &Path::from(after.as_str())),
        None => store.list(Some(&target.prefix)),
    };
    // Only a listing in key order can stop early: what it gave is then every key up to its
    // last one. A local directory walk runs to its end (or to the engine's timeout).
    let deadline = config
        .scheme
        .lists_in_order()
        .then(|| tokio::time::Instant::now() + config.poll_timeout.mul_f64(LISTING_SHARE));
    let mut objects: Vec<ObjectMeta> = Vec::new();
    let mut cut = false;
    loop {
        let next = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, listing.next()).await {
                Ok(next) => next,
                Err(_) => {
                    cut = true;
                    break;
                }
            },
            None => listing.next().await,
        };
        match next {
            None => break,
            Some(Ok(meta)) => objects.push(meta),
            Some(Err(e)) => {
                return Err(store::poll_error(
                    config.scheme,
                    &format!("list {shown}"),
                    &e,
                    exchange,
                ))
            }
        }
    }
    if cut {
        tracing::info!(
            prefix = %shown,
            listed = objects.len(),
            "listing stopped at the poll's deadline; the next poll goes on after its last key"
        );
    }
    let last = objects
        .iter()
        .map(|o| o.location.as_ref())
        .max()
        .map(str::to_string);
    let outputs: Vec<ObjectMeta> = objects
        .into_iter()
        .filter(|o| target.marker.as_ref() != Some(&o.location))
        .collect();
    // The shards so far: this listing's, and with increasing names those of earlier ones
    // (they are not listed again). Assessed before anything is kept: a poll that fails here
    // moves nothing on.
    let shards = config.shards.map(|first| {
        let mut all = if config.increasing_names {
            lock(&target.progress).shards.clone()
        } else {
            Vec::new()
        };
        all.extend(outputs.iter().filter_map(SavedShard::of));
        (first, all)
    });
    let assessed = match &shards {
        Some((first, all)) => {
            let found: Vec<shards::Shard> = all.iter().map(SavedShard::shard).collect();
            Some(shards::assess(&found, *first, VAR_SHARDS)?)
        }
        None => None,
    };
    {
        let mut progress = lock(&target.progress);
        if config.increasing_names {
            if let Some(last) = &last {
                if progress.after.as_deref().is_none_or(|a| last.as_str() > a) {
                    progress.after = Some(last.clone());
                }
            }
            if let Some((_, all)) = shards {
                progress.shards = all;
            }
        } else {
            progress.continue_at = if cut { last.clone() } else { None };
        }
    }
    // Final only on a listing that saw everything the marker vouches for: whole, and
    // (listing everything) not a continuation of a cut one, whose earlier part was read
    // before the marker was found.
    let whole = !cut && (config.increasing_names || start.is_none());
    Ok(PollResult {
        outputs: outputs.iter().map(|o| output(config, o)).collect(),
        watermark: assessed.as_ref().and_then(|a| a.watermark),
        complete: (marker_found && whole) || assessed.is_some_and(|a| a.complete),
        host_wait: None,
    })
}

/// A shard object a watch with increasing names has listed (its name's number and count,
/// and its time), kept in its saved state: later listings do not see it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SavedShard {
    #[serde(rename = "i")]
    index: u64,
    #[serde(rename = "of")]
    of: u64,
    #[serde(rename = "t")]
    time: Millis,
    #[serde(rename = "k")]
    location: String,
}

impl SavedShard {
    fn of(meta: &ObjectMeta) -> Option<Self> {
        let (index, of) = shards::parse_shard_name(meta.location.filename()?)?;
        Some(Self {
            index,
            of,
            time: meta.last_modified.timestamp_millis(),
            location: meta.location.to_string(),
        })
    }

    fn shard(&self) -> shards::Shard {
        shards::Shard {
            index: self.index,
            of: self.of,
            time: self.time,
            name: crate::logging::outside(&self.location).to_string(),
        }
    }
}

/// An output's key: the location, with `@` and the ETag when rewritten objects are new.
fn output_key(location: &str, e_tag: Option<&str>) -> Bytes {
    match e_tag {
        None => Bytes::copy_from_slice(location.as_bytes()),
        Some(tag) => Bytes::from(format!("{location}@{tag}")),
    }
}

fn output(config: &ObjectConfig, meta: &ObjectMeta) -> Output {
    let location = meta.location.as_ref();
    let modified: Millis = meta.last_modified.timestamp_millis();
    // A store that gives no ETag (a local file): the modification time stands in for it.
    let tag = meta.e_tag.clone().unwrap_or_else(|| modified.to_string());
    let key = output_key(location, config.match_updated.then_some(tag.as_str()));
    let value = json!({
        "location": location,
        "url": format!("{}/{location}", config.base),
        "size": meta.size,
        "last_modified": format_rfc3339(modified),
        "e_tag": meta.e_tag.as_deref().unwrap_or(&tag),
    });
    Output::new(
        key,
        serde_json::to_vec(&value).unwrap_or_default(),
        modified,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn args(url: &str) -> ObjectArgs {
        ObjectArgs {
            object_url: Some(url.into()),
            ..ObjectArgs::default()
        }
    }

    const T: Duration = Duration::from_secs(30);

    #[test]
    fn the_url_is_checked_and_errors_name_the_variable() {
        for (url, says) in [
            ("", "is required"),
            ("s3://{/b}/x/", "scheme or bucket"),
            ("{/s}://b/x/", "scheme or bucket"),
            ("http://b/x/", "names no object store"),
            ("s3://b/x/{last.time}", "HTTP poller"),
            ("s3://b/x/?a=1", "no query"),
            ("s3:///x/", "names no bucket"),
            ("s3://b/{/t", "column"),
        ] {
            let e = args(url).config(T).unwrap_err();
            assert_eq!(e.var, VAR_URL, "{url}");
            assert!(e.message.contains(says), "{url}: {e}");
        }
        let c = args("s3://bkt/tenants/{/t}/").config(T).unwrap();
        assert_eq!((c.base.as_str(), c.scheme), ("s3://bkt", Scheme::S3));
        assert_eq!(c.path.to_string(), "/tenants/{/t}/");
        let c = args("file:///data/{key}").config(T).unwrap();
        assert_eq!((c.base.as_str(), c.scheme), ("file://", Scheme::Local));
        assert_eq!(args("gs://b").config(T).unwrap().path.to_string(), "");
    }

    #[test]
    fn marker_and_increasing_names_are_checked() {
        let mut a = args("s3://b/p/");
        for bad in ["a//b", "../x", "./x", "/x"] {
            a.object_done_marker = Some(bad.into());
            assert_eq!(a.config(T).unwrap_err().var, VAR_DONE_MARKER, "{bad}");
        }
        a.object_done_marker = Some("done/_SUCCESS".into());
        assert!(a.config(T).is_ok());
        a.object_increasing_names = true;
        a.object_match_updated = true;
        let e = a.config(T).unwrap_err();
        assert_eq!(e.var, VAR_INCREASING_NAMES);
        assert!(e.message.contains(VAR_MATCH_UPDATED), "{e}");
    }

    fn poller(a: ObjectArgs) -> (ObjectStorePoller, Arc<InMemory>) {
        let store = Arc::new(InMemory::new());
        let p = ObjectStorePoller::with_store(a.config(T).unwrap(), store.clone());
        (p, store)
    }

    #[test]
    fn an_input_cannot_leave_its_prefix() {
        let (p, _) = poller(args("s3://b/tenants/{/t}/"));
        for bad in ["..", "a/b", "", ".", "x..y"] {
            let e = p.resolve(&json!({"t": bad}), b"k").unwrap_err();
            assert!(
                matches!(e, RenderError::NotOneSegment { .. }),
                "{bad:?}: {e}"
            );
        }
        let t = p.resolve(&json!({"t": "acme co%"}), b"k").unwrap();
        assert_eq!(t.prefix.parts().count(), 2);
        assert!(t.prefix.as_ref().starts_with("tenants/"), "{}", t.prefix);
    }

    async fn put(store: &InMemory, key: &str) {
        store
            .put(&Path::from(key), PutPayload::from_static(b"x"))
            .await
            .unwrap();
    }

    fn keys(r: &PollResult) -> Vec<String> {
        r.outputs
            .iter()
            .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn increasing_names_list_after_the_last_key_and_resume_from_it() {
        let mut a = args("s3://b/in/{/t}/");
        a.object_increasing_names = true;
        a.object_done_marker = Some("zz_DONE".into());
        let (p, store) = poller(a);
        let target = Arc::new(p.resolve(&json!({"t": "a"}), b"k").unwrap());
        put(&store, "in/a/001").await;
        put(&store, "in/a/002").await;
        put(&store, "in/b/001").await;
        let r = p.poll(target.clone()).await.unwrap();
        assert_eq!(keys(&r), ["in/a/001", "in/a/002"]);
        assert!(!r.complete);
        let saved = p.resume_state(&target).unwrap();
        assert_eq!(
            String::from_utf8(saved.clone()).unwrap(),
            r#"{"after":"in/a/002"}"#
        );
        put(&store, "in/a/003").await;
        let r = p.poll(target.clone()).await.unwrap();
        assert_eq!(keys(&r), ["in/a/003"]);
        // A restarted watch goes on after the saved key.
        let restarted = Arc::new(p.resolve(&json!({"t": "a"}), b"k").unwrap());
        p.resume(&restarted, &saved);
        put(&store, "in/a/zz_DONE").await;
        let r = p.poll(restarted).await.unwrap();
        assert_eq!(keys(&r), ["in/a/003"], "the marker is not an output");
        assert!(r.complete);
        let v: Value = serde_json::from_slice(&r.outputs[0].value).unwrap();
        assert_eq!(v["location"], "in/a/003");
        assert_eq!(v["url"], "s3://b/in/a/003");
        assert_eq!(v["size"], 1);
        let read = p.output_key_reader().unwrap();
        assert_eq!(read(&r.outputs[0].value).unwrap(), r.outputs[0].key);
    }

    #[tokio::test]
    async fn match_updated_keys_by_etag() {
        let mut a = args("s3://b/in/");
        a.object_match_updated = true;
        let (p, store) = poller(a);
        let target = Arc::new(p.resolve(&json!({}), b"k").unwrap());
        put(&store, "in/x").await;
        let first = keys(&p.poll(target.clone()).await.unwrap());
        put(&store, "in/x").await;
        let r = p.poll(target.clone()).await.unwrap();
        let second = keys(&r);
        assert_ne!(first, second);
        assert!(second[0].starts_with("in/x@"), "{second:?}");
        assert_eq!(
            p.resume_state(&target),
            None,
            "a full listing saves nothing"
        );
        let read = p.output_key_reader().unwrap();
        assert_eq!(read(&r.outputs[0].value).unwrap(), r.outputs[0].key);
    }

    #[tokio::test]
    async fn shards_give_a_watermark_and_finality_across_polls_and_a_restart() {
        let mut a = args("s3://b/out/");
        a.object_increasing_names = true;
        a.object_shards = "auto".into();
        let (p, store) = poller(a);
        let t = Arc::new(p.resolve(&json!({}), b"k").unwrap());
        put(&store, "out/0-readme").await;
        put(&store, "out/part-1-of-3").await;
        let r = p.poll(t.clone()).await.unwrap();
        let first = r.watermark.expect("shard 1 is there");
        assert!(!r.complete);
        put(&store, "out/part-2-of-3").await;
        let r = p.poll(t.clone()).await.unwrap();
        let second = r.watermark.expect("shards 1 and 2");
        assert!(second >= first && !r.complete);
        // The shards listed so far survive a restart: later polls do not list them again.
        let saved = p.resume_state(&t).unwrap();
        let t = Arc::new(p.resolve(&json!({}), b"k").unwrap());
        p.resume(&t, &saved);
        assert!(p.poll(t.clone()).await.unwrap().watermark == Some(second));
        put(&store, "out/part-3-of-3").await;
        let r = p.poll(t.clone()).await.unwrap();
        assert_eq!(keys(&r), ["out/part-3-of-3"]);
        assert!(r.complete, "all three shards");

        let mut bad = args("s3://b/out/");
        bad.object_shards = "2".into();
        let e = bad.config(T).unwrap_err();
        assert_eq!(e.var, VAR_SHARDS);
        assert!(e.message.contains("`off`"), "{e}");
    }

    #[tokio::test]
    async fn inconsistent_shards_fail_the_poll_and_move_nothing_on() {
        let mut a = args("s3://b/out/");
        a.object_increasing_names = true;
        a.object_shards = "auto".into();
        let (p, store) = poller(a);
        let t = Arc::new(p.resolve(&json!({}), b"k").unwrap());
        put(&store, "out/part-1-of-3").await;
        p.poll(t.clone()).await.unwrap();
        let saved = p.resume_state(&t);
        put(&store, "out/part-2-of-4").await;
        let e = p.poll(t.clone()).await.unwrap_err();
        assert_eq!(e.kind, "inconsistent_shards");
        assert_eq!(
            p.resume_state(&t),
            saved,
            "nothing kept from the failed poll"
        );
    }
}
