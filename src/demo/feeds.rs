//! The demo's external resource: one growing event feed per user, served over real HTTP on
//! loopback (hyper), shaped like a typical "everything that happened so far" API:
//! `GET /users/{id}/events` → `{"user": …, "events": [{"id", "at", "type", "seq"}], "done": bool}`.
//!
//! A user's feed starts when the user signs up (when the demo produces their record): item
//! `j` appears at `sign-up + first + j·pace`, and every answer lists all items so far — so each poll repeats what the last one saw, and the bridge's
//! dedup has work to do. The first users are given fixed shapes so that every way a watch
//! can end shows up (`total`, `final` with 503s along the way, `stable`, `failed` on 404);
//! the rest are drawn from a seeded generator, so a run is reproducible.

use crate::clock::{Clock, Millis};
use crate::pollers::event_time::format_rfc3339;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// How a feed answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 with the items so far.
    Healthy,
    /// Like `Healthy`, but every third request gets a 503 (never three in a row, so the
    /// bridge's retries always recover).
    Flaky,
    /// 404 on every request: the user has no feed (the watch ends `failed` after retries).
    Missing,
}

/// Every third request of a [`Behaviour::Flaky`] feed fails, starting with the first.
fn unavailable(request: u32) -> bool {
    request % 3 == 1
}

/// One user's feed.
#[derive(Debug, Clone)]
pub struct Feed {
    pub user: String,
    /// When item 0 appears, after the user signed up.
    pub first: Duration,
    /// Time between two items.
    pub pace: Duration,
    /// Items the feed will ever have.
    pub items: u32,
    /// Once the last item exists, answers say `"done": true`.
    pub closes: bool,
    pub behaviour: Behaviour,
}

impl Feed {
    /// How many items exist `elapsed` after the user signed up.
    fn existing(&self, elapsed: Duration) -> u32 {
        let Some(since) = elapsed.checked_sub(self.first) else {
            return 0;
        };
        let n = since.as_millis() / self.pace.as_millis().max(1) + 1;
        n.min(u128::from(self.items)) as u32
    }

    /// What the user's feed is about, for the summary.
    pub fn describe(&self) -> &'static str {
        match (self.behaviour, self.closes) {
            (Behaviour::Missing, _) => "no such user (404)",
            (Behaviour::Flaky, _) => "503 now and then",
            (_, true) => "closes",
            (_, false) if self.items > 1000 => "grows and grows",
            (_, false) => "goes quiet",
        }
    }
}

/// The user ids, in order: `user-00`, `user-01`, …
pub fn user_name(i: u32) -> String {
    format!("user-{i:02}")
}

/// The feeds of `users` users. Users 0–3 have fixed shapes (one per way a watch ends);
/// the others are drawn from `seed`.
pub fn plan(users: u32, seed: u64) -> Vec<Feed> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let ms = Duration::from_millis;
    (0..users)
        .map(|i| {
            let feed = |first, pace, items, closes, behaviour| Feed {
                user: user_name(i),
                first,
                pace,
                items,
                closes,
                behaviour,
            };
            match i {
                // Outlives any `total`: ends by time.
                0 => feed(ms(200), ms(400), 100_000, false, Behaviour::Healthy),
                1 => feed(ms(200), ms(300), 12, true, Behaviour::Flaky),
                // Stops growing early: ends `stable`.
                2 => feed(ms(200), ms(300), 5, false, Behaviour::Healthy),
                3 => feed(ms(200), ms(1000), 0, false, Behaviour::Missing),
                _ => feed(
                    ms(rng.u64(0..=1500)),
                    ms(rng.u64(200..=900)),
                    rng.u32(2..=12),
                    rng.bool(),
                    Behaviour::Healthy,
                ),
            }
        })
        .collect()
}

/// What the server did for one user, for the view and the summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    pub requests: u32,
    pub unavailable: u32,
    pub not_found: u32,
    /// Most items listed in one answer: everything the bridge can have seen.
    pub items: u32,
    pub done: bool,
}

struct State {
    clock: Clock,
    feeds: HashMap<String, Feed>,
    users: Mutex<HashMap<String, User>>,
}

#[derive(Default)]
struct User {
    /// Until then the user does not exist (404).
    signed_up: Option<Millis>,
    served: Served,
}

