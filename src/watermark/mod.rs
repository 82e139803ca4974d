//! Event-time watermarks: how far event time has got, per input partition and merged over
//! the partitions an instance holds, as Flink's FLIP-27 sources do per split.
//!
//! * [`strategy`]: how a partition's records drive its watermark (`bounded(5s)`,
//!   `monotonic`, `none`), in its text form.
//! * [`generator`]: [`InputWatermark`], one per input partition, fed every record's
//!   timestamp; knows when the partition's input has gone idle.
//! * [`partition`]: [`PartitionWatermark`], the input watermark held back by the live
//!   watches' holds (Beam's watermark holds), never moving backwards.
//! * [`merged`]: [`MergedWatermark`], the minimum over the partitions that are not idle.
//! * [`message`]: the watermark topic's records.
//! * [`upstream`]: [`UpstreamWatermarks`], the watch side's input watermark when the inputs
//!   go through the repartition topic: the minimum of the input partitions' markers.
//! * [`topic`]: [`WatermarkTopic`], those records read back (the state every reader of the
//!   topic derives, floors for takeovers and the merged value, runs that ended).
//!
//! All of it is pure: state machines handed `now` and the engine's minimum hold, returning
//! only changes, so the caller publishes exactly what moved.

pub mod generator;
#[doc(hidden)]
pub mod merged;
#[doc(hidden)]
pub mod message;
#[doc(hidden)]
pub mod partition;
#[cfg(test)]
mod properties;
pub mod strategy;
#[doc(hidden)]
pub mod topic;
pub mod upstream;

pub use generator::{
    BoundedOutOfOrderness, Generators, InputEvent, InputWatermark, NoWatermarks,
    WatermarkGenerator, WatermarkOutput,
};
pub use merged::MergedWatermark;
pub use message::WatermarkMessage;
pub use partition::{PartitionWatermark, Update};
pub use strategy::WatermarkStrategy;
pub use topic::{PartitionState, SharedWatermarkTopic, WatermarkTopic, END_OF_TIME};
pub use upstream::UpstreamWatermarks;
