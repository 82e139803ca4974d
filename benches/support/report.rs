//! What every benchmark reports: medians and spreads, rates, the machine and the versions,
//! and its section of `bench/RESULTS.md` (`bench/results/<bench>.md`, assembled by
//! `scripts/bench-report.sh`).

use std::process::Command;
use watchbridge::clock::Millis;

/// A size from the environment (`name`), else `default`; a value that is not a count stops
/// the bench naming the variable.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a count"))
        })
        .unwrap_or(default)
}

/// A list of millisecond counts from the environment (`name`, comma-separated), else
/// `default`; an item that is not a count stops the bench naming the variable.
pub fn env_ms_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|d| {
            d.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {d:?} is not a number of ms"))
        })
        .collect()
}

/// The command that ran `bench`, for its report: those of `vars` that are set, then
/// `cargo bench --bench <bench>`.
pub fn command_line(bench: &str, vars: &[&str]) -> String {
    let mut line: Vec<String> = vars
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
        .collect();
    line.push(format!("cargo bench --bench {bench}"));
    line.join(" ")
}

/// Now, as `YYYY-MM-DD HH:MM UTC`, for a report's date line.
pub fn utc_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute()
    )
}

/// Now, in ms since the epoch.
pub fn now_ms() -> Millis {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as Millis
}

/// The median of `values`; NaN for none (a case the run skipped).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

pub fn min_max(values: &[f64]) -> (f64, f64) {
    (
        values.iter().cloned().fold(f64::MAX, f64::min),
        values.iter().cloned().fold(f64::MIN, f64::max),
    )
}

pub fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("{program} (unknown)"))
}

pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ram = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| format!("{:.1} GiB RAM", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown RAM".into());
    format!("{cores} cores (nproc), {model}, {ram}")
}

pub fn rate(r: f64) -> String {
    // Thousands separated by commas, no decimals.
    let digits = format!("{:.0}", r);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A line of the summary table at the top of bench/RESULTS.md: a markdown comment in the
/// bench's section (invisible where the section is rendered), which `scripts/bench.sh`
/// collects from every section. `met`: the target is met (or the figure has none).
pub fn summary_line(figure: &str, measured: &str, target: &str, met: bool) -> String {
    let verdict = match (target.starts_with('('), met) {
        (true, _) => "",
        (false, true) => "met",
        (false, false) => "**not met**",
    };
    format!("<!-- summary: {figure} | {measured} | {target} | {verdict} -->\n")
}

/// Cores busy besides a job and its broker above which the job's figures count as disturbed
/// by other work on the machine (the versus benches' own observer and feed server use about
/// 0.1–0.25 at their highest rates).
pub const DISTURBED_CORES: f64 = 0.6;

/// The note a section carries (and the terminal gets) when, in some jobs, more than
/// [`DISTURBED_CORES`] were busy besides the job and the broker (`others`, one per job):
/// other work shared the machine and slowed whichever job it overlapped. Empty otherwise.
pub fn disturbed_note(others: &[f64]) -> String {
    let disturbed = others.iter().filter(|&&o| o > DISTURBED_CORES).count();
    if disturbed == 0 {
        return String::new();
    }
    let note = format!(
        "\n**Disturbed:** in {disturbed} of {} jobs more than {DISTURBED_CORES} cores were \
         busy besides the job and the broker: other work shared the machine. Re-run on a \
         quiet machine to replace these figures.\n",
        others.len()
    );
    eprint!("{note}");
    note
}
