//! The Kafka side of the bridge: the group's standing orders ([`control_topic`]), the watches the state topic remembers, for any instance ([`state_lookup`]), the consumer thread and its rebalance callbacks
//! ([`consumer`]), one task per assigned input partition ([`partition`]), the records written ([`records`]) and their delivery reports
//! ([`reports`]), commit discipline ([`offsets`]), first and end offsets
//! of many partitions in one request ([`list_offsets`]), `KAFKA_*` variables read as
//! librdkafka properties ([`env`]), client
//! settings, topics and the start's wait for the brokers ([`client`]), whether the brokers
//! can be reached and librdkafka's errors and log lines ([`health`]), librdkafka's
//! statistics as metrics ([`stats`]), the exactly-once mode's transaction timeout fitted to
//! the checkpoint interval ([`transaction_timeout`]), partitions whose restart waits (fenced,
//! or after a failed delivery: [`delayed_restart`]), the embedded broker ([`embedded`]),
//! and the guarantee: how `auto` is resolved ([`guarantee`]) and which mode the group runs
//! ([`group_mode`]).

pub mod client;
pub mod clients;
pub mod consumer;
pub mod control_topic;
pub mod delayed_restart;
pub mod drop_later;
pub mod durable;
pub mod embedded;
pub mod env;
pub mod group_mode;
pub mod guarantee;
pub mod health;
pub mod leaders;
pub mod lease;
pub mod list_offsets;
pub mod merged;
pub mod offsets;
pub mod output_ends;
pub mod partition;
pub mod produce;
pub mod properties;
pub mod records;
pub mod recovery;
pub mod refusal;
pub mod repartition;
pub mod reports;
pub mod state_lookup;
pub mod stats;
pub mod tools;
pub mod transaction_timeout;
