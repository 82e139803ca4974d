//! CPU time from /proc: of one process, and of the whole machine (to tell a figure
//! disturbed by other work on the same cores).

/// Busy time of every core (the first line of `/proc/stat` less idle and iowait), seconds.
pub fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user already).
    let busy: f64 = ticks.iter().take(8).sum::<f64>()
        - ticks.get(3).copied().unwrap_or(0.0)
        - ticks.get(4).copied().unwrap_or(0.0);
    busy / 100.0
}

/// utime + stime of `/proc/PID/stat`, in seconds (clock ticks of 1/100 s, Linux's
/// `USER_HZ`); 0 where it cannot be read.
pub fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces: the
    // state is field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