/// The running server; it stops when dropped.
pub struct FeedServer {
    addr: SocketAddr,
    feeds: Feeds,
    task: tokio::task::JoinHandle<()>,
}

/// The server's feeds, shareable with the tasks that sign users up and watch the counts.
#[derive(Clone)]
pub struct Feeds(Arc<State>);

impl Feeds {
    /// Start `user`'s feed now.
    pub fn sign_up(&self, user: &str) {
        let now = self.0.clock.now_ms();
        let mut users = self.0.users.lock().unwrap_or_else(|p| p.into_inner());
        users.entry(user.to_string()).or_default().signed_up = Some(now);
    }

    pub fn served(&self, user: &str) -> Served {
        let users = self.0.users.lock().unwrap_or_else(|p| p.into_inner());
        users.get(user).map(|u| u.served).unwrap_or_default()
    }
}

impl FeedServer {
    pub async fn start(feeds: Vec<Feed>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            clock: Clock::system(),
            feeds: feeds.into_iter().map(|f| (f.user.clone(), f)).collect(),
            users: Mutex::new(HashMap::new()),
        });
        let serving = state.clone();
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task closes them too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let state = serving.clone();
                        let service = service_fn(move |req: Request<Incoming>| {
                            let response = answer(&state, req.uri().path());
                            async move { Ok::<_, Infallible>(response) }
                        });
                        connections.spawn(
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service),
                        );
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Self {
            addr,
            feeds: Feeds(state),
            task,
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn feeds(&self) -> Feeds {
        self.feeds.clone()
    }
}

impl Drop for FeedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(state: &State, path: &str) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: serde_json::Value| {
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        response
    };
    let no_such_user = || reply(StatusCode::NOT_FOUND, json!({"error": "no such user"}));
    let feed = path
        .strip_prefix("/users/")
        .and_then(|rest| rest.strip_suffix("/events"))
        .and_then(|user| state.feeds.get(user));
    let Some(feed) = feed else {
        return no_such_user();
    };
    let mut users = state.users.lock().unwrap_or_else(|p| p.into_inner());
    let user = users.entry(feed.user.clone()).or_default();
    let served = &mut user.served;
    served.requests += 1;
    let signed_up = match (user.signed_up, feed.behaviour) {
        (Some(at), Behaviour::Healthy | Behaviour::Flaky) => at,
        _ => {
            served.not_found += 1;
            return no_such_user();
        }
    };
    match feed.behaviour {
        Behaviour::Flaky if unavailable(served.requests) => {
            served.unavailable += 1;
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "busy, try again"}),
            );
        }
        _ => {}
    }
    let elapsed = (state.clock.now_ms() - signed_up).max(0) as u64;
    let existing = feed.existing(Duration::from_millis(elapsed));
    let done = feed.closes && existing == feed.items;
    served.items = served.items.max(existing);
    served.done |= done;
    drop(users);
    let events: Vec<_> = (0..existing)
        .map(|j| {
            let at = signed_up + (feed.first + feed.pace * j).as_millis() as Millis;
            json!({
                "id": format!("{}-ev-{j:03}", feed.user),
                "at": format_rfc3339(at),
                "type": KINDS[(j as usize + feed.user.len()) % KINDS.len()],
                "seq": j,
            })
        })
        .collect();
    reply(
        StatusCode::OK,
        json!({"user": feed.user, "events": events, "done": done}),
    )
}

const KINDS: [&str; 5] = [
    "login",
    "viewed_page",
    "added_to_cart",
    "purchase",
    "logout",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_appear_at_their_pace_up_to_the_last() {
        let f = Feed {
            user: "u".into(),
            first: Duration::from_millis(100),
            pace: Duration::from_millis(50),
            items: 3,
            closes: true,
            behaviour: Behaviour::Healthy,
        };
        let at = |ms| f.existing(Duration::from_millis(ms));
        assert_eq!(
            (at(99), at(100), at(149), at(150), at(10_000)),
            (0, 1, 1, 2, 3)
        );
    }

    #[test]
    fn the_plan_is_the_same_for_the_same_seed_and_shows_every_ending() {
        let a = plan(8, 7);
        let b = plan(8, 7);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(a[1].behaviour, Behaviour::Flaky);
        assert_eq!(a[3].behaviour, Behaviour::Missing);
        assert!(a[1].closes && !a[2].closes && !a[0].closes);
        assert_eq!(a[7].user, "user-07");
    }
}
