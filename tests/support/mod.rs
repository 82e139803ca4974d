//! Fixtures shared by the integration tests; each test binary uses a part of them.

#[allow(dead_code)]
pub mod broker_process;
#[allow(dead_code)]
pub mod engine;
#[allow(dead_code)]
pub mod feeds;
#[allow(dead_code)]
pub mod http_server;
#[allow(dead_code)]
pub mod kafka;
#[allow(dead_code)]
pub mod kafka_process;
#[allow(dead_code)]
pub mod kerberos;
#[allow(dead_code)]
pub mod ops_client;
#[allow(dead_code)]
pub mod prometheus;
#[allow(dead_code)]
pub mod proxy;
#[allow(dead_code)]
pub mod python;
#[allow(dead_code)]
pub mod tansu_process;
#[allow(dead_code)]
pub mod tls;
#[allow(dead_code)]
pub mod watchdog;

#[allow(dead_code)]
pub mod bridge;
#[allow(dead_code)]
pub mod moto_process;
#[allow(dead_code)]
pub mod s3_proxy;
#[allow(dead_code)]
pub mod scenario;
#[allow(dead_code)]
pub mod secured;
