//! Delivery reports, routed back to whoever sent the record.
//!
//! rdkafka's `FutureProducer` gives every record a future: a oneshot channel (an `Arc`), its
//! boxed sender as the record's opaque, and, where the futures are collected, a boxed future
//! and a `FuturesUnordered` task (another `Arc`): four allocations and a wake-up per output,
//! on the bridge's hottest path (issue 19). Here a record's opaque is a plain number, its
//! token: the route it belongs to (a partition task, say) and its slot there. librdkafka's
//! polling thread (the [`ThreadedProducer`]'s) hands each report to its route's channel, and
//! the route's owner takes them in batches, woken once per batch rather than once per
//! record. A route that is gone (its task ended) drops its reports: nobody waits for them.

use super::records::OutRecordParts;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Where a record landed (partition, offset), or why it did not.
pub type Outcome = Result<(i32, i64), Undelivered>;

/// Why a record was not delivered, and the record, as librdkafka gives it back with its
/// report (its dead letter is made of it: the sender need not keep the record meanwhile).
#[derive(Debug)]
pub struct Undelivered {
    pub error: KafkaError,
    pub record: Option<Box<OutRecordParts>>,
}

impl From<KafkaError> for Undelivered {
    fn from(error: KafkaError) -> Self {
        Self {
            error,
            record: None,
        }
    }
}

/// A delivery report as its route's owner receives it: the record's slot, and its outcome.
pub type Report = (u32, Outcome);

/// The open routes of one producer: part of its context, read by its polling thread.
#[derive(Default)]
pub struct Routes {
    next: AtomicU32,
    open: Mutex<HashMap<u32, Target>>,
}

enum Target {
    /// A route that sends many records (a partition task).
    Stream(mpsc::UnboundedSender<Report>),
    /// One record, awaited ([`send_and_wait`]).
    Once(oneshot::Sender<Outcome>),
}

/// A record's opaque: its route in the high half, its slot in the low one.
fn token(route: u32, slot: u32) -> usize {
    ((route as u64) << 32 | slot as u64) as usize
}

fn split(token: usize) -> (u32, u32) {
    let token = token as u64;
    ((token >> 32) as u32, token as u32)
}

impl Routes {
    fn open(&self, target: Target) -> u32 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, target);
        id
    }

    fn close(&self, id: u32) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Target>> {
        // A panic while holding it leaves nothing half-done: the map is still whole.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A report from librdkafka's polling thread, to the route that sent the record.
    pub fn deliver(&self, token: usize, outcome: Outcome) {
        let (route, slot) = split(token);
        let mut open = self.lock();
        match open.get(&route) {
            Some(Target::Stream(reports)) => {
                let _ = reports.send((slot, outcome));
            }
            Some(Target::Once(_)) => {
                if let Some(Target::Once(waiting)) = open.remove(&route) {
                    let _ = waiting.send(outcome);
                }
            }
            None => {}
        }
    }
}

/// A report's outcome, from librdkafka's form.
pub fn outcome(result: &DeliveryResult<'_>) -> Outcome {
    match result {
        Ok(m) => Ok((m.partition(), m.offset())),
        Err((error, record)) => Err(Undelivered {
            error: error.clone(),
            record: Some(Box::new(OutRecordParts::of_message(record))),
        }),
    }
}

/// A producer context that routes its reports ([`Routes`]).
pub trait Routed: ProducerContext<DeliveryOpaque = usize> {
    fn routes(&self) -> &Arc<Routes>;
}

/// A new route to `target` on `producer`'s routes: its id, and the routes (to close it).
fn open_on<C: Routed + 'static>(
    producer: &ThreadedProducer<C>,
    target: Target,
) -> (u32, Arc<Routes>) {
    let routes = producer.context().routes().clone();
    (routes.open(target), routes)
}

