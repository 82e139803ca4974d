//! Shard names `PREFIX-SSSSS-of-NNNNN` (Beam's and Hadoop's naming) and what the shards of
//! one output present say about the whole set: a watermark up to the first missing shard,
//! and final once all N are there. Shared by the sharded-files poller
//! ([`super::sharded`]) and the object-store poller ([`super::object_store`]).
//!
//! Shard numbers start at 0 or 1. With [`FirstShard::Auto`], a shard numbered 0 means
//! 0-based and a shard numbered N (the count) means 1-based; while neither has been seen the
//! numbering is taken as 1-based. That guess only matters for the watermark: completeness
//! needs N distinct numbers, which a 0-based set reaches only with shard 0 and a 1-based one
//! only with shard N, so a finished set is never misjudged.

use super::ConfigError;
use crate::clock::Millis;
use crate::poll::PollError;
use std::collections::BTreeMap;

/// Where shard numbers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirstShard {
    /// Decide from the shards present; see the module docs.
    #[default]
    Auto,
    Zero,
    One,
}

impl FirstShard {
    /// `auto` (or empty), `0` or `1`, from the variable `var`.
    pub fn parse(var: &'static str, text: &str) -> Result<Self, ConfigError> {
        match text.trim() {
            "auto" | "" => Ok(Self::Auto),
            "0" => Ok(Self::Zero),
            "1" => Ok(Self::One),
            other => Err(ConfigError::new(
                var,
                format!("`{other}` is not one of `auto`, `0` or `1`"),
            )),
        }
    }
}

/// One shard: its number, the count its name gives, its time, and its name for messages
/// (escaped: names are outside text).
#[derive(Debug, Clone)]
pub struct Shard {
    pub index: u64,
    pub of: u64,
    pub time: Millis,
    pub name: String,
}

/// `(shard, count)` from the last `-<digits>-of-<digits>` in a file name; anything may
/// precede it and a suffix (`.avro`) may follow.
pub fn parse_shard_name(name: &str) -> Option<(u64, u64)> {
    name.rmatch_indices("-of-").find_map(|(at, _)| {
        let before = &name[..at];
        let index_at = before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if index_at == before.len() || !before[..index_at].ends_with('-') {
            return None;
        }
        let after = &name[at + "-of-".len()..];
        let count_len = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if count_len == 0 {
            return None;
        }
        let index = before[index_at..].parse().ok()?;
        let of = after[..count_len].parse().ok()?;
        Some((index, of))
    })
}

/// What the shards present say about the whole set.
#[derive(Debug, PartialEq, Eq)]
pub struct Progress {
    /// The time of the last shard before the first missing one.
    pub watermark: Option<Millis>,
    /// Every shard is there.
    pub complete: bool,
}

fn inconsistent(message: String) -> PollError {
    PollError::transient("inconsistent_shards", message)
}

