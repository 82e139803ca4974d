//! Which guarantee the consumer group runs, asked before an instance joins it: one group in
//! two modes loses or doubles outputs when a partition moves between them (a transactional
//! owner's open transaction is not fenced by a `recovery` owner, whose records a
//! `read_committed` reader still sees; issue 46 saw `auto` choose both on a fresh cluster).
//!
//! Every partition task writes its guarantee to its state partition (`~mode`, the last
//! record of each batch of state records it writes: `kafka/partition/state.rs`), so the
//! mode of the partition's last writer is among its last few records. At start, before it
//! subscribes, an instance reads the last [`TAIL`] records of every state partition (up
//! to the last stable offset) and asks the group how many members it has:
//!
//! - members and a recorded mode of the other kind (transactional or not; `recovery` and
//!   `at_least_once` write alike) → the instance refuses to start, naming
//!   `WATCHBRIDGE_GUARANTEE`, the mode the group runs and its own;
//! - `auto` with members → the group's mode, without asking the broker;
//! - no member (every instance stopped) → the setting (or `auto`'s answer) goes, and a
//!   switch from the recorded mode is logged: that is how a group changes its mode.
//!
//! Where it cannot tell (a partition whose tail holds no `~mode`: written by an older
//! version, or by nobody yet), that partition says nothing. Two instances of different
//! settings started at the same moment on a group with nothing recorded both start; a
//! partition's recovery then warns when its last writer ran another mode.

use super::guarantee::{Guarantee, GuaranteeSetting};
use super::health::KafkaContext;
use super::leaders::electing;
use super::list_offsets::list_offsets;
use super::recovery::{read_to_ends, Reader};
use crate::state::{decode_entry, Entry, MODE_KEY};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset};
use std::collections::BTreeMap;
use std::time::Duration;

/// How many offsets before a state partition's last stable offset are read for its
/// `~mode`: a batch's `~mode` is followed by at most its output-offsets record and a
/// transaction marker.
pub const TAIL: i64 = 32;

/// How long the start's reads for the group's mode may take.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// What the start found of the group's mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMode {
    /// State partition → the mode its last writer recorded (where its tail holds one).
    pub recorded: BTreeMap<i32, Guarantee>,
    /// How many members the group has now (`None`: it could not be asked).
    pub members: Option<usize>,
}

/// Whether `g` writes through transactions: the two kinds must not share a group.
fn transactional(g: Guarantee) -> bool {
    g == Guarantee::ExactlyOnce
}

/// Read the group's mode (blocking): the `~mode` records in the tails of the state topic's
/// `partitions`, and, where one is recorded, the group's member count. What cannot be read
/// is logged and left out. `consumer_config`: a recovery reader's
/// ([`KafkaSettings::recovery_reader`], read committed).
///
/// [`KafkaSettings::recovery_reader`]: super::clients::KafkaSettings::recovery_reader
pub fn read(
    consumer_config: &ClientConfig,
    kafka: &KafkaContext,
    group: &str,
    state_topic: &str,
    partitions: i32,
) -> GroupMode {
    let mut reader = Reader::new(consumer_config, kafka);
    reader.timeout = READ_TIMEOUT;
    // A state topic this start created a moment ago may have a leader in the metadata that
    // does not know it leads yet (`NotLeaderForPartition` from Apache Kafka): asked again.
    let deadline = std::time::Instant::now() + RETRY_FOR;
    let recorded = loop {
        match recorded_modes(&mut reader, state_topic, partitions) {
            Ok(recorded) => break recorded,
            Err((_, e)) if e.transient && std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e.text, topic = state_topic, "the state partitions' modes: asking again");
                if let Ok(client) = reader.consumer() {
                    let _ = client.fetch_metadata(Some(state_topic), Duration::from_secs(5));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err((recorded, e)) => {
                tracing::warn!(error = %e.text, topic = state_topic, "cannot read every state partition's mode; going on with those read");
                break recorded;
            }
        }
    };
    // Asked only where a mode is recorded: without one, who runs does not matter.
    if recorded.is_empty() {
        return GroupMode {
            recorded,
            members: Some(0),
        };
    }
    let members = match reader.consumer().and_then(|c| {
        c.fetch_group_list(Some(group), READ_TIMEOUT)
            .map_err(|e| e.to_string())
    }) {
        Ok(list) => Some(
            list.groups()
                .iter()
                .filter(|g| g.name() == group)
                .map(|g| g.members().len())
                .sum(),
        ),
        // Tansu 0.6 drops the connection on DescribeGroups for a group it knows.
        Err(e) => {
            tracing::info!(error = %e, group, "cannot list the consumer group's members; taking it as running");
            None
        }
    };
    GroupMode { recorded, members }
}

