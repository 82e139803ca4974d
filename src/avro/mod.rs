//! Avro: how an Avro value maps to the JSON value the bridge works with and back
//! (`json`), the Confluent wire format (`wire`) and the schema registry client
//! (`registry`), and an in-memory schema registry for the demo and the tests
//! (`registry_server`).

/// How a decoded Avro value becomes the JSON value the bridge works with, and back.
pub mod json;
pub mod registry;
pub mod registry_server;
pub mod wire;
