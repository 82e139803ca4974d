//! When a watch polls next.
//!
//! A fixed interval, stretched by exponential backoff while polls bring nothing new (a quiet
//! resource is asked less often; the first new output resets it), spread by jitter (so inputs
//! that arrived together do not poll together forever), and a separate retry policy for
//! failed polls whose limit ends the watch as `failed`. Pure functions of counters the watch
//! keeps, plus a random source the caller owns (seeded in tests).
//!
//! A resource's `Retry-After` is a floor under the retry delay, but only up to
//! [`Retry::after_max`]: the resource is not trusted to park a watch for years.

use std::fmt;
use std::time::Duration;

/// How often to poll while the resource is quiet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Each poll without a new output multiplies the delay by this (> 1).
    pub factor: f64,
    /// The delay never grows past this.
    pub max: Duration,
}

/// How to retry a failed poll.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// Delay before the first retry; doubles with each further consecutive failure.
    pub initial: Duration,
    /// The retry delay never grows past this (a `Retry-After` from the resource may ask for
    /// more, up to `after_max`).
    pub max: Duration,
    /// The longest wait a resource's `Retry-After` can impose; a longer request is cut to
    /// this (`0`: `Retry-After` is ignored). `None`: `max`, so that by default no failure
    /// waits longer than the retry maximum.
    pub after_max: Option<Duration>,
    /// How many retries in a row are allowed; the failure after them ends the watch as
    /// `failed`. `0` fails the watch on its first error; `u32::MAX` never does.
    pub limit: u32,
}

impl Retry {
    /// The retry limit whose retries span `duration`: the fewest retries whose delays
    /// (`initial` doubling up to `max`, before jitter and `Retry-After`) add up to at least
    /// `duration`; a watch that keeps failing then ends `failed` about `duration` after its
    /// first failure (plus the polls' own time). `u32::MAX` (no limit) when that is more
    /// retries than a `u32` counts.
    pub fn limit_for(duration: Duration, initial: Duration, max: Duration) -> u32 {
        let (target, max) = (duration.as_secs_f64(), max.as_secs_f64());
        let mut delay = initial.as_secs_f64().min(max);
        if target <= 0.0 {
            return 0;
        }
        if delay <= 0.0 {
            return u32::MAX;
        }
        let mut spanned = 0.0;
        let mut retries: u32 = 0;
        while spanned < target {
            if delay >= max {
                // Every further delay is `max`.
                let more = ((target - spanned) / max).ceil();
                return if more >= f64::from(u32::MAX - retries) {
                    u32::MAX
                } else {
                    retries + more as u32
                };
            }
            spanned += delay;
            retries += 1;
            delay = (delay * 2.0).min(max);
        }
        retries
    }
}

/// When a watch polls: every `interval`, stretched by `backoff` while polls find nothing
/// new, moved by `jitter`, and after failures as `retry` says (`WATCHBRIDGE_POLL_INTERVAL`,
/// `WATCHBRIDGE_BACKOFF`, `WATCHBRIDGE_JITTER`, `WATCHBRIDGE_RETRY_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The time between two polls of a watch.
    pub interval: Duration,
    /// How the interval grows while polls find nothing new (`None`: it does not).
    pub backoff: Option<Backoff>,
    /// Fraction of each delay by which it is randomly moved, both ways: `0.1` turns a 10 s
    /// delay into one uniformly in [9 s, 11 s]. `0` disables it.
    pub jitter: f64,
    /// How failed polls are retried, and when a watch gives up.
    pub retry: Retry,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            backoff: None,
            jitter: 0.1,
            retry: Retry {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
                after_max: None,
                limit: 5,
            },
        }
    }
}

/// A schedule setting that makes no sense: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", setting.variable())]
pub struct ScheduleError {
    /// The part of the schedule that is wrong.
    pub setting: ScheduleSetting,
    /// Why.
    pub message: String,
}

/// A part of a [`Schedule`], as a setting of `watchbridge run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleSetting {
    /// [`Schedule::interval`].
    Interval,
    /// [`Schedule::jitter`].
    Jitter,
    /// [`Schedule::backoff`].
    Backoff,
    /// [`Retry::initial`].
    RetryInitial,
    /// [`Retry::max`].
    RetryMax,
}

impl ScheduleSetting {
    /// The environment variable that sets it.
    pub fn variable(self) -> &'static str {
        match self {
            Self::Interval => "WATCHBRIDGE_POLL_INTERVAL",
            Self::Jitter => "WATCHBRIDGE_POLL_JITTER",
            Self::Backoff => "WATCHBRIDGE_BACKOFF",
            Self::RetryInitial => "WATCHBRIDGE_RETRY_INITIAL_BACKOFF",
            Self::RetryMax => "WATCHBRIDGE_RETRY_MAX_BACKOFF",
        }
    }
}

