//! Log lines on stderr, filtered by `WATCHBRIDGE_LOG` (default `info`), as text for people
//! or as one JSON object per line for log collectors (`WATCHBRIDGE_LOG_FORMAT=json`). What
//! is logged is the same either way (secrets never are: see `config::is_secret`).

use crate::demo::Endings;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// `WATCHBRIDGE_LOG` when unset: what the bridge does, and librdkafka's warnings.
pub const DEFAULT_FILTER: &str = "info";

/// `WATCHBRIDGE_LOG_FORMAT`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields at the top level.
    Json,
}

/// Install the global subscriber. For `demo` (`Some(endings)`) the default filter is
/// `error`: its view shows the dead letters and failed watches the warnings are about, and
/// log lines would scramble a view redrawn in place; `demo` also gets the layer that
/// records how each watch ended, whatever the filter.
pub fn init(format: LogFormat, demo: Option<&Endings>) {
    let default = if demo.is_some() {
        "error"
    } else {
        DEFAULT_FILTER
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("WATCHBRIDGE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    match demo {
        // One global filter. (A per-layer filter beside an absent `Option` layer dropped
        // events of some targets: seen with `info,librdkafka=warn`.)
        None => tracing_subscriber::registry()
            .with(filter)
            .with(lines(format))
            .init(),
        // The demo's endings layer must see every watch ending whatever WATCHBRIDGE_LOG says,
        // so only the log output is filtered.
        Some(endings) => tracing_subscriber::registry()
            .with(lines(format).with_filter(filter))
            .with(endings.layer())
            .init(),
    }
}

/// Log lines on stderr in `format`; text is coloured only on a terminal.
fn lines<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => layer
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
    }
}