/// What the shards present say about the whole set; shards that cannot belong to one set
/// are a transient `inconsistent_shards` error. `first_shard_var` names the setting in it.
pub fn assess(
    shards: &[Shard],
    first_shard: FirstShard,
    first_shard_var: &str,
) -> Result<Progress, PollError> {
    let Some(first) = shards.first() else {
        return Ok(Progress {
            watermark: None,
            complete: false,
        });
    };
    let count = first.of;
    if let Some(other) = shards.iter().find(|s| s.of != count) {
        return Err(inconsistent(format!(
            "{} is one of {count} shards but {} is one of {}",
            first.name, other.name, other.of
        )));
    }
    if count == 0 {
        return Err(inconsistent(format!(
            "{} says there are 0 shards",
            first.name
        )));
    }
    let base = match first_shard {
        FirstShard::Zero => 0,
        FirstShard::One => 1,
        FirstShard::Auto => {
            let zero = shards.iter().find(|s| s.index == 0);
            let last = shards.iter().find(|s| s.index == count);
            match (zero, last) {
                (Some(zero), Some(last)) => {
                    return Err(inconsistent(format!(
                        "both shard 0 ({}) and shard {count} ({}) of {count} exist: neither \
                         0-based nor 1-based numbering fits",
                        zero.name, last.name
                    )))
                }
                (Some(_), None) => 0,
                (None, _) => 1,
            }
        }
    };
    let end = base + count - 1;
    if let Some(out) = shards.iter().find(|s| s.index < base || s.index > end) {
        return Err(inconsistent(format!(
            "{} is shard {}, outside {base}..={end} (shards of {count} numbered from {base}; \
             see {first_shard_var})",
            out.name, out.index
        )));
    }
    // A shard number matched by several files (e.g. two suffixes) counts once, at the
    // latest of their times.
    let mut times: BTreeMap<u64, Millis> = BTreeMap::new();
    for s in shards {
        let t = s.time;
        times
            .entry(s.index)
            .and_modify(|m| *m = (*m).max(t))
            .or_insert(t);
    }
    let watermark = (base..=end).map_while(|i| times.get(&i).copied()).last();
    Ok(Progress {
        watermark,
        complete: times.len() as u64 == count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_are_the_last_index_of_count() {
        assert_eq!(parse_shard_name("part-00003-of-00010"), Some((3, 10)));
        assert_eq!(parse_shard_name("out-00000-of-00003.avro"), Some((0, 3)));
        assert_eq!(parse_shard_name("a-1-of-2-b-7-of-9.txt"), Some((7, 9)));
        // A later `-of-` that is not a shard number does not hide an earlier one.
        assert_eq!(parse_shard_name("x-2-of-4-of-y"), Some((2, 4)));
        assert_eq!(parse_shard_name("-5-of-6"), Some((5, 6)));
        for not_a_shard in [
            "part-00003",
            "00003-of-00010",
            "part-x-of-10",
            "part-3-of-",
            "part-3-of-x",
            "part3-of-10",
            "part-99999999999999999999-of-1",
            "",
        ] {
            assert_eq!(parse_shard_name(not_a_shard), None, "{not_a_shard}");
        }
    }

    fn shards(list: &[(u64, u64, i64)]) -> Vec<Shard> {
        list.iter()
            .map(|&(index, of, time)| Shard {
                index,
                of,
                time,
                name: format!("/o/p-{index}-of-{of}-{time}"),
            })
            .collect()
    }

    fn progress(watermark: Option<Millis>, complete: bool) -> Progress {
        Progress {
            watermark,
            complete,
        }
    }

    #[test]
    fn watermark_stops_at_the_first_gap_and_all_shards_complete() {
        let s = shards(&[
            (1, 10, 100),
            (2, 10, 300),
            (3, 10, 200),
            (7, 10, 50),
            (8, 10, 60),
        ]);
        for first in [FirstShard::Auto, FirstShard::One] {
            assert_eq!(assess(&s, first, "X").unwrap(), progress(Some(200), false));
        }
        // 0-based, shard 0 missing: no watermark.
        assert_eq!(
            assess(&s, FirstShard::Zero, "X").unwrap(),
            progress(None, false)
        );
        assert_eq!(
            assess(&[], FirstShard::Auto, "X").unwrap(),
            progress(None, false)
        );

        let all: Vec<_> = (1..=3).map(|i| (i, 3, i as i64 * 10)).collect();
        assert_eq!(
            assess(&shards(&all), FirstShard::Auto, "X").unwrap(),
            progress(Some(30), true)
        );
        let zero_based = shards(&[(0, 3, 5), (1, 3, 6), (2, 3, 7)]);
        for first in [FirstShard::Auto, FirstShard::Zero] {
            assert_eq!(
                assess(&zero_based, first, "X").unwrap(),
                progress(Some(7), true)
            );
        }
        // Auto before shard 0 or N shows up: 1-based, but never complete.
        let partial = shards(&[(1, 3, 6), (2, 3, 7)]);
        assert_eq!(
            assess(&partial, FirstShard::Auto, "X").unwrap(),
            progress(Some(7), false)
        );
        // Duplicate numbers count once, at their latest time.
        let dup = shards(&[(1, 2, 6), (1, 2, 9), (2, 2, 3)]);
        assert_eq!(
            assess(&dup, FirstShard::Auto, "X").unwrap(),
            progress(Some(3), true)
        );
        let dup = shards(&[(1, 2, 6), (1, 2, 9)]);
        assert_eq!(
            assess(&dup, FirstShard::Auto, "X").unwrap(),
            progress(Some(9), false)
        );
    }

    #[test]
    fn shards_that_cannot_belong_together_are_an_error() {
        let err = |list: &[(u64, u64, i64)], first| assess(&shards(list), first, "X").unwrap_err();
        let e = err(&[(1, 3, 0), (2, 4, 0)], FirstShard::Auto);
        assert_eq!(e.kind, "inconsistent_shards");
        assert!(!e.permanent);
        assert!(
            e.message.contains("/o/p-1-of-3-0") && e.message.contains("/o/p-2-of-4-0"),
            "{e}"
        );
        let e = err(&[(0, 3, 0), (3, 3, 0)], FirstShard::Auto);
        assert!(e.message.contains("neither"), "{e}");
        let e = err(&[(3, 3, 0)], FirstShard::Zero);
        assert!(e.message.contains("outside 0..=2"), "{e}");
        let e = err(&[(0, 3, 0)], FirstShard::One);
        assert!(e.message.contains("outside 1..=3"), "{e}");
        let e = err(&[(5, 3, 0)], FirstShard::Auto);
        assert!(e.message.contains("is shard 5, outside 1..=3"), "{e}");
        let e = err(&[(0, 0, 0)], FirstShard::Auto);
        assert!(e.message.contains("0 shards"), "{e}");
    }
}
