//! Apache Kafka (`scripts/kafka.sh`: a pinned release from Maven Central, one KRaft node
//! that is broker and controller) as a [`BrokerProcess`], the second test broker
//! (`WATCHBRIDGE_TEST_BROKER=kafka`, docs/brokers.md). Its data is Kafka's own log dir, so a
//! [`BrokerProcess::restart`] keeps topics, records, committed offsets and transactions.
//!
//! Only std and rdkafka, like `broker_process.rs`.

use super::broker_process::{installed_path, BrokerProcess, Launch};
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

impl BrokerProcess {
    /// Kafka on two free loopback ports (clients, controller) with its config and data in a
    /// new temp dir named `prefix…`, once it answers. The JVM takes ~7 s to start, more on a
    /// busy machine.
    pub fn kafka(prefix: &str) -> Result<BrokerProcess, String> {
        Self::kafka_on(prefix, None)
    }

    /// [`BrokerProcess::kafka`] on the given ports (clients, controller) or free ones.
    pub fn kafka_on(prefix: &str, on: Option<&[u16]>) -> Result<BrokerProcess, String> {
        // Installs the jars once (progress on the terminal), before the watchdog runs
        // `serve`, whose output goes to the broker's log.
        installed_path("kafka.sh", "or set KAFKA_LIBS to a dir of Kafka's jars");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh");
        let command = |dir: &Path, ports: &[u16]| -> Vec<OsString> {
            // `serve` writes server.properties, formats the data dir the first time, and
            // execs the JVM (so the pid the watchdog records is Kafka's).
            let mut command: Vec<OsString> = vec!["bash".into(), script.clone().into()];
            command.push("serve".into());
            command.push(dir.into());
            command.extend(ports.iter().map(|p| p.to_string().into()));
            command
        };
        BrokerProcess::start(&Launch {
            name: "kafka",
            prefix,
            ports: 2,
            start_timeout: Duration::from_secs(90),
            command: &command,
            on,
        })
    }
}
