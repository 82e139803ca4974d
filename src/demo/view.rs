//! The demo's terminal output: a live status while it runs (redrawn in place on a terminal;
//! a plain line every couple of seconds otherwise, so logs and CI output stay readable)
//! and the summary at the end.

use super::feeds::Served;
use super::tally::Tally;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often the plain (non-terminal) status line is printed.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// One moment of the run, from the bridge's metrics, the feeds and what was read back.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub elapsed: Duration,
    /// The bridge has joined its consumer group and owns input partitions.
    pub joined: bool,
    pub inputs: u64,
    pub started: u64,
    pub dead_lettered: BTreeMap<String, u64>,
    pub active: i64,
    pub ended: BTreeMap<String, u64>,
    pub emitted: u64,
    pub produced: u64,
    /// Output records read back from the output topic.
    pub read: u64,
    /// Records read back from the dead-letter topic.
    pub dlq_read: u64,
    pub duplicates: u64,
    pub polls_ok: u64,
    pub polls_failed: BTreeMap<String, u64>,
    /// The merged watermark over the input partitions, once there is one.
    pub watermark: Option<i64>,
    /// Each input partition's published watermark.
    pub partition_watermarks: BTreeMap<i32, i64>,
    pub users: Vec<UserRow>,
}

#[derive(Debug, Clone)]
pub struct UserRow {
    pub user: String,
    /// Output records of this user read back from Kafka.
    pub outputs: u64,
    /// How the watch ended, or `polling` / `waiting` while it runs or has not started.
    pub state: String,
    pub served: Served,
    /// What the feed does (`closes`, `goes quiet`, …).
    pub feed: &'static str,
}

impl Status {
    pub fn dead_lettered_total(&self) -> u64 {
        self.dead_lettered.values().sum()
    }

    pub fn ended_total(&self) -> u64 {
        self.ended.values().sum()
    }
}

/// `final 3, stable 1`, or `none`.
fn counts(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = map.iter().map(|(k, n)| format!("{k} {n}")).collect();
    parts.join(", ")
}

pub struct View {
    tty: bool,
    /// Lines of the last frame (a terminal redraw moves back over them).
    drawn: usize,
    last_plain: Option<Instant>,
}

impl Default for View {
    fn default() -> Self {
        Self::new()
    }
}

impl View {
    pub fn new() -> Self {
        Self {
            tty: std::io::stdout().is_terminal(),
            drawn: 0,
            last_plain: None,
        }
    }

    /// Show `status`: every call on a terminal, every [`PLAIN_EVERY`] otherwise.
    pub fn update(&mut self, status: &Status) {
        if self.tty {
            self.redraw(&frame(status));
        } else if self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
            self.last_plain = Some(Instant::now());
            print_flush(&format!("{}\n", line(status)));
        }
    }

    /// The last status, whatever the time since the previous one.
    pub fn finish(&mut self, status: &Status) {
        if self.tty {
            self.redraw(&frame(status));
        } else {
            print_flush(&format!("{}\n", line(status)));
        }
    }

    fn redraw(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        if self.drawn > 0 {
            // Up to the first line of the last frame, and clear everything below.
            let _ = write!(out, "\x1b[{}A\r\x1b[J", self.drawn);
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        self.drawn = text.lines().count();
    }
}

