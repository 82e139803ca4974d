//! The watermark of a watch-side partition when the inputs go through the repartition
//! topic (`kafka/repartition/`): Flink's rule after a `keyBy`, the minimum over the
//! upstream partitions that feed it. A partition of the repartition topic holds inputs of
//! every input partition, interleaved, so its records' times say nothing on their own; the
//! repartition stage writes each input partition's watermark into every partition of the
//! repartition topic as an in-band marker, after the inputs it covers, and this generator
//! takes the minimum of the latest marker of each input partition.
//!
//! An input partition no marker has come from yet holds the watermark back ("no value,
//! active", as a new split does in Flink); one whose marker says idle stops constraining;
//! when every one is idle, so is this input. A marker below the last one of its partition
//! (a repartition stage that started again from an earlier commit) moves nothing back.

use super::generator::{InputEvent, WatermarkGenerator, WatermarkOutput};
use crate::clock::Millis;

/// The latest word of one input partition.
#[derive(Debug, Clone, Copy, Default)]
struct Upstream {
    watermark: Option<Millis>,
    idle: bool,
}

/// The minimum of the upstream partitions' in-band watermarks.
#[derive(Debug, Clone)]
pub struct UpstreamWatermarks {
    upstream: Vec<Upstream>,
}

impl UpstreamWatermarks {
    /// Fed by `partitions` input partitions (more are added as their markers come).
    pub fn new(partitions: i32) -> Self {
        Self {
            upstream: vec![Upstream::default(); partitions.max(0) as usize],
        }
    }
}

impl WatermarkGenerator for UpstreamWatermarks {
    /// An input's own time moves nothing: the markers of its partition do.
    fn on_event(&mut self, _event: &InputEvent<'_>, _output: &mut WatermarkOutput) {}

    fn on_upstream(
        &mut self,
        partition: i32,
        watermark: Option<Millis>,
        idle: bool,
        _output: &mut WatermarkOutput,
    ) {
        let Ok(index) = usize::try_from(partition) else {
            return;
        };
        if index >= self.upstream.len() {
            self.upstream.resize(index + 1, Upstream::default());
        }
        let upstream = &mut self.upstream[index];
        upstream.watermark = upstream.watermark.max(watermark);
        upstream.idle = idle;
    }

    fn on_periodic_emit(&mut self, output: &mut WatermarkOutput) {
        let mut active = self.upstream.iter().filter(|u| !u.idle).peekable();
        if active.peek().is_none() {
            output.mark_idle();
            return;
        }
        output.mark_active();
        // Every active partition must have said something; one that has not holds it back.
        let min = active.map(|u| u.watermark).min().flatten();
        if let Some(min) = min {
            output.emit_watermark(min);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emitted(g: &mut UpstreamWatermarks, out: &mut WatermarkOutput) -> (Option<Millis>, bool) {
        g.on_periodic_emit(out);
        (out.watermark(), out.is_idle())
    }

    #[test]
    fn the_minimum_of_the_active_upstream_partitions_once_each_has_spoken() {
        let mut g = UpstreamWatermarks::new(3);
        let mut out = WatermarkOutput::default();
        g.on_upstream(0, Some(100), false, &mut out);
        g.on_upstream(1, Some(50), false, &mut out);
        assert_eq!(
            emitted(&mut g, &mut out),
            (None, false),
            "partition 2 holds it back"
        );
        g.on_upstream(2, Some(70), false, &mut out);
        assert_eq!(emitted(&mut g, &mut out), (Some(50), false));
        // An idle partition stops constraining; one that goes back moves nothing back.
        g.on_upstream(1, Some(40), true, &mut out);
        assert_eq!(emitted(&mut g, &mut out), (Some(70), false));
        g.on_upstream(1, Some(60), false, &mut out);
        assert_eq!(
            emitted(&mut g, &mut out),
            (Some(70), false),
            "never backwards"
        );
        for p in 0..3 {
            g.on_upstream(p, None, true, &mut out);
        }
        assert_eq!(emitted(&mut g, &mut out), (Some(70), true), "all idle");
        // A partition of a topic grown since counts once it speaks; one beyond it that has
        // not spoken holds the watermark back as any other.
        g.on_upstream(3, Some(500), false, &mut out);
        assert_eq!(emitted(&mut g, &mut out), (Some(500), false));
        g.on_upstream(5, Some(900), false, &mut out);
        assert_eq!(
            emitted(&mut g, &mut out),
            (Some(500), false),
            "partition 4 unheard"
        );
    }
}
