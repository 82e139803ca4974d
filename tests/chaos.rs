//! The fault test (`make chaos`, issue 6): the real bridge binary against the real test broker
//! (Tansu, SQLite storage) and a real HTTP resource whose per-user feeds keep growing, while
//! the bridge is SIGKILLed at random moments and restarted, two instances run at once and one
//! is killed, and the broker itself is crashed and restarted. At the end the output topic is
//! compared with the resource's ground truth by (input key, output key): every expected
//! output exactly once, each with its event time as the record timestamp, and the per-partition
//! watermarks on the watermark topic never decreasing.
//!
//! It measures, it doesn't excuse: it fails on any output lost or duplicated, any wrong event
//! time, any watermark that went back. `#[ignore]`d because it takes a while: `make chaos`
//! runs it in full (~100 s), `make test` in a short form (`make chaos-short`: 3 kills, still
//! with the two-instance kill and the broker restart, ~40 s).
//!
//! Knobs (environment): `CHAOS_KILLS` (default 10) bridge SIGKILLs, `CHAOS_USERS` (default 20)
//! watches, `CHAOS_SEED` (default 6) for the random kill moments.
//!
//! Tansu stalls a group whose member died without leaving if the member comes back before the
//! session timeout (`/work/shared/notes/tansu-0.6.md`), so the bridge runs with
//! `KAFKA_SESSION_TIMEOUT_MS=6000` and every restart after a kill waits those 6 s (plus a
//! margin) first.

mod support;

use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::{broker, header};
use watchbridge::watermark::WatermarkMessage;

/// The bridge's `session.timeout.ms`; a killed member is replaced only after it has passed.
const SESSION_TIMEOUT: Duration = Duration::from_millis(6000);
/// Margin on top of the session timeout before a restart.
const RESTART_MARGIN: Duration = Duration::from_millis(500);
/// A new feed item every this long.
const PACE_MS: i64 = 2000;
/// User u's feed starts this much after user u-1's.
const STAGGER_MS: i64 = 150;
/// An item's event time is this long before it appears in its feed.
const EVENT_LAG_MS: i64 = 1000;
/// Input partitions.
const PARTITIONS: i32 = 4;
/// Rough length of one kill cycle (random wait ~1.75 s, session timeout, start), to size
/// the feeds so that they keep growing through the whole chaos phase.
const CYCLE_MS: i64 = 9_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn knob(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
        _ => default,
    }
}

/// The resource: user u's feed starts at `t0 + u·STAGGER_MS`; item j exists from
/// `start + j·PACE_MS` on, with event time `start + j·PACE_MS − EVENT_LAG_MS`; the feed is
/// final once all `items` exist. Pure function of the clock: the ground truth.
#[derive(Clone, Copy)]
struct Feeds {
    t0: i64,
    items: i64,
}

impl Feeds {
    fn start(&self, user: i64) -> i64 {
        self.t0 + user * STAGGER_MS
    }

    /// How many items user's feed has at `now`.
    fn len_at(&self, user: i64, now: i64) -> i64 {
        let start = self.start(user);
        if now < start {
            0
        } else {
            ((now - start) / PACE_MS + 1).min(self.items)
        }
    }

    fn event_time(&self, user: i64, item: i64) -> i64 {
        self.start(user) + item * PACE_MS - EVENT_LAG_MS
    }

    fn output_key(user: i64, item: i64) -> String {
        format!("{user}-{item}")
    }

    /// When every feed of `users` is final.
    fn all_final_at(&self, users: i64) -> i64 {
        self.start(users - 1) + (self.items - 1) * PACE_MS
    }

    fn page(&self, user: i64, now: i64) -> Value {
        let len = self.len_at(user, now);
        let events: Vec<Value> = (0..len)
            .map(|j| json!({"id": Self::output_key(user, j), "at": self.event_time(user, j)}))
            .collect();
        json!({"events": events, "done": len == self.items})
    }
}

fn input_key(user: i64) -> String {
    format!("user-{user}")
}

