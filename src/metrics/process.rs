//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! …, the names every Prometheus client library exports), read from `/proc/self` at each
//! scrape. Linux only: the `prometheus` crate's own collector needs `procfs`, which this
//! build does not otherwise pull in, and these few files are simple to read.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{Counter, Gauge};
use std::sync::Mutex;

/// What `/proc/self/stat` says that is exported (fields 14, 15, 22, 23, 24 of proc(5)).
#[derive(Debug, PartialEq)]
struct Stat {
    /// Clock ticks in user and kernel mode.
    cpu_ticks: u64,
    /// Clock ticks after boot when the process started.
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Parse `/proc/self/stat`. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// The boot time (`btime`, Unix seconds) from `/proc/stat`.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit on open files from `/proc/self/limits`; `unlimited` is infinite.
fn parse_max_fds(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(f64::INFINITY);
    }
    soft.parse::<u64>().ok().map(|n| n as f64)
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf reads a system constant; it has no memory effects.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|&v| v > 0)
}

/// The collector: each scrape reads `/proc` and sets these, then renders them. A file that
/// cannot be read leaves its metrics out of that scrape (and logs nothing: a scrape every
/// 15 s must not fill the log).
pub struct ProcessCollector {
    cpu: Counter,
    /// The last CPU seconds counted, so the counter can be moved by the difference.
    cpu_seen: Mutex<f64>,
    resident: Gauge,
    virtual_memory: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge,
    descs: Vec<Desc>,
    ticks_per_second: f64,
    page_size: f64,
}

impl ProcessCollector {
    pub fn new() -> prometheus::Result<Self> {
        let cpu = Counter::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds",
        )?;
        let gauge = Gauge::new;
        let resident = gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
        )?;
        let virtual_memory = gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
        )?;
        let open_fds = gauge("process_open_fds", "Number of open file descriptors")?;
        let max_fds = gauge(
            "process_max_fds",
            "Maximum number of open file descriptors (the soft limit)",
        )?;
        let start_time = gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
        )?;
        let mut descs = Vec::new();
        descs.extend(cpu.desc().into_iter().cloned());
        for g in [&resident, &virtual_memory, &open_fds, &max_fds, &start_time] {
            descs.extend(g.desc().into_iter().cloned());
        }
        Ok(Self {
            cpu,
            cpu_seen: Mutex::new(0.0),
            resident,
            virtual_memory,
            open_fds,
            max_fds,
            start_time,
            descs,
            // 100 on every Linux in practice; asked all the same.
            ticks_per_second: sysconf(libc::_SC_CLK_TCK).unwrap_or(100) as f64,
            page_size: sysconf(libc::_SC_PAGESIZE).unwrap_or(4096) as f64,
        })
    }

    /// The families it renders, with their types (for [`super::Metrics::families`]).
    pub fn families(&self) -> Vec<(String, MetricType)> {
        self.descs
            .iter()
            .map(|d| {
                let kind = if d.fq_name.ends_with("_total") {
                    MetricType::COUNTER
                } else {
                    MetricType::GAUGE
                };
                (d.fq_name.clone(), kind)
            })
            .collect()
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let mut out = Vec::new();
        if let Some(stat) = read("/proc/self/stat").as_deref().and_then(parse_stat) {
            let cpu = stat.cpu_ticks as f64 / self.ticks_per_second;
            let mut seen = self.cpu_seen.lock().unwrap_or_else(|p| p.into_inner());
            if cpu > *seen {
                self.cpu.inc_by(cpu - *seen);
                *seen = cpu;
            }
            out.extend(self.cpu.collect());
            self.resident
                .set(stat.resident_pages as f64 * self.page_size);
            out.extend(self.resident.collect());
            self.virtual_memory.set(stat.virtual_bytes as f64);
            out.extend(self.virtual_memory.collect());
            if let Some(boot) = read("/proc/stat").as_deref().and_then(parse_boot_time) {
                self.start_time
                    .set(boot as f64 + stat.start_ticks as f64 / self.ticks_per_second);
                out.extend(self.start_time.collect());
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor, open while it is listed, is counted too (as
            // every client library's collector does).
            self.open_fds.set(fds.count() as f64);
            out.extend(self.open_fds.collect());
        }
        if let Some(max) = read("/proc/self/limits").as_deref().and_then(parse_max_fds) {
            self.max_fds.set(max);
            out.extend(self.max_fds.collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis in it; fields from proc(5)'s order.
        let text = "4242 (wb (x) y) S 1 4242 4242 0 -1 4194560 3000 0 0 0 \
                    250 125 0 0 20 0 9 0 778899 123456789 4321 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17920 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 375,
                start_ticks: 778899,
                virtual_bytes: 123456789,
                resident_pages: 4321,
            })
        );
        assert_eq!(parse_stat("4242 (cut short) S 1 2"), None);
    }

    #[test]
    fn boot_time_and_the_open_files_limit() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1764979200\nprocesses 9\n"),
            Some(1764979200)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024.0));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Some(f64::INFINITY)
        );
        assert_eq!(parse_max_fds("Max processes 10 10 processes\n"), None);
    }

    /// This very process, read as a scrape reads it: plausible values for each.
    #[test]
    fn this_process_is_measured() {
        let c = ProcessCollector::new().unwrap();
        let value = |name: &str| {
            c.collect()
                .into_iter()
                .find(|f| f.name() == name)
                .map(|f| {
                    let m = &f.get_metric()[0];
                    if f.get_field_type() == MetricType::COUNTER {
                        m.get_counter().get_value()
                    } else {
                        m.get_gauge().get_value()
                    }
                })
                .unwrap_or_else(|| panic!("no {name}"))
        };
        // Burn a little CPU so the counter has something to count.
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(value("process_cpu_seconds_total") > 0.0);
        let rss = value("process_resident_memory_bytes");
        assert!(rss > 1e6, "resident {rss}");
        assert!(value("process_virtual_memory_bytes") >= rss);
        let open = value("process_open_fds");
        assert!(open >= 3.0, "open fds {open}");
        assert!(value("process_max_fds") >= open);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "start {start}, now {now}"
        );
        assert_eq!(
            c.families()
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            [
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_virtual_memory_bytes",
                "process_open_fds",
                "process_max_fds",
                "process_start_time_seconds"
            ]
        );
    }
}
