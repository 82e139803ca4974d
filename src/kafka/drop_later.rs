//! Clients destroyed off the caller's thread, waited for before the process exits.
//!
//! Destroying a librdkafka client takes it some 0.1 s (its threads say goodbye to the
//! brokers), so clients no longer needed are dropped on a thread of their own rather than on
//! the way to a partition's first poll. But a process that returns from `main` while such a
//! thread still runs has its exit handlers (OpenSSL's clean-up among them) run under
//! librdkafka's feet: with TLS a start that failed early then died of SIGSEGV instead of
//! exiting 1 (tests/secured.rs). `main` waits for them ([`wait`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Clients being destroyed now.
static DROPPING: AtomicUsize = AtomicUsize::new(0);

/// Drop `client` on a thread of its own.
pub fn drop_later<T: Send + 'static>(client: T) {
    DROPPING.fetch_add(1, Ordering::SeqCst);
    std::thread::spawn(move || {
        drop(client);
        DROPPING.fetch_sub(1, Ordering::SeqCst);
    });
}

/// Wait until every client given to [`drop_later`] is destroyed, at most `within`.
pub fn wait(within: Duration) {
    let deadline = Instant::now() + within;
    while DROPPING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_ends_once_the_drops_are_done() {
        struct Slow;
        impl Drop for Slow {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let started = Instant::now();
        drop_later(Slow);
        wait(Duration::from_secs(5));
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(DROPPING.load(Ordering::SeqCst), 0);
    }
}
