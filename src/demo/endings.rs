//! How each user's watch ended, as the bridge itself reported it.
//!
//! The bridge counts endings by reason (`watchbridge_watches_terminated_total{reason}`) but
//! keeps no per-watch record (a million watches must stay cheap). Every ending is also an
//! internal event (`internal_events::WatchTerminated`, a `tracing` event with `key` and
//! `reason` fields), so the demo listens to those: a `tracing` layer, installed by `main`
//! next to the log output, with its own filter so it hears them whatever `WATCHBRIDGE_LOG`
//! says.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Where the engine's events come from (`src/internal_events.rs`).
const TARGET: &str = "watchbridge::internal_events";

/// Watch key → reason its watch ended. Cheap to clone; clones share the record.
#[derive(Clone, Default)]
pub struct Endings(Arc<Mutex<HashMap<String, String>>>);

impl Endings {
    /// The layer that fills this record; `main` adds it to the subscriber for `demo`.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.clone()
            .with_filter(Targets::new().with_target(TARGET, LevelFilter::DEBUG))
    }

    /// How the watch of `key` ended, if it has.
    pub fn get(&self, key: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }
}

impl<S: Subscriber> Layer<S> for Endings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            key: Option<String>,
            reason: Option<String>,
        }
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
                match field.name() {
                    "key" => self.key = Some(format!("{value:?}")),
                    "reason" => self.reason = Some(format!("{value:?}")),
                    _ => {}
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        // Only the "watch terminated" event carries both a watch key and a reason.
        if let (Some(key), Some(reason)) = (fields.key, fields.reason) {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn hears_watch_endings_and_nothing_else() {
        let endings = Endings::default();
        let subscriber = tracing_subscriber::registry().with(endings.layer());
        tracing::subscriber::with_default(subscriber, || {
            let m = crate::metrics::Metrics::new();
            crate::internal_events::WatchTerminated {
                key: b"user-01",
                reason: &crate::reason::TerminatedReason::Stable,
            }
            .emit(&m);
            crate::internal_events::InputDeadLettered {
                partition: 0,
                offset: 1,
                reason: "not_json",
                error: "x",
            }
            .emit(&m);
        });
        assert_eq!(endings.get("user-01").as_deref(), Some("stable"));
        assert_eq!(endings.0.lock().unwrap().len(), 1);
    }
}