type Recorded = BTreeMap<i32, Guarantee>;

/// How long a read of the modes that failed for a passing reason is asked again.
const RETRY_FOR: Duration = Duration::from_secs(10);

/// Why the modes could not all be read, and whether asking again may help.
struct ReadError {
    text: String,
    transient: bool,
}

impl ReadError {
    fn of(e: &KafkaError) -> Self {
        Self {
            text: e.to_string(),
            transient: e.rdkafka_error_code().is_some_and(electing),
        }
    }

    fn other(text: String) -> Self {
        Self {
            text,
            transient: false,
        }
    }
}

/// The last `~mode` in the tail of each state partition; with an error, those read.
fn recorded_modes(
    reader: &mut Reader<'_>,
    topic: &str,
    partitions: i32,
) -> Result<Recorded, (Recorded, ReadError)> {
    let mut recorded = BTreeMap::new();
    let asked: Vec<(&str, i32)> = (0..partitions).map(|p| (topic, p)).collect();
    let offsets = (|| {
        let client = reader.consumer().map_err(ReadError::other)?;
        let firsts = list_offsets(client, &asked, Offset::Beginning, READ_TIMEOUT);
        let ends = list_offsets(client, &asked, Offset::End, READ_TIMEOUT);
        let (firsts, ends) = (
            firsts.map_err(|e| ReadError::of(&e))?,
            ends.map_err(|e| ReadError::of(&e))?,
        );
        (0..partitions)
            .map(|p| {
                let first = firsts.offset(topic, p).map_err(ReadError::other)?;
                let end = ends.offset(topic, p).map_err(ReadError::other)?;
                Ok((p, first.max(end - TAIL), end))
            })
            .collect::<Result<Vec<_>, ReadError>>()
    })();
    let ranges = match offsets {
        Ok(ranges) => ranges,
        Err(e) => return Err((recorded, e)),
    };
    let read = read_to_ends(reader, topic, &ranges, |m| {
        use rdkafka::Message;
        if m.key() != Some(MODE_KEY) {
            return;
        }
        if let Ok(Entry::Mode(Some(mode))) = decode_entry(MODE_KEY, m.payload()) {
            if let Ok(GuaranteeSetting::Fixed(g)) = GuaranteeSetting::parse(&mode.mode) {
                recorded.insert(m.partition(), g);
            }
        }
    });
    match read {
        Ok(()) => Ok(recorded),
        Err(e) => Err((recorded, ReadError::other(e.to_string()))),
    }
}

/// What the start settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub guarantee: Guarantee,
    /// `auto` took the mode the group runs (without asking the broker).
    pub adopted: bool,
    /// Modes recorded by a group with no member now that this instance's differs from: it
    /// switches the group.
    pub switched_from: Vec<Guarantee>,
}