fn print_flush(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Shown until the bridge owns its partitions (joining a group takes a few seconds).
const JOINING: &str = "the bridge is joining its consumer group…";

/// `merged 14:03:07.2 (p0 14:03:07.2, p1 14:03:09.0, …)`: how far event time has got.
fn watermarks(s: &Status) -> String {
    let time = |ms: i64| {
        crate::pollers::event_time::format_rfc3339(ms)
            .get(11..21)
            .unwrap_or("?")
            .to_string()
    };
    let merged = s.watermark.map_or("none yet".to_string(), time);
    let parts: Vec<String> = s
        .partition_watermarks
        .iter()
        .map(|(p, w)| format!("p{p} {}", time(*w)))
        .collect();
    if parts.is_empty() {
        format!("merged {merged}")
    } else {
        format!("merged {merged} ({})", parts.join(", "))
    }
}

/// The plain status line.
pub fn line(s: &Status) -> String {
    if !s.joined {
        return format!("[{:>5.1}s] {JOINING}", s.elapsed.as_secs_f64());
    }
    format!(
        "[{:>5.1}s] inputs {} read, {} dead-lettered | watches {} active, ended: {} | outputs {} produced, {} read back | {} repeats suppressed | watermark {}",
        s.elapsed.as_secs_f64(),
        s.inputs,
        s.dead_lettered_total(),
        s.active,
        counts(&s.ended),
        s.produced,
        s.read,
        s.duplicates,
        watermarks(s),
    )
}

/// The terminal frame: the counters, then outputs per user, three to a line (under 80
/// columns, so no line wraps and the redraw stays in place).
pub fn frame(s: &Status) -> String {
    let mut f = String::new();
    if !s.joined {
        let _ = writeln!(f, "{:>6.1}s  {JOINING}", s.elapsed.as_secs_f64());
        return f;
    }
    let _ = writeln!(
        f,
        "{:>6.1}s  inputs   {:>5} read, {} dead-lettered",
        s.elapsed.as_secs_f64(),
        s.inputs,
        s.dead_lettered_total()
    );
    let _ = writeln!(
        f,
        "         watches  {:>5} active, ended: {}",
        s.active,
        counts(&s.ended)
    );
    let _ = writeln!(
        f,
        "         outputs  {:>5} produced, {} read back; {} repeats suppressed",
        s.produced, s.read, s.duplicates
    );
    let _ = writeln!(
        f,
        "         polls    {:>5} ok, failed: {}",
        s.polls_ok,
        counts(&s.polls_failed)
    );
    let _ = writeln!(f, "         event time  {}", watermarks(s));
    let _ = writeln!(f);
    for row in s.users.chunks(3) {
        let cells: Vec<String> = row
            .iter()
            .map(|u| format!("{:<8} {:>4} {:<8}", u.user, u.outputs, u.state))
            .collect();
        let _ = writeln!(f, "  {}", cells.join("  ").trim_end());
    }
    f
}

/// The closing report: per user, totals, and the checks made on what was read back from
/// Kafka. Returns it and whether every check passed.
pub fn summary(s: &Status, tally: &Tally, outputs: &str, interrupted: bool) -> (String, bool) {
    let mut f = String::new();
    let _ = writeln!(
        f,
        "\n── summary after {:.1}s{} ──",
        s.elapsed.as_secs_f64(),
        if interrupted { " (interrupted)" } else { "" }
    );
    let _ = writeln!(f, "user      outputs  served  ended    feed");
    for u in &s.users {
        let mut feed = u.feed.to_string();
        if u.served.unavailable > 0 {
            let _ = write!(feed, "; {} × 503, retried", u.served.unavailable);
        }
        if u.served.not_found > 0 {
            let _ = write!(feed, "; {} × 404", u.served.not_found);
        }
        let _ = writeln!(
            f,
            "{:<9} {:>7}  {:>6}  {:<8} {feed}",
            u.user, u.outputs, u.served.items, u.state
        );
    }
    let _ = writeln!(
        f,
        "dead letters read back: {}",
        if tally.dead_letters.is_empty() {
            "none".to_string()
        } else {
            let all: Vec<String> = tally
                .dead_letters
                .iter()
                .map(|d| format!("{} ({}: {})", d.key, d.kind, shorten(&d.error, 50)))
                .collect();
            all.join("; ")
        }
    );
    let _ = writeln!(
        f,
        "totals: {} inputs read: {} watched, {} dead-lettered ({})",
        s.inputs,
        s.started,
        s.dead_lettered_total(),
        counts(&s.dead_lettered)
    );
    let _ = writeln!(
        f,
        "        {} outputs produced, {} read back; {} repeats suppressed by dedup",
        s.produced, s.read, s.duplicates
    );
    let ids: Vec<String> = tally.schema_ids.iter().map(u32::to_string).collect();
    let _ = writeln!(
        f,
        "        outputs: {outputs}{}",
        match ids.len() {
            0 => String::new(),
            1 => format!("; schema id {}", ids[0]),
            _ => format!("; schema ids {}", ids.join(", ")),
        }
    );
    let _ = writeln!(
        f,
        "        event time: {}; {} in-band watermark records read back",
        watermarks(s),
        tally.markers
    );
    let _ = writeln!(
        f,
        "        {} polls ok, failed: {}",
        s.polls_ok,
        counts(&s.polls_failed)
    );
    let _ = writeln!(
        f,
        "        {} watches ended: {}",
        s.ended_total(),
        counts(&s.ended)
    );

    let served: u64 = s.users.iter().map(|u| u64::from(u.served.items)).sum();
    // After Ctrl-C, polls in flight are cancelled: an item may have been served and never
    // produced, so that check only applies to a run that finished.
    let all_served = interrupted || served == tally.outputs;
    let ok = tally.all_good() && all_served;
    let mut facts = vec![format!("{} outputs read back from Kafka", tally.outputs)];
    facts.push(if tally.repeated == 0 {
        "no output key was produced twice".into()
    } else {
        format!(
            "{} records repeat an output key read before",
            tally.repeated
        )
    });
    facts.push(if tally.on_time == tally.outputs {
        "every output's Kafka timestamp equals its item's `at`".into()
    } else {
        format!(
            "{} outputs have a Kafka timestamp other than their item's `at`",
            tally.outputs - tally.on_time
        )
    });
    if tally.undecoded > 0 {
        facts.push(format!("{} output values do not decode", tally.undecoded));
    }
    facts.push(if tally.mislabelled == 0 {
        "key and headers name each output's user and item".into()
    } else {
        format!("{} outputs are mislabelled", tally.mislabelled)
    });
    if !interrupted {
        facts.push(if served == tally.outputs {
            format!("every item the feeds served was produced ({served})")
        } else {
            format!(
                "the feeds served {served} items but {} were produced",
                tally.outputs
            )
        });
    }
    let check = format!(
        "check: {}: {}",
        if ok { "OK" } else { "FAILED" },
        facts.join("; ")
    );
    let _ = writeln!(f, "{check}");
    for p in &tally.problems {
        let _ = writeln!(f, "  problem: {p}");
    }
    (f, ok)
}

fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}
