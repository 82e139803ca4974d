//! A property test over the watermark state machines together, as the bridge drives them
//! (issue 16): random interleavings of inputs, polls, the runtime taking in the engine's
//! events (outputs, then the holds they moved), ticks, time passing (idleness), takeovers
//! of a partition by a new owner (which starts from what the watermark topic says), and
//! restarts of the watermark topic's reader (a fresh reader replays the topic, compacted).
//!
//! What it asserts is what the docs promise: on the watermark topic and in-band, no
//! partition's value and no merged value ever decreases; no output that is not flagged late
//! falls below a marker its partition already carried; and an output its watch found at or
//! above both its hold and the partition's published watermark of the moment is never
//! flagged late (the hold covered it until the runtime took it in).

use super::generator::InputWatermark;
use super::message::WatermarkMessage;
use super::partition::PartitionWatermark;
use super::strategy::WatermarkStrategy;
use super::topic::WatermarkTopic;
use crate::clock::Millis;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

const T0: Millis = 1_700_000_000_000;
const PARTITIONS: i32 = 2;
const IDLE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
enum Op {
    /// An input record on a partition at this offset from T0: a new watch holding there.
    Input(i32, i64),
    /// The engine polls one of the partition's watches: outputs at these offsets from its
    /// hold (negative: history below it), and its hold moves up by this much (or it ends).
    Poll(i32, usize, Vec<i64>, Option<i64>),
    /// The runtime takes in the partition's next engine event.
    TakeIn(i32),
    Tick(i32),
    Wait(i64),
    /// The partition's owner dies; a new one takes it over (events not taken in are lost;
    /// the watches are restored with their holds).
    TakeOver(i32),
    /// The merged watermark's writer publishes; or its reader starts afresh.
    PublishMerged,
    RestartReader,
}

#[derive(Debug, Clone)]
enum EngineEvent {
    /// Outputs: event time, and whether it must be on time (found at or above both its
    /// watch's hold and the published watermark).
    Outputs(Vec<(Millis, bool)>),
    Hold(Option<Millis>),
    /// The answer to a command that started a watch (after the hold it adds).
    Started,
}

#[derive(Debug)]
enum InBand {
    Marker(i32, Millis),
    Output(i32, Millis, bool),
}

struct Owner {
    watermark: PartitionWatermark,
    applied_hold: Option<Millis>,
    /// Holds of the watches started but not answered yet (the runtime counts them).
    starting: VecDeque<Millis>,
    queue: VecDeque<EngineEvent>,
    /// The engine's watches and their holds (they survive a takeover: restored).
    holds: Vec<Millis>,
}

impl Owner {
    fn new(now: Millis) -> Self {
        Self {
            watermark: PartitionWatermark::new(InputWatermark::new(
                WatermarkStrategy::default(),
                IDLE,
                now,
            )),
            applied_hold: None,
            starting: VecDeque::new(),
            queue: VecDeque::new(),
            holds: Vec::new(),
        }
    }

    fn min_hold(&self) -> Option<Millis> {
        self.holds.iter().min().copied()
    }

    /// What the runtime holds its watermark at: the engine's last reported minimum and the
    /// watches not answered yet.
    fn runtime_hold(&self) -> Option<Millis> {
        self.starting.iter().copied().chain(self.applied_hold).min()
    }

    /// A watch starts at `hold`: the engine reports the new minimum, then answers.
    fn start(&mut self, hold: Millis) {
        self.holds.push(hold);
        self.starting.push_back(hold);
        let min = self.min_hold();
        self.queue.push_back(EngineEvent::Hold(min));
        self.queue.push_back(EngineEvent::Started);
    }
}

struct World {
    now: Millis,
    owners: Vec<Owner>,
    topic: Vec<WatermarkMessage>,
    in_band: Vec<InBand>,
    reader: WatermarkTopic,
    read: usize,
    merged_published: Option<Millis>,
}