/// The receiving end of a stream route: each record sent with [`Route::token`] of a slot
/// comes back here as that slot's report. Closed when dropped.
pub struct Route {
    id: u32,
    routes: Arc<Routes>,
    reports: mpsc::UnboundedReceiver<Report>,
}

impl Route {
    /// A new route on `producer`.
    pub fn open<C: Routed + 'static>(producer: &ThreadedProducer<C>) -> Self {
        let (sender, reports) = mpsc::unbounded_channel();
        let (id, routes) = open_on(producer, Target::Stream(sender));
        Self {
            id,
            routes,
            reports,
        }
    }

    /// The opaque of a record sent from `slot`.
    pub fn token(&self, slot: u32) -> usize {
        token(self.id, slot)
    }

    /// Wait for reports and move all that came (at most `limit`) into `into`; 0 only if the
    /// route was closed (it never is while it is owned). Cancel-safe.
    pub async fn recv_many(&mut self, into: &mut Vec<Report>, limit: usize) -> usize {
        self.reports.recv_many(into, limit).await
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        self.routes.close(self.id);
    }
}

/// A route for one record: its report is awaited once ([`OnceRoute::landed`]).
pub struct OnceRoute {
    id: u32,
    routes: Arc<Routes>,
    outcome: oneshot::Receiver<Outcome>,
}

impl OnceRoute {
    /// A new one-record route on `producer`.
    pub fn open<C: Routed + 'static>(producer: &ThreadedProducer<C>) -> Self {
        let (waiting, outcome) = oneshot::channel();
        let (id, routes) = open_on(producer, Target::Once(waiting));
        Self {
            id,
            routes,
            outcome,
        }
    }

    /// The opaque of its record.
    pub fn token(&self) -> usize {
        token(self.id, 0)
    }

    /// Where its record landed, once reported (closed by the report).
    pub async fn landed(self) -> Result<(i32, i64), KafkaError> {
        match self.outcome.await {
            Ok(outcome) => outcome.map_err(|u| u.error),
            Err(_) => Err(KafkaError::Canceled),
        }
    }

    /// Its record was never handed over: nothing will report.
    pub fn close(self) {
        self.routes.close(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_carries_its_route_and_slot_whole() {
        for (route, slot) in [(0, 0), (1, 7), (u32::MAX, u32::MAX), (3, u32::MAX - 1)] {
            assert_eq!(split(token(route, slot)), (route, slot));
        }
    }

    #[tokio::test]
    async fn reports_reach_their_own_route_and_none_other() {
        let routes = Routes::default();
        let (a_tx, mut a) = mpsc::unbounded_channel();
        let (b_tx, mut b) = mpsc::unbounded_channel();
        let ra = routes.open(Target::Stream(a_tx));
        let rb = routes.open(Target::Stream(b_tx));
        routes.deliver(token(ra, 5), Ok((1, 10)));
        routes.deliver(token(rb, 6), Err(KafkaError::Canceled.into()));
        routes.deliver(token(ra, 7), Ok((2, 20)));
        // A closed route's reports go nowhere.
        routes.close(rb);
        routes.deliver(token(rb, 8), Ok((0, 0)));
        let mut got = Vec::new();
        a.recv_many(&mut got, 10).await;
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1.as_ref().ok()), (5, Some(&(1, 10))));
        assert_eq!((got[1].0, got[1].1.as_ref().ok()), (7, Some(&(2, 20))));
        let mut got = Vec::new();
        b.recv_many(&mut got, 10).await;
        assert_eq!(got.len(), 1, "only what came before the route closed");
        assert_eq!(got[0].0, 6);
        // A one-record route is closed by its report.
        let (once_tx, once) = oneshot::channel();
        let ro = routes.open(Target::Once(once_tx));
        routes.deliver(token(ro, 0), Ok((3, 30)));
        assert_eq!(once.await.unwrap().unwrap(), (3, 30));
        assert!(routes.lock().get(&ro).is_none());
    }
}
