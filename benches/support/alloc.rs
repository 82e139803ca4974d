//! Exact heap accounting for memory figures: a global allocator (the binary's,
//! [`watchbridge::Allocator`], underneath) that counts the bytes it has handed out and not
//! had back, and the process's resident set from /proc (what the OS
//! sees, allocator overhead and C libraries' own allocations — librdkafka's — included).
//!
//! A bench installs it with
//! `#[global_allocator] static GLOBAL: support::alloc::Counting = support::alloc::Counting;`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use watchbridge::Allocator;

pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        Allocator.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        Allocator.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        Allocator.realloc(ptr, layout, new_size)
    }
}

/// Bytes the Rust allocator has handed out and not had back.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Resident set size in bytes, from /proc (0 where unavailable).
pub fn rss() -> isize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<isize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Runs `case` of this bench in a fresh process (`BENCH_CASE=case`; the bench's `main`
/// answers it by printing numbers), so that its heap and resident set start from nothing
/// and no earlier case's leftovers count; returns the numbers it printed.
pub fn run_fresh(case: &str, n: usize) -> Vec<f64> {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .env("BENCH_CASE", case)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run a case");
    let text = String::from_utf8_lossy(&out.stdout);
    let nums: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse::<f64>().ok())
        .collect();
    if !out.status.success() || nums.len() < n {
        panic!("case {case} failed ({}): {text}", out.status);
    }
    nums
}