/// What the next poll of a watch should be, after a failed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Poll again after this long.
    RetryIn(Duration),
    /// The retry limit is reached: the watch ends `failed`.
    GiveUp,
}

impl Retry {
    /// The longest wait a resource's `Retry-After` can impose: `after_max`, else `max`.
    pub fn retry_after_cap(&self) -> Duration {
        self.after_max.unwrap_or(self.max)
    }

    /// A resource's `Retry-After` as the schedule honours it: at most
    /// [`retry_after_cap`](Self::retry_after_cap). Returns the delay to honour and whether
    /// it was cut.
    pub fn cap_retry_after(&self, requested: Duration) -> (Duration, bool) {
        let cap = self.retry_after_cap();
        if requested > cap {
            (cap, true)
        } else {
            (requested, false)
        }
    }
}

impl Schedule {
    /// Reject settings that would spin or never poll, naming the setting (the one place
    /// these rules live: `watchbridge run`'s settings and a library's schedule alike).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        use ScheduleSetting::*;
        let bad = |setting, message: String| Err(ScheduleError { setting, message });
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.interval.is_zero() {
            return bad(Interval, "must be more than zero".into());
        }
        if !(0.0..1.0).contains(&self.jitter) {
            let j = self.jitter;
            return bad(
                Jitter,
                format!("`{j}` is not a fraction from 0 to below 1 (e.g. 0.1)"),
            );
        }
        if let Some(b) = self.backoff {
            if !(b.factor.is_finite() && b.factor >= 1.0) {
                let f = b.factor;
                return bad(
                    Backoff,
                    format!("the factor must be at least 1 (e.g. 2x), not {f}"),
                );
            }
            if b.max < self.interval {
                return bad(
                    Backoff,
                    format!(
                        "the max ({}) is below WATCHBRIDGE_POLL_INTERVAL ({}): the backoff only \
                         ever stretches the interval",
                        show(b.max),
                        show(self.interval)
                    ),
                );
            }
        }
        if self.retry.initial.is_zero() {
            return bad(RetryInitial, "must be more than zero".into());
        }
        if self.retry.max < self.retry.initial {
            return bad(
                RetryMax,
                format!(
                    "{} is below WATCHBRIDGE_RETRY_INITIAL_BACKOFF ({})",
                    show(self.retry.max),
                    show(self.retry.initial)
                ),
            );
        }
        Ok(())
    }

    /// The delay before the next poll, before jitter, after `empty_streak` consecutive
    /// successful polls that brought nothing new (0: the last poll brought something).
    pub fn base_delay(&self, empty_streak: u32) -> Duration {
        match self.backoff {
            None => self.interval,
            Some(b) => {
                let grown =
                    self.interval.as_secs_f64() * b.factor.powi(empty_streak.min(1024) as i32);
                if grown.is_finite() && grown < b.max.as_secs_f64() {
                    Duration::from_secs_f64(grown)
                } else {
                    b.max
                }
            }
        }
    }

    /// The longest delay this schedule can put before a poll (the interval or backoff max,
    /// the retry max or the `Retry-After` cap, jittered up). A restored watch whose saved
    /// poll is further away (an uncapped `Retry-After` saved by an older version) is due by
    /// then instead.
    pub fn longest_delay(&self) -> Duration {
        let base = self
            .backoff
            .map_or(self.interval, |b| b.max.max(self.interval))
            .max(self.retry.max)
            .max(self.retry.retry_after_cap());
        Duration::try_from_secs_f64(base.as_secs_f64() * (1.0 + self.jitter.max(0.0)))
            .unwrap_or(Duration::MAX)
    }

    /// The delay before the next poll after a successful one, jittered.
    pub fn after_success(&self, empty_streak: u32, rng: &mut fastrand::Rng) -> Duration {
        jitter(self.base_delay(empty_streak), self.jitter, rng)
    }

    /// What to do after the `failures`-th failed poll in a row (1 for the first), given
    /// the resource's `Retry-After`, if any: a floor under the delay, capped at
    /// [`Retry::retry_after_cap`] (the jittered backoff is still waited if longer).
    pub fn after_failure(
        &self,
        failures: u32,
        retry_after: Option<Duration>,
        rng: &mut fastrand::Rng,
    ) -> AfterFailure {
        if failures > self.retry.limit {
            return AfterFailure::GiveUp;
        }
        let doublings = failures.saturating_sub(1).min(63);
        let base = self
            .retry
            .initial
            .checked_mul(1u32 << doublings.min(31))
            .map_or(self.retry.max, |d| d.min(self.retry.max));
        let delay = jitter(base, self.jitter, rng);
        let floor = retry_after.map(|ra| self.retry.cap_retry_after(ra).0);
        AfterFailure::RetryIn(floor.map_or(delay, |ra| delay.max(ra)))
    }
}

