//! What the demo's view makes of an output record's value, whatever the output format:
//! the item as the feed served it, so the tally checks one value in one code path. JSON
//! outputs are the item; Avro outputs are framed (`crate::avro::wire`), read with the
//! writer schema their id names (fetched from the registry the bridge registered it in,
//! cached by id) and mapped to JSON by the bridge's own rule (`crate::avro::json`): the
//! envelope's `item` is the item's JSON text, a user's schema (`WATCHBRIDGE_OUTPUT_SCHEMA`)
//! is the item itself.

use crate::avro::registry::RegistryClient;
use crate::avro::wire::unframe;
use crate::formats::{FormatConfig, OutputFormat};
use crate::metrics::Metrics;
use apache_avro::Schema;
use serde_json::Value;
use std::sync::Arc;

/// The full name of the envelope record (`crate::formats::output::ENVELOPE_SCHEMA`).
const ENVELOPE: &str = "watchbridge.Output";

pub enum OutputValues {
    Json,
    Avro { registry: Box<RegistryClient> },
}

/// One output value, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The item, as the JSON mode would have it.
    pub item: Value,
    /// The Avro schema id it was framed with (`None`: JSON).
    pub schema_id: Option<u32>,
}

impl OutputValues {
    /// How the bridge configured with `formats` writes its outputs. The registry client
    /// counts its requests in its own metrics, not the bridge's.
    pub fn new(formats: &FormatConfig) -> Result<Self, String> {
        match (formats.output_format, &formats.registry) {
            (OutputFormat::Json, _) => Ok(Self::Json),
            (OutputFormat::Avro, None) => {
                Err("Avro outputs without a schema registry to read them with".into())
            }
            (OutputFormat::Avro, Some(settings)) => Ok(Self::Avro {
                registry: Box::new(RegistryClient::new(
                    settings.clone(),
                    Arc::new(Metrics::new()),
                )?),
            }),
        }
    }

    /// The item of an output record's value. `Err`: why it does not decode.
    pub async fn decode(&self, value: Option<&[u8]>) -> Result<Decoded, String> {
        let bytes = value.unwrap_or_default();
        let registry = match self {
            Self::Json => {
                return serde_json::from_slice(bytes)
                    .map(|item| Decoded {
                        item,
                        schema_id: None,
                    })
                    .map_err(|e| format!("the value is not JSON: {e}"))
            }
            Self::Avro { registry } => registry,
        };
        let (id, datum) = unframe(bytes).map_err(|e| e.to_string())?;
        let writer = match registry.cached(id) {
            Some(cached) => cached,
            None => registry.fetch(id).await.map_err(|e| e.to_string())?,
        }
        .map_err(|e| e.to_string())?;
        let json = crate::formats::input::read_datum(&writer.schema, &writer.references, datum)
            .map_err(|e| format!("schema id {id}: {e}"))?;
        let item = if is_envelope(&writer.schema) {
            let text = json["item"]
                .as_str()
                .ok_or_else(|| format!("schema id {id}: the envelope has no `item` text"))?;
            serde_json::from_str(text)
                .map_err(|e| format!("schema id {id}: the envelope's `item` is not JSON: {e}"))?
        } else {
            json
        };
        Ok(Decoded {
            item,
            schema_id: Some(id),
        })
    }
}

fn is_envelope(schema: &Schema) -> bool {
    matches!(schema, Schema::Record(r) if r.name.fullname(None) == ENVELOPE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::registry_server::RegistryServer;
    use crate::formats::output::{OutputEncoder, ENVELOPE_SCHEMA};
    use crate::formats::FormatArgs;
    use crate::poll::Output;

    fn avro_values(url: &str) -> OutputValues {
        let args = FormatArgs {
            output_format: OutputFormat::Avro,
            schema_registry_url: Some(url.into()),
            ..FormatArgs::default()
        };
        OutputValues::new(&args.check().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn demo_avro_envelopes_decode_to_the_item_the_json_mode_reads() {
        let server = RegistryServer::start(([127, 0, 0, 1], 0).into()).unwrap();
        let id = server.register("demo.events-value", ENVELOPE_SCHEMA);
        let encoder = OutputEncoder::Avro {
            id,
            schema: Schema::parse_str(ENVELOPE_SCHEMA).unwrap(),
            user_schema: false,
        };
        let item = r#"{"at":"2026-12-01T22:00:00.000Z","id":"user-00-e1"}"#;
        let output = Output::new("user-00-e1", item, 1_796_162_400_000);
        let value = encoder.value(&output).unwrap();
        let values = avro_values(&server.url());
        let json = OutputValues::Json
            .decode(Some(item.as_bytes()))
            .await
            .unwrap();
        let avro = values.decode(Some(&value)).await.unwrap();
        assert_eq!(avro.item, json.item);
        assert_eq!(avro.schema_id, Some(id));
        // Fetched once, then cached by id.
        values.decode(Some(&value)).await.unwrap();
        assert_eq!(server.requests_to("/schemas/ids/"), 1);
    }

    #[tokio::test]
    async fn demo_values_that_do_not_decode_say_why() {
        let server = RegistryServer::start(([127, 0, 0, 1], 0).into()).unwrap();
        let values = avro_values(&server.url());
        let e = values.decode(Some(b"{\"a\":1}")).await.unwrap_err();
        assert!(e.contains("magic byte"), "{e}");
        let e = values
            .decode(Some(&crate::avro::wire::frame(99, b"")))
            .await
            .unwrap_err();
        assert!(e.contains("99"), "{e}");
        let e = OutputValues::Json.decode(Some(b"\x00")).await.unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
    }
}
