//! Object-store benchmark: a 100,000-object prefix listed, then followed by a poll that
//! lists only the new objects (issue 22), against moto in server mode (a real S3 API, the
//! tests' `tests/support/moto_process.rs`), with every request counted by a proxy in front
//! of it (`tests/support/s3_proxy.rs`). Run with `make bench`; `OBJECT_BENCH_OBJECTS`
//! changes the size (`BENCH_SMOKE=1`: 2,000).
//!
//! Not timed: moto is filled with `object_store` puts, 64 at a time (the fill rate is
//! reported: moto, a Python server, is the slow part of the whole bench). Timed, each poll
//! of the poller itself (`Poller::poll`, no engine, no Kafka):
//!
//! 1. the first poll with `WATCHBRIDGE_OBJECT_INCREASING_NAMES=true`: a listing of the
//!    whole prefix, one request per 1,000 keys (S3's page);
//! 2. ten new objects (named after the others), then a poll: one request, `start-after`
//!    the last key;
//! 3. the same ten-new poll after a restart, the watch resumed from its saved state;
//! 4. for comparison, a poll of the default mode (every poll lists the whole prefix).
//!
//! The poll timeout is set long (10 minutes) so the first listing is never cut; under the
//! default `WATCHBRIDGE_POLL_TIMEOUT` (30 s) a longer listing goes on over several polls.

#[path = "../tests/support/moto_process.rs"]
mod moto_process;
#[path = "../tests/support/s3_proxy.rs"]
#[allow(dead_code)]
mod s3_proxy;
#[path = "support/mod.rs"]
mod support;

use futures::StreamExt;
use moto_process::{Auth, MotoProcess};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use s3_proxy::S3Proxy;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::report::{env_or, summary_line};
use watchbridge::poll::Poller;
use watchbridge::pollers::object_store::{ObjectArgs, ObjectStorePoller};
use watchbridge::pollers::Resolve;

const NEW: usize = 10;

fn main() {
    let smoke = std::env::var("BENCH_SMOKE").is_ok();
    let objects = env_or("OBJECT_BENCH_OBJECTS", if smoke { 2_000 } else { 100_000 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(objects));
}

fn poller(endpoint: &str, increasing: bool) -> ObjectStorePoller {
    let args = ObjectArgs {
        object_url: Some("s3://bench/logs/".into()),
        object_increasing_names: increasing,
        ..ObjectArgs::default()
    };
    let options = [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "bench"),
        ("aws_secret_access_key", "bench"),
        ("aws_region", "us-east-1"),
    ];
    ObjectStorePoller::with_options(args.config(Duration::from_secs(600)).unwrap(), &options)
        .unwrap()
}

/// One measured poll: seconds, requests, outputs.
struct Measured {
    secs: f64,
    requests: usize,
    outputs: usize,
}

async fn measure(
    proxy: &S3Proxy,
    poller: &ObjectStorePoller,
    target: &Arc<<ObjectStorePoller as Poller>::Input>,
) -> Measured {
    proxy.clear();
    let started = Instant::now();
    let result = poller.poll(target.clone()).await.expect("poll");
    Measured {
        secs: started.elapsed().as_secs_f64(),
        requests: proxy.requests().len(),
        outputs: result.outputs.len(),
    }
}

async fn fill(moto: &MotoProcess, names: impl Iterator<Item = String>) -> f64 {
    let store = Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(moto.url())
            .with_allow_http(true)
            .with_bucket_name("bench")
            .with_access_key_id("bench")
            .with_secret_access_key("bench")
            .with_region("us-east-1")
            .build()
            .unwrap(),
    );
    let started = Instant::now();
    futures::stream::iter(names)
        .map(|name| {
            let store = store.clone();
            async move {
                store
                    .put(&Path::from(name), PutPayload::from_static(b"{}"))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    started.elapsed().as_secs_f64()
}

async fn run(objects: usize) {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("bench");
    eprintln!("object_store: filling moto with {objects} objects");
    let fill_secs = fill(&moto, (0..objects).map(|i| format!("logs/{i:08}.json"))).await;
    eprintln!(
        "object_store: filled in {fill_secs:.1} s ({:.0} puts/s)",
        objects as f64 / fill_secs
    );
    let proxy = S3Proxy::start(&moto.url()).await;
    let incremental = poller(&proxy.url(), true);
    let target = Arc::new(incremental.resolve(&json!({}), b"k").unwrap());
    let first = measure(&proxy, &incremental, &target).await;
    assert_eq!(first.outputs, objects);

    fill(
        &moto,
        (objects..objects + NEW).map(|i| format!("logs/{i:08}.json")),
    )
    .await;
    let second = measure(&proxy, &incremental, &target).await;
    assert_eq!(second.outputs, NEW);

    // A restart: a new poller and watch, resumed from the saved state; ten more objects.
    let saved = incremental.resume_state(&target).expect("saved state");
    let restarted = poller(&proxy.url(), true);
    let resumed = Arc::new(restarted.resolve(&json!({}), b"k").unwrap());
    restarted.resume(&resumed, &saved);
    fill(
        &moto,
        (objects + NEW..objects + 2 * NEW).map(|i| format!("logs/{i:08}.json")),
    )
    .await;
    let after_restart = measure(&proxy, &restarted, &resumed).await;
    assert_eq!(after_restart.outputs, NEW);

    let full = poller(&proxy.url(), false);
    let full_target = Arc::new(full.resolve(&json!({}), b"k").unwrap());
    let whole = measure(&proxy, &full, &full_target).await;
    assert_eq!(whole.outputs, objects + 2 * NEW);

    let row = |what: &str, m: &Measured| {
        format!(
            "| {what} | {} | {} | {:.2} s |\n",
            m.outputs, m.requests, m.secs
        )
    };
    let mut out = String::new();
    out.push_str("## Object store: listing a large prefix, then only what is new\n\n");
    out.push_str(&format!(
        "moto {} (S3 API, Python) on loopback, {objects} objects under one prefix (filled at \
         {:.0} puts/s, not timed); each poll is `Poller::poll` of the object-store poller, \
         requests counted by a proxy in front of moto.\n\n",
        "5.2.5",
        objects as f64 / fill_secs
    ));
    out.push_str("| poll | outputs | requests | time |\n|---|---|---|---|\n");
    out.push_str(&row("first poll, increasing names (whole prefix)", &first));
    out.push_str(&row(&format!("after {NEW} new objects"), &second));
    out.push_str(&row(
        &format!("after a restart (saved state) and {NEW} new objects"),
        &after_restart,
    ));
    out.push_str(&row(
        "default mode: every poll lists the whole prefix",
        &whole,
    ));
    out.push('\n');
    let only_new = second.requests == 1 && after_restart.requests == 1;
    out.push_str(&summary_line(
        &format!("object store: {objects}-object prefix listed, then a poll of {NEW} new objects"),
        &format!(
            "first {:.1} s in {} requests; then {:.3} s in {} request ({} after a restart)",
            first.secs, first.requests, second.secs, second.requests, after_restart.requests
        ),
        "one request per poll for what is new",
        only_new,
    ));
    print!("{out}");
}