/// Send `signal` (`-STOP`, `-CONT`) to the bridge process.
fn signal(bridge: &Bridge, signal: &str) {
    let pid = bridge.child.id().to_string();
    let status = Command::new("kill").args([signal, &pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// SIGKILL, then reap.
fn kill(bridge: &mut Bridge) {
    let pid = bridge.child.id().to_string();
    let status = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    assert!(status.success(), "kill -KILL {pid}");
    let _ = bridge.child.wait();
}

fn random_wait(rng: &mut fastrand::Rng) -> Duration {
    Duration::from_millis(rng.u64(500..=3000))
}

/// Wait until the log says `text`; false (no panic) if it didn't within `within`.
fn log_says(bridge: &Bridge, text: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if bridge.log().contains(text) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn text(m: &OwnedMessage, name: &str) -> Option<String> {
    header(m, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "fault test: run with make chaos (SIGKILLs the bridge; reports lost/duplicated outputs)"]
async fn every_output_exactly_once_across_sigkills_two_instances_and_a_broker_restart() {
    let started = Instant::now();
    let kills_wanted = knob("CHAOS_KILLS", 10).max(3);
    let users = knob("CHAOS_USERS", 20).max(1) as i64;
    let seed = knob("CHAOS_SEED", 6);
    // The bridge's WATCHBRIDGE_GUARANTEE (default: what the broker supports).
    let guarantee = std::env::var("CHAOS_GUARANTEE").unwrap_or_else(|_| "auto".into());
    // The zombie episode (CHAOS_ZOMBIE=1; default on with exactly_once, which fences it; the
    // `recovery` mode still has that window, docs/architecture.md).
    let zombie = knob("CHAOS_ZOMBIE", u64::from(guarantee == "exactly_once")) == 1;
    let mut rng = fastrand::Rng::with_seed(seed);

    // Feeds long enough to keep growing through the chaos phase.
    let items = ((kills_wanted as i64 * CYCLE_MS) / PACE_MS).max(10);
    let feeds = Feeds {
        t0: now_ms(),
        items,
    };
    let last_request = Arc::new(AtomicI64::new(0));
    let server = {
        let last_request = last_request.clone();
        TestServer::start(move |seen| {
            let now = now_ms();
            last_request.store(now, Ordering::Relaxed);
            let user: Option<i64> = seen
                .target
                .strip_prefix("/users/")
                .and_then(|u| u.parse().ok());
            match user {
                Some(u) if (0..users).contains(&u) => Reply::json(feeds.page(u, now)),
                _ => Reply::status(404, "{}"),
            }
        })
        .await
    };
    eprintln!(
        "chaos: seed={seed} kills={kills_wanted} users={users} items={items} pace={PACE_MS}ms \
         session_timeout={SESSION_TIMEOUT:?} (restarts wait it out)"
    );

    let input = broker().unique_topic("chaos");
    broker().create_topic(&input, PARTITIONS).await;
    let output = format!("{input}-out");
    let watermarks = format!("{output}.watermarks");
    let env: Vec<(&str, String)> = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", output.clone()),
        ("WATCHBRIDGE_GROUP_ID", format!("{input}-group")),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
        ("WATCHBRIDGE_POLL_INTERVAL", "250ms".into()),
        (
            "KAFKA_SESSION_TIMEOUT_MS",
            SESSION_TIMEOUT.as_millis().to_string(),
        ),
        ("KAFKA_HEARTBEAT_INTERVAL_MS", "1000".into()),
        ("WATCHBRIDGE_GUARANTEE", guarantee.clone()),
    ];
    for user in 0..users {
        broker()
            .produce(
                &input,
                Some((user % PARTITIONS as i64) as i32),
                Some(input_key(user).as_bytes()),
                json!({ "id": user }).to_string().as_bytes(),
                &[],
            )
            .await;
    }

    let mut restarts = 0u64;
    let mut broker_restarts = 0u64;
    let mut kills = 0u64;
    let mut zombies = 0u64;
    let two_at = kills_wanted / 3;
    let broker_at = 2 * kills_wanted / 3;
    let zombie_at = zombie.then_some(kills_wanted / 2);
    let mut current = Bridge::start(&env);
    for i in 0..kills_wanted {
        if Some(i) == zombie_at {
            // A zombie: the running instance stalls (SIGSTOP: a GC pause, a frozen VM) past
            // its session timeout while a second one takes its partitions over and goes on
            // emitting; then it runs again (SIGCONT) and writes what it had in hand; then
            // the new owner is SIGKILLed (and the zombie with it), and a third recovers.
            let mut successor = Bridge::start(&env);
            restarts += 1;
            tokio::time::sleep(random_wait(&mut rng)).await;
            signal(&current, "-STOP");
            eprintln!(
                "chaos: [{:>5.1?}] zombie: first instance SIGSTOPped; the second takes over",
                started.elapsed()
            );
            tokio::time::sleep(SESSION_TIMEOUT + RESTART_MARGIN).await;
            let took_over = log_says(
                &successor,
                "partition state restored",
                Duration::from_secs(30),
            );
            tokio::time::sleep(random_wait(&mut rng) * 2).await;
            signal(&current, "-CONT");
            tokio::time::sleep(random_wait(&mut rng)).await;
            let fenced = current.log().contains("fenced: another instance");
            eprintln!(
                "chaos: [{:>5.1?}] zombie: SIGCONT (second took over: {took_over}; first fenced: {fenced}); SIGKILL both",
                started.elapsed()
            );
            kill(&mut successor);
            kill(&mut current);
            kills += 2;
            zombies += 1;
            tokio::time::sleep(SESSION_TIMEOUT + RESTART_MARGIN).await;
            current = Bridge::start(&env);
            restarts += 1;
            continue;
        }
        if i == broker_at {
            tokio::time::sleep(random_wait(&mut rng)).await;
            eprintln!(
                "chaos: [{:>5.1?}] broker SIGKILL + restart (bridge keeps running)",
                started.elapsed()
            );
            broker().restart();
            broker_restarts += 1;
        }
        if i == two_at {
            let mut second = Bridge::start(&env);
            restarts += 1;
            let joined = log_says(&second, "partition assigned", Duration::from_secs(20));
            tokio::time::sleep(random_wait(&mut rng)).await;
            let kill_first = rng.bool();
            eprintln!(
                "chaos: [{:>5.1?}] two instances (second got partitions: {joined}); SIGKILL the {}",
                started.elapsed(),
                if kill_first { "first" } else { "second" }
            );
            if kill_first {
                kill(&mut current);
                current = second;
            } else {
                kill(&mut second);
            }
            kills += 1;
            // The survivor takes the dead member's partitions once its session times out.
            tokio::time::sleep(SESSION_TIMEOUT + RESTART_MARGIN).await;
            continue;
        }
        tokio::time::sleep(random_wait(&mut rng)).await;
        eprintln!("chaos: [{:>5.1?}] SIGKILL", started.elapsed());
        kill(&mut current);
        kills += 1;
        tokio::time::sleep(SESSION_TIMEOUT + RESTART_MARGIN).await;
        current = Bridge::start(&env);
        restarts += 1;
    }

    // Let the last bridge run every watch it has to its end: wait until every feed is final,
    // then until the resource has had no request for 3 s (a final watch is not polled again;
    // polls are 250 ms apart), at most 60 s.
    let final_at = feeds.all_final_at(users);
    // The quiet spell only counts once the last bridge owns its partitions: a bridge still
    // joining its group polls nothing either.
    current.wait_for_log("partition assigned", Duration::from_secs(60));
    let assigned_at = now_ms();
    let settle_deadline = Instant::now()
        + Duration::from_millis((final_at - now_ms()).max(0) as u64)
        + Duration::from_secs(60);
    loop {
        let now = now_ms();
        let last = last_request.load(Ordering::Relaxed);
        if now > final_at + 1000 && last > assigned_at && now - last > 3000 {
            break;
        }
        if Instant::now() > settle_deadline {
            eprintln!("chaos: watches still polling after the settle deadline");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, took) = current.terminate();
    eprintln!(
        "chaos: [{:>5.1?}] last bridge stopped (exit {code:?} after {took:.1?})",
        started.elapsed()
    );

    // Ground truth: every (user, item) that exists now, with its event time.
    let end = now_ms();
    let mut expected: BTreeMap<(String, String), i64> = BTreeMap::new();
    for user in 0..users {
        for item in 0..feeds.len_at(user, end) {
            expected.insert(
                (input_key(user), Feeds::output_key(user, item)),
                feeds.event_time(user, item),
            );
        }
    }

    let records = broker().read_to_end(&output).await;
    let mut copies: BTreeMap<(String, String), Vec<&OwnedMessage>> = BTreeMap::new();
    let mut unexpected = Vec::new();
    let mut wrong_time = Vec::new();
    for m in &records {
        if header(m, "watchbridge-control").is_some() {
            continue;
        }
        let key = (
            m.key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default(),
            text(m, "watchbridge-output-key").unwrap_or_default(),
        );
        match expected.get(&key) {
            None => unexpected.push(key),
            Some(&event_time) => {
                let ts = m.timestamp().to_millis();
                if ts != Some(event_time) {
                    wrong_time.push((key.clone(), event_time, ts));
                }
                copies.entry(key).or_default().push(m);
            }
        }
    }
    let lost: Vec<&(String, String)> = expected
        .keys()
        .filter(|k| !copies.contains_key(*k))
        .collect();
    let duplicated: Vec<(&(String, String), &Vec<&OwnedMessage>)> =
        copies.iter().filter(|(_, c)| c.len() > 1).collect();
    let exactly_once = copies.values().filter(|c| c.len() == 1).count();
    let extra_copies: usize = duplicated.iter().map(|(_, c)| c.len() - 1).sum();

    // Each input partition's watermark on the watermark topic, in topic order (one
    // partition), never goes back.
    let mut last_watermark: HashMap<i32, i64> = HashMap::new();
    let mut regressions = Vec::new();
    let watermark_records = broker().read_to_end(&watermarks).await;
    for m in &watermark_records {
        let Some(Ok(WatermarkMessage::Partition {
            partition,
            watermark_ms,
            ..
        })) = m.payload().map(WatermarkMessage::parse)
        else {
            continue;
        };
        if let Some(&previous) = last_watermark.get(&partition) {
            if watermark_ms < previous {
                regressions.push((partition, previous, watermark_ms, m.offset()));
            }
        }
        let entry = last_watermark.entry(partition).or_insert(watermark_ms);
        *entry = (*entry).max(watermark_ms);
    }

    println!(
        "chaos: guarantee={guarantee} expected={} exactly_once={exactly_once} lost={} duplicated={} restarts={restarts} \
         broker_restarts={broker_restarts} zombies={zombies} wrong_event_time={} watermark_regressions={}",
        expected.len(),
        lost.len(),
        duplicated.len(),
        wrong_time.len(),
        regressions.len()
    );
    // Where the group stands on the input: a committed input is not read again after a
    // crash, so (without durable state) its watch is not resumed.
    let committed = broker().committed(&format!("{input}-group"), &input, PARTITIONS);
    println!(
        "chaos: details: kills={kills} output_records={} extra_copies={extra_copies} \
         unexpected={} watermark_records={} committed_input_offsets={committed:?} \
         seed={seed} items_per_user={items} took={:.1?}",
        records.len(),
        unexpected.len(),
        watermark_records.len(),
        started.elapsed()
    );
    for (input_key, output_key) in lost.iter().take(5) {
        println!("chaos: lost {input_key} {output_key}");
    }
    let mut lost_per_user: BTreeMap<&str, usize> = BTreeMap::new();
    for (input_key, _) in &lost {
        *lost_per_user.entry(input_key.as_str()).or_default() += 1;
    }
    if !lost_per_user.is_empty() {
        println!("chaos: lost per watch: {lost_per_user:?}");
    }
    for ((input_key, output_key), c) in duplicated.iter().take(5) {
        let at: Vec<String> = c
            .iter()
            .map(|m| format!("p{}@{}", m.partition(), m.offset()))
            .collect();
        println!(
            "chaos: duplicated {input_key} {output_key} x{} at {}",
            c.len(),
            at.join(",")
        );
    }
    for ((input_key, output_key), want, got) in wrong_time.iter().take(5) {
        println!("chaos: wrong event time {input_key} {output_key}: want {want}, got {got:?}");
    }
    for (partition, previous, value, offset) in regressions.iter().take(5) {
        println!(
            "chaos: watermark regression partition {partition}: {previous} then {value} (offset {offset})"
        );
    }
    for key in unexpected.iter().take(5) {
        println!("chaos: unexpected output {key:?}");
    }

    assert!(
        lost.is_empty()
            && duplicated.is_empty()
            && wrong_time.is_empty()
            && regressions.is_empty()
            && unexpected.is_empty(),
        "not every output exactly once with its event time, or a watermark went back (see the chaos: lines)"
    );
}
