//! What the benchmarks share: the `BENCH_SCALE` factor and reading a process's peak memory.

// Each benchmark uses a part.
#![allow(dead_code)]

/// The allocator capstan's binaries choose, so a benchmark measures what they run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `BENCH_SCALE` (default 1): the share of the full load a run takes.
pub fn factor() -> f64 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// `n` scaled by [`factor`], at least 1.
pub fn scale(n: usize) -> usize {
    ((n as f64) * factor()).round().max(1.0) as usize
}

/// VmHWM (peak resident memory) of the process whose `/proc/.../status` is at `path`, in
/// MiB; NaN when it cannot be read.
pub fn peak_rss_mib(path: &str) -> f64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}