/// The guarantee this instance runs, given the setting and what the group runs (`group`,
/// of consumer group `group_id` with state topic `state_topic`); `auto` asks `choose`
/// unless the group's running members settle it. `Err`: the refusal, naming
/// `WATCHBRIDGE_GUARANTEE`, the group's mode and this instance's.
pub fn settle(
    setting: GuaranteeSetting,
    group: &GroupMode,
    group_id: &str,
    state_topic: &str,
    choose: impl FnOnce() -> Result<Guarantee, String>,
) -> Result<Settled, String> {
    // A group that cannot be asked may have members: the safe side.
    let running = group.members != Some(0);
    let mut modes: Vec<Guarantee> = group.recorded.values().copied().collect();
    modes.sort_by_key(|g| g.to_string());
    modes.dedup();
    let mut kinds: Vec<bool> = modes.iter().map(|&g| transactional(g)).collect();
    kinds.sort();
    kinds.dedup();
    let (guarantee, adopted) = match setting {
        GuaranteeSetting::Fixed(g) => (g, false),
        GuaranteeSetting::Auto if running && kinds.len() == 1 => {
            let g = if kinds[0] {
                Guarantee::ExactlyOnce
            } else {
                Guarantee::Recovery
            };
            (g, true)
        }
        GuaranteeSetting::Auto => (choose()?, false),
    };
    let other: Vec<Guarantee> = modes
        .into_iter()
        .filter(|&g| transactional(g) != transactional(guarantee))
        .collect();
    if !running || other.is_empty() {
        return Ok(Settled {
            guarantee,
            adopted,
            switched_from: other,
        });
    }
    let runs = other
        .iter()
        .map(|g| format!("`{g}`"))
        .collect::<Vec<_>>()
        .join(" and ");
    let members = match group.members {
        Some(n) => format!("{n} member(s) in the group now"),
        None => "its members could not be listed".to_string(),
    };
    let setting = match setting {
        GuaranteeSetting::Auto => "auto",
        GuaranteeSetting::Fixed(_) => "set",
    };
    Err(format!(
        "WATCHBRIDGE_GUARANTEE: consumer group `{group_id}` runs {runs} (recorded by its \
         instances on the state topic `{state_topic}`; {members}), and this instance chose \
         `{guarantee}` ({setting}): one group in two modes loses or doubles outputs when a \
         partition moves between them, so it does not join. Set WATCHBRIDGE_GUARANTEE to the \
         group's mode (or auto, which takes it), or stop every instance of the group before \
         switching it to `{guarantee}` (a member that crashed counts until its session \
         timeout)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Guarantee::*;

    fn group(recorded: &[(i32, Guarantee)], members: Option<usize>) -> GroupMode {
        GroupMode {
            recorded: recorded.iter().copied().collect(),
            members,
        }
    }

    fn settled(setting: GuaranteeSetting, g: &GroupMode) -> Result<Settled, String> {
        settle(setting, g, "g", "g.state", || Ok(ExactlyOnce))
    }

    #[test]
    fn an_instance_of_the_other_kind_is_refused_while_the_group_has_members() {
        let eo = group(&[(0, ExactlyOnce), (1, ExactlyOnce)], Some(2));
        let e = settled(GuaranteeSetting::Fixed(Recovery), &eo).unwrap_err();
        assert!(
            e.contains("WATCHBRIDGE_GUARANTEE")
                && e.contains("runs `exactly_once`")
                && e.contains("chose `recovery`")
                && e.contains("2 member(s)"),
            "{e}"
        );
        let rec = group(&[(0, Recovery)], Some(1));
        let e = settled(GuaranteeSetting::Fixed(ExactlyOnce), &rec).unwrap_err();
        assert!(
            e.contains("runs `recovery`") && e.contains("chose `exactly_once`"),
            "{e}"
        );
        // Members that cannot be listed may be running.
        let unknown = group(&[(0, Recovery)], None);
        let e = settled(GuaranteeSetting::Fixed(ExactlyOnce), &unknown).unwrap_err();
        assert!(e.contains("could not be listed"), "{e}");
    }

    #[test]
    fn recovery_and_at_least_once_share_a_group() {
        let rec = group(&[(0, Recovery), (1, AtLeastOnce)], Some(2));
        let s = settled(GuaranteeSetting::Fixed(AtLeastOnce), &rec).unwrap();
        assert_eq!((s.guarantee, s.switched_from), (AtLeastOnce, vec![]));
        assert_eq!(
            settled(GuaranteeSetting::Fixed(Recovery), &rec)
                .unwrap()
                .guarantee,
            Recovery
        );
    }

    #[test]
    fn auto_takes_the_mode_a_running_group_records_without_asking() {
        let asked = |g: &GroupMode| {
            settle(GuaranteeSetting::Auto, g, "g", "g.state", || {
                Err("asked".to_string())
            })
        };
        let s = asked(&group(&[(0, Recovery), (3, AtLeastOnce)], Some(1))).unwrap();
        assert_eq!((s.guarantee, s.adopted), (Recovery, true));
        let s = asked(&group(&[(2, ExactlyOnce)], Some(1))).unwrap();
        assert_eq!((s.guarantee, s.adopted), (ExactlyOnce, true));
        // Nothing recorded, or nobody running: the broker is asked.
        assert_eq!(asked(&group(&[], Some(3))), Err("asked".into()));
        assert_eq!(
            asked(&group(&[(0, Recovery)], Some(0))),
            Err("asked".into())
        );
        // A group found running both kinds: auto's answer is refused beside the other.
        let mixed = group(&[(0, Recovery), (1, ExactlyOnce)], Some(2));
        let e = settled(GuaranteeSetting::Auto, &mixed).unwrap_err();
        assert!(e.contains("runs `recovery`") && e.contains("(auto)"), "{e}");
    }

    #[test]
    fn a_group_with_no_member_switches_mode_and_says_from_what() {
        let stopped = group(&[(0, ExactlyOnce), (1, ExactlyOnce)], Some(0));
        let s = settled(GuaranteeSetting::Fixed(Recovery), &stopped).unwrap();
        assert_eq!(
            (s.guarantee, s.switched_from),
            (Recovery, vec![ExactlyOnce])
        );
        let fresh = group(&[], Some(0));
        let s = settled(GuaranteeSetting::Auto, &fresh).unwrap();
        assert_eq!(
            (s.guarantee, s.adopted, s.switched_from),
            (ExactlyOnce, false, vec![])
        );
    }
}