/// `d` moved uniformly within ±`fraction` of itself.
pub fn jitter(d: Duration, fraction: f64, rng: &mut fastrand::Rng) -> Duration {
    if fraction <= 0.0 {
        return d;
    }
    let factor = 1.0 + fraction * (2.0 * rng.f64() - 1.0);
    Duration::from_secs_f64(d.as_secs_f64() * factor)
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "every {}", humantime::format_duration(self.interval))?;
        if let Some(b) = self.backoff {
            write!(
                f,
                ", backoff x{} up to {}",
                b.factor,
                humantime::format_duration(b.max)
            )?;
        }
        write!(
            f,
            ", jitter {}%, retries {} from {} up to {} (Retry-After up to {})",
            self.jitter * 100.0,
            self.retry.limit,
            humantime::format_duration(self.retry.initial),
            humantime::format_duration(self.retry.max),
            humantime::format_duration(self.retry.retry_after_cap())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn no_jitter() -> Schedule {
        Schedule {
            jitter: 0.0,
            ..Schedule::default()
        }
    }

    #[test]
    fn fixed_interval_ignores_empty_streak() {
        let s = no_jitter();
        let mut rng = fastrand::Rng::with_seed(1);
        for streak in [0, 1, 5, 1000] {
            assert_eq!(s.after_success(streak, &mut rng), secs(10.0));
        }
    }

    #[test]
    fn backoff_grows_by_factor_and_stops_at_max() {
        let s = Schedule {
            backoff: Some(Backoff {
                factor: 2.0,
                max: secs(60.0),
            }),
            ..no_jitter()
        };
        let delays: Vec<f64> = (0..6).map(|n| s.base_delay(n).as_secs_f64()).collect();
        assert_eq!(delays, vec![10.0, 20.0, 40.0, 60.0, 60.0, 60.0]);
        // Huge streaks saturate at max instead of overflowing.
        assert_eq!(s.base_delay(u32::MAX), secs(60.0));
    }

    #[test]
    fn jitter_stays_within_bounds_and_actually_varies() {
        let s = Schedule {
            jitter: 0.2,
            ..Schedule::default()
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let delays: Vec<f64> = (0..10_000)
            .map(|_| s.after_success(0, &mut rng).as_secs_f64())
            .collect();
        let (lo, hi) = delays
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &d| (lo.min(d), hi.max(d)));
        assert!(lo >= 8.0 && hi <= 12.0, "jittered range [{lo}, {hi}]");
        // Uniform spread: both ends of the window are reached closely.
        assert!(
            lo < 8.05 && hi > 11.95,
            "jitter barely spreads: [{lo}, {hi}]"
        );
    }

    #[test]
    fn jitter_with_backoff_is_bounded_around_the_backed_off_delay() {
        let s = Schedule {
            jitter: 0.1,
            backoff: Some(Backoff {
                factor: 3.0,
                max: secs(100.0),
            }),
            ..Schedule::default()
        };
        let mut rng = fastrand::Rng::with_seed(3);
        for streak in 0..8 {
            let base = s.base_delay(streak).as_secs_f64();
            for _ in 0..500 {
                let d = s.after_success(streak, &mut rng).as_secs_f64();
                assert!(d >= base * 0.9 - 1e-9 && d <= base * 1.1 + 1e-9);
            }
        }
    }

    #[test]
    fn retries_double_up_to_max_then_give_up_after_limit() {
        let s = Schedule {
            retry: Retry {
                initial: secs(1.0),
                max: secs(5.0),
                after_max: None,
                limit: 4,
            },
            ..no_jitter()
        };
        let mut rng = fastrand::Rng::with_seed(1);
        let got: Vec<AfterFailure> = (1..=5)
            .map(|n| s.after_failure(n, None, &mut rng))
            .collect();
        assert_eq!(
            got,
            vec![
                AfterFailure::RetryIn(secs(1.0)),
                AfterFailure::RetryIn(secs(2.0)),
                AfterFailure::RetryIn(secs(4.0)),
                AfterFailure::RetryIn(secs(5.0)),
                AfterFailure::GiveUp,
            ]
        );
    }

    #[test]
    fn limit_zero_fails_on_first_error() {
        let mut s = no_jitter();
        s.retry.limit = 0;
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(s.after_failure(1, None, &mut rng), AfterFailure::GiveUp);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let s = no_jitter();
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(
            s.after_failure(1, Some(secs(30.0)), &mut rng),
            AfterFailure::RetryIn(secs(30.0))
        );
        assert_eq!(
            s.after_failure(1, Some(secs(0.1)), &mut rng),
            AfterFailure::RetryIn(secs(1.0))
        );
    }

    #[test]
    fn retry_after_is_capped_at_after_max() {
        let mut s = no_jitter();
        let mut rng = fastrand::Rng::with_seed(1);
        // About 3,000 years: cut to the default cap (the retry maximum, 60 s).
        let forever = Duration::from_secs(99_999_999_999);
        assert_eq!(
            s.after_failure(1, Some(forever), &mut rng),
            AfterFailure::RetryIn(secs(60.0))
        );
        assert_eq!(
            s.after_failure(1, Some(Duration::MAX), &mut rng),
            AfterFailure::RetryIn(secs(60.0))
        );
        assert_eq!(s.retry.cap_retry_after(forever), (secs(60.0), true));
        assert_eq!(s.retry.cap_retry_after(secs(60.0)), (secs(60.0), false));
        // A cap of 0 ignores Retry-After: the backoff alone decides.
        s.retry.after_max = Some(Duration::ZERO);
        assert_eq!(
            s.after_failure(2, Some(forever), &mut rng),
            AfterFailure::RetryIn(secs(2.0))
        );
    }

    #[test]
    fn the_longest_delay_bounds_every_delay_the_schedule_gives() {
        let s = Schedule::default();
        assert_eq!(
            s.longest_delay(),
            secs(66.0),
            "the retry max, 60 s, jittered up 10%"
        );
        let mut rng = fastrand::Rng::with_seed(9);
        for n in 1..=5 {
            let AfterFailure::RetryIn(d) = s.after_failure(n, Some(Duration::MAX), &mut rng) else {
                panic!("retried")
            };
            assert!(d <= s.longest_delay(), "{d:?}");
        }
        let big = Schedule {
            interval: Duration::MAX,
            ..Schedule::default()
        };
        assert_eq!(big.longest_delay(), Duration::MAX, "saturates");
        let mut s = no_jitter();
        s.retry.after_max = Some(secs(3600.0));
        assert_eq!(s.longest_delay(), secs(3600.0));
    }

    #[test]
    fn validate_names_the_bad_setting() {
        use ScheduleSetting as S;
        let with = |change: fn(&mut Schedule)| {
            let mut s = Schedule::default();
            change(&mut s);
            let e = s.validate().unwrap_err();
            assert!(e.to_string().starts_with(e.setting.variable()), "{e}");
            (e.setting, e.message)
        };
        assert_eq!(with(|s| s.interval = Duration::ZERO).0, S::Interval);
        let (setting, message) = with(|s| s.jitter = 1.5);
        assert_eq!(setting, S::Jitter);
        assert!(message.contains("`1.5`"), "{message}");
        let (setting, message) = with(|s| {
            s.backoff = Some(Backoff {
                factor: 0.5,
                max: secs(60.0),
            })
        });
        assert_eq!(setting, S::Backoff);
        assert!(message.contains("factor"), "{message}");
        let (setting, message) = with(|s| {
            s.backoff = Some(Backoff {
                factor: 2.0,
                max: secs(1.0),
            })
        });
        assert_eq!(setting, S::Backoff);
        assert!(
            message.contains("below WATCHBRIDGE_POLL_INTERVAL"),
            "{message}"
        );
        assert_eq!(
            with(|s| s.retry.initial = Duration::ZERO).0,
            S::RetryInitial
        );
        assert_eq!(
            with(|s| s.retry.max = Duration::from_millis(1)).0,
            S::RetryMax
        );
        assert!(Schedule::default().validate().is_ok());
    }

    #[test]
    fn a_retry_duration_becomes_the_retries_whose_delays_span_it() {
        let (initial, max) = (secs(1.0), secs(60.0));
        let limit = |d: f64| Retry::limit_for(secs(d), initial, max);
        assert_eq!(limit(0.0), 0);
        assert_eq!(limit(1.0), 1);
        assert_eq!(limit(1.5), 2);
        assert_eq!(limit(31.0), 5, "the default limit spans 31 s");
        assert_eq!(limit(32.0), 6);
        // 1+2+4+8+16+32 = 63 s after 6 retries, then 60 s each.
        assert_eq!(limit(600.0), 15);
        assert_eq!(
            Retry::limit_for(
                Duration::MAX,
                Duration::from_nanos(1),
                Duration::from_nanos(1)
            ),
            u32::MAX,
            "too many to count: unlimited"
        );
    }
}
