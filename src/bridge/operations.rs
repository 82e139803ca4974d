//! The operations side of a run: the servers (`/metrics`, the probes, the control API),
//! which answer from the first moment of the start, and what the control API reads once the
//! brokers are reached: the input partitions, the group's standing orders (the control
//! topic) and the state lookup.

use super::start::Start;
use super::BridgeError;
use crate::control::Controls;
use crate::kafka::client::TopicLayout;
use crate::kafka::control_topic::ControlTopic;
use crate::kafka::state_lookup::StateLookup;
use crate::ops_server::{OpsApi, OpsServer, Serves};
use std::sync::{Arc, OnceLock};

/// The operations servers and what their API reads.
pub(super) struct Operations {
    /// The operations API's view of this instance's partitions (`control.rs`).
    pub controls: Arc<Controls>,
    /// The group's standing orders, once the start has read them.
    orders: Arc<OnceLock<ControlTopic>>,
    /// The state lookup, once the start knows the input partitions.
    state_lookup: Arc<OnceLock<StateLookup>>,
    /// They answer for as long as this is kept.
    _servers: Vec<OpsServer>,
}

impl Operations {
    /// The operations servers, started.
    pub(super) async fn serve(start: &Start<'_>) -> Result<Self, BridgeError> {
        let controls = Arc::new(Controls::default());
        // (Its input partition count is set once the start has read it: `follow`.)
        let (orders, state_lookup) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
        let servers = start_ops_servers(start, &controls, &orders, &state_lookup).await?;
        Ok(Self {
            controls,
            orders,
            state_lookup,
            _servers: servers,
        })
    }

    /// What the API reads from the brokers: the input partitions, the group's standing
    /// orders (pauses: read to their end here, so that they apply before any watch polls),
    /// and the state topic (`StateLookup`).
    pub(super) async fn follow(
        &self,
        start: &Start<'_>,
        layout: &TopicLayout,
    ) -> Result<(), BridgeError> {
        let (config, clients) = (start.config, &start.clients);
        self.controls.set_input_partitions(layout.input_partitions);
        if start.upstream.is_some() {
            self.controls.set_repartitioned();
        }
        let control_topic = ControlTopic::start(
            &config.operations.control_topic,
            clients.control_topic_reader(),
            clients.control_topic_writer(),
            &start.kafka,
            self.controls.pause.clone(),
            start.metrics.clone(),
            start.deadline,
        )
        .await
        .map_err(BridgeError::Start)?;
        let _ = self.orders.set(control_topic);
        let state_lookup = StateLookup::new(
            clients.state_lookup_reader(),
            clients.state_lookup_writer(),
            &start.kafka,
            &clients.brokers,
            &config.state_topic,
            &config.input_topic,
            layout.input_partitions,
            config.watch_key.is_none(),
        )
        .map_err(BridgeError::Start)?;
        let _ = self.state_lookup.set(state_lookup);
        Ok(())
    }
}

/// The operations servers: metrics and probes on `WATCHBRIDGE_METRICS_ADDR`, the control
/// API on `WATCHBRIDGE_CONTROL_ADDR` (one server for both when they are the same address;
/// none for the control API without `WATCHBRIDGE_ADMIN_TOKEN`, which it needs).
async fn start_ops_servers(
    start: &Start<'_>,
    controls: &Arc<Controls>,
    orders: &Arc<OnceLock<ControlTopic>>,
    state: &Arc<OnceLock<StateLookup>>,
) -> Result<Vec<OpsServer>, BridgeError> {
    let config = start.config;
    let api = Arc::new(OpsApi {
        metrics: start.metrics.clone(),
        readiness: start.readiness.clone(),
        controls: controls.clone(),
        admin_token: config.admin_token.as_ref().map(|t| t.0.clone()),
        orders: orders.clone(),
        state: state.clone(),
        show_inputs: config.operations.show_inputs,
        stall_timeout: config.operations.stall_timeout,
    });
    let control_addr = match (config.operations.control_addr, &config.admin_token) {
        (Some(addr), Some(_)) => Some(addr),
        (Some(addr), None) => {
            tracing::info!(
                %addr,
                "no WATCHBRIDGE_ADMIN_TOKEN: the control and watch API is off (it needs one)"
            );
            None
        }
        (None, _) => None,
    };
    let mut servers = Vec::new();
    let shared = control_addr.is_some() && control_addr == config.metrics_addr;
    if let Some(addr) = config.metrics_addr {
        let serves = Serves {
            probes: true,
            control: shared,
        };
        let server = OpsServer::start(addr, api.clone(), serves)
            .await
            .map_err(BridgeError::Start)?;
        tracing::info!(
            address = %server.addr(),
            control = shared,
            "serving /metrics, /healthz, /readyz and /version (WATCHBRIDGE_METRICS_ADDR)"
        );
        servers.push(server);
    }
    if let Some(addr) = control_addr.filter(|_| !shared) {
        let serves = Serves {
            probes: false,
            control: true,
        };
        let server = OpsServer::start(addr, api, serves)
            .await
            .map_err(BridgeError::Start)?;
        tracing::info!(
            address = %server.addr(),
            "serving the control and watch API: /watches, /partitions, /orders, /pause, /resume (WATCHBRIDGE_CONTROL_ADDR)"
        );
        servers.push(server);
    }
    Ok(servers)
}
