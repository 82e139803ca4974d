//! watchbridge: for every record of an input topic, watch an external resource and emit each
//! output not seen before, stamped with its event time. See `docs/architecture.md`.

pub mod clock;
pub mod poll;
pub mod reason;