impl World {
    fn catch_up(&mut self) {
        while self.read < self.topic.len() {
            self.reader.apply(&self.topic[self.read]);
            self.read += 1;
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Input(p, at) => {
                let o = &mut self.owners[p as usize];
                o.watermark.on_record(T0 + at, None, self.now);
                o.start(T0 + at);
            }
            Op::Poll(p, pick, outputs, moved) => {
                let o = &mut self.owners[p as usize];
                if o.holds.is_empty() {
                    return;
                }
                let w = pick % o.holds.len();
                let hold = o.holds[w];
                let published = o.watermark.published();
                let found = outputs
                    .iter()
                    .map(|d| {
                        let t = hold + d;
                        (t, *d >= 0 && published.is_none_or(|w| t >= w))
                    })
                    .collect();
                o.queue.push_back(EngineEvent::Outputs(found));
                match moved {
                    Some(up) => o.holds[w] += up,
                    None => {
                        o.holds.remove(w);
                    }
                }
                let min = o.min_hold();
                o.queue.push_back(EngineEvent::Hold(min));
            }
            Op::TakeIn(p) => {
                let o = &mut self.owners[p as usize];
                match o.queue.pop_front() {
                    Some(EngineEvent::Hold(min)) => o.applied_hold = min,
                    Some(EngineEvent::Started) => {
                        o.starting.pop_front();
                    }
                    Some(EngineEvent::Outputs(found)) => {
                        for (t, on_time) in found {
                            let late = o.watermark.is_late(t);
                            assert!(
                                !(on_time && late),
                                "an output found on time at {} was flagged late (watermark {:?})",
                                t - T0,
                                o.watermark.published().map(|w| w - T0)
                            );
                            self.in_band.push(InBand::Output(p, t, late));
                        }
                    }
                    None => {}
                }
            }
            Op::Tick(p) => {
                self.catch_up();
                let o = &mut self.owners[p as usize];
                if let Some(state) = self.reader.partition(p) {
                    o.watermark.resume_from(state.watermark);
                }
                if let Some(u) = o.watermark.update(o.runtime_hold(), self.now) {
                    let watermark_ms = u.watermark.unwrap_or(Millis::MIN);
                    self.topic.push(WatermarkMessage::Partition {
                        topic: "in".into(),
                        partition: p,
                        watermark_ms,
                        idle: u.idle,
                    });
                    self.in_band.push(InBand::Marker(p, watermark_ms));
                }
            }
            Op::Wait(dt) => self.now += dt,
            Op::TakeOver(p) => {
                // The recovery waits until the reader has read the topic to its end.
                self.catch_up();
                let holds = std::mem::take(&mut self.owners[p as usize].holds);
                let mut o = Owner::new(self.now);
                if let Some(state) = self.reader.partition(p) {
                    o.watermark.take_over(state.watermark, state.idle);
                }
                o.watermark.start_reading(self.now);
                for hold in holds {
                    o.start(hold);
                }
                self.owners[p as usize] = o;
            }
            Op::PublishMerged => {
                self.catch_up();
                let current = self.reader.merged();
                if current.is_some() && current != self.merged_published {
                    self.merged_published = current;
                    self.topic.push(WatermarkMessage::Merged {
                        topic: "in".into(),
                        watermark_ms: current.unwrap_or_default(),
                    });
                }
            }
            Op::RestartReader => {
                // A fresh reader replays the topic as compaction left it, to its end,
                // before it publishes anything.
                let last: HashMap<String, usize> = self
                    .topic
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.key(), i))
                    .collect();
                self.reader = WatermarkTopic::new("in", PARTITIONS);
                for (i, r) in self.topic.iter().enumerate() {
                    if last[&r.key()] == i {
                        self.reader.apply(r);
                    }
                }
                self.read = self.topic.len();
                self.merged_published = None;
            }
        }
    }
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let p = 0..PARTITIONS;
    let op = prop_oneof![
        3 => (p.clone(), -20_000i64..60_000).prop_map(|(p, t)| Op::Input(p, t)),
        4 => (p.clone(), 0usize..4, prop::collection::vec(-3_000i64..20_000, 0..4),
              prop::option::weighted(0.8, 0i64..15_000))
            .prop_map(|(p, w, o, m)| Op::Poll(p, w, o, m)),
        6 => p.clone().prop_map(Op::TakeIn),
        4 => p.clone().prop_map(Op::Tick),
        2 => (0i64..12_000).prop_map(Op::Wait),
        1 => p.prop_map(Op::TakeOver),
        2 => Just(Op::PublishMerged),
        1 => Just(Op::RestartReader),
    ];
    prop::collection::vec(op, 0..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn published_watermarks_never_decrease_and_on_time_outputs_stay_on_time(ops in ops()) {
        let mut world = World {
            now: T0,
            owners: (0..PARTITIONS).map(|_| Owner::new(T0)).collect(),
            topic: Vec::new(),
            in_band: Vec::new(),
            reader: WatermarkTopic::new("in", PARTITIONS),
            read: 0,
            merged_published: None,
        };
        for op in ops {
            world.apply(op);
        }
        // On the topic: each partition's value and the merged value never decrease.
        let mut last: BTreeMap<String, Millis> = BTreeMap::new();
        for r in &world.topic {
            let value = match r {
                WatermarkMessage::Partition { watermark_ms, .. }
                | WatermarkMessage::Merged { watermark_ms, .. } => *watermark_ms,
            };
            let before = last.insert(r.key(), value);
            prop_assert!(before.is_none_or(|b| b <= value), "{} went from {before:?} to {value}", r.key());
        }
        // In-band: markers never decrease; no unflagged output below its partition's marker.
        let mut marker: HashMap<i32, Millis> = HashMap::new();
        for e in &world.in_band {
            match e {
                InBand::Marker(p, w) => {
                    let before = marker.insert(*p, *w);
                    prop_assert!(before.is_none_or(|b| b <= *w));
                }
                InBand::Output(p, t, late) => {
                    if let Some(w) = marker.get(p) {
                        prop_assert!(*late || t >= w, "unflagged output at {} below marker {}", t - T0, w - T0);
                    }
                }
            }
        }
    }
}
