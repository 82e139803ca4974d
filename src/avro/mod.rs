//! Avro: how an Avro value maps to the JSON value the bridge works with and back
//! (`json`), the Confluent wire format and schema registry client, and an in-memory schema
//! registry for the demo and the tests (`registry_server`).
pub mod registry_server;
