//! GPU: many host threads share the facade's copy engine and one collectives engine, each on
//! its own streams, and run random operations with no host synchronisation until the end.
//! Buffers are dropped right after the enqueue that last uses them and fresh buffers are
//! written at once, into whatever memory the drops free. Every surviving buffer is then
//! checked against a host model. Seeded: the seed is printed, and `GP2P_STRESS_SEED` replays
//! it; `GP2P_STRESS_OPS` sets the number of operations (2,000 by default).

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use geforce_p2p::ops::reduce_from_host;
use geforce_p2p::pinned::{copy_from_host, copy_to_host};
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, PinnedBuffer, ReduceOp, Route, Stream, transport};
use gp2p_collectives::{Engine, Rank, Receive, all_gather, all_reduce};
use gp2p_tests::{SplitMix64, device, drop_limit, fill_random, max_len, needs};

/// Host threads, unless `GP2P_STRESS_THREADS` says otherwise.
const THREADS: usize = 8;
/// Copies go up to 8 MiB of u32.
const MAX_ELEMENTS: usize = 2 << 20;
/// Live buffers a thread keeps before it drops some.
const MAX_LIVE: usize = 12;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A device buffer and what it must hold.
struct Tracked {
    device: usize,
    buffer: DeviceBuffer<u32>,
    model: Vec<u32>,
}

/// One timed drop: how long it took, how much of that the thread sat runnable waiting for a
/// CPU (the scheduler's doing, not the drop's), and what was dropped.
#[derive(Clone, Copy)]
struct DropTime {
    took: Duration,
    runnable: Duration,
    what: &'static str,
    /// Which of its thread's drops it was (0: the first).
    nth: usize,
}

impl DropTime {
    /// The time the drop ran or blocked: what the library is answerable for.
    fn own(&self) -> Duration {
        self.took.saturating_sub(self.runnable)
    }
}

/// Nanoseconds this thread has spent runnable but waiting for a CPU (Linux schedstat), if known.
fn runqueue_wait_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// What one thread measured.
#[derive(Default)]
struct Tally {
    drops: Vec<DropTime>,
    checked: usize,
}

struct Worker<'a> {
    rng: SplitMix64,
    devices: &'a [Device],
    streams: Vec<Stream>,
    engine: &'a Engine,
    live: Vec<Tracked>,
    tally: Tally,
}

impl Worker<'_> {
    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n.max(1) as u64) as usize
    }

    /// Random lengths from 0 to MAX_ELEMENTS, a third tiny, a third up to 64 Ki elements.
    fn length(&mut self) -> usize {
        let cap = MAX_ELEMENTS.min(max_len());
        match self.below(3) {
            0 => self.below(65),
            1 => self.below((64 << 10).min(cap) + 1),
            _ => self.below(cap + 1),
        }
    }

    fn drop_timed<T>(&mut self, value: T) {
        let waited = runqueue_wait_ns();
        let start = Instant::now();
        drop(value);
        let took = start.elapsed();
        let runnable = match (waited, runqueue_wait_ns()) {
            (Some(before), Some(after)) => Duration::from_nanos(after.saturating_sub(before)),
            _ => Duration::ZERO,
        };
        let what = std::any::type_name::<T>().rsplit("::").next().unwrap_or("?");
        let nth = self.tally.drops.len();
        self.tally.drops.push(DropTime { took, runnable, what, nth });
    }

    /// A fresh buffer written at once: from a pinned buffer of random data, or by a memset.
    fn fresh(&mut self, device: usize, len: usize) -> Tracked {
        let mut buffer = DeviceBuffer::<u32>::alloc(&self.devices[device], len).unwrap();
        let from_pinned = self.below(2) == 0;
        let (seed, byte) = (self.rng.next_u64(), self.rng.next_u64() as u8);
        let stream = &self.streams[device];
        let model = if from_pinned {
            let mut host = PinnedBuffer::<u32>::alloc(&self.devices[device], len).unwrap();
            let mut model = vec![0u32; len];
            fill_random(&mut model, seed);
            // A fresh pinned buffer has no GPU work to wait for: writing it never blocks.
            host.as_mut_slice().unwrap().copy_from_slice(&model);
            copy_from_host(stream, &host.view(..), &mut buffer.view_mut(..)).unwrap();
            self.drop_timed(host);
            model
        } else {
            buffer.fill_bytes(stream, byte).unwrap();
            vec![u32::from_ne_bytes([byte; 4]); len]
        };
        Tracked { device, buffer, model }
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.live.is_empty()).then(|| self.below(self.live.len()))
    }

    fn step(&mut self) {
        let devices = self.devices.len();
        match self.below(8) {
            0 | 1 => {
                let (device, len) = (self.below(devices), self.length());
                let t = self.fresh(device, len);
                self.live.push(t);
            }
            2 | 3 => self.copy(),
            4 => self.host_round_trip(),
            5 => self.reduce_from_host(),
            6 if devices >= 2 => self.collective(),
            _ => {
                if let Some(i) = self.pick() {
                    let t = self.live.swap_remove(i);
                    self.drop_timed(t.buffer);
                }
            }
        }
        while self.live.len() > MAX_LIVE {
            let t = self.live.swap_remove(0);
            self.drop_timed(t.buffer);
        }
    }

    /// A copy into a new buffer on a random device by a random route, then (half the time)
    /// the source dropped at once.
    fn copy(&mut self) {
        let Some(i) = self.pick() else { return };
        let to = self.below(self.devices.len());
        let route = [Route::Auto, Route::Staged][self.below(2)];
        let chunk_bytes = [None, Some(64 << 10), Some(1 << 20)][self.below(3)];
        let len = self.live[i].model.len();
        let mut dst = DeviceBuffer::<u32>::alloc(&self.devices[to], len).unwrap();
        let src = &self.live[i];
        let options = CopyOptions { route, chunk_bytes, slots: None };
        let (src_stream, dst_stream) = (&self.streams[src.device], &self.streams[to]);
        transport().copy(&src.buffer.view(..), src_stream, &mut dst.view_mut(..), dst_stream, options).unwrap();
        let copied = Tracked { device: to, buffer: dst, model: src.model.clone() };
        if self.below(2) == 0 {
            let t = self.live.swap_remove(i);
            self.drop_timed(t.buffer);
        }
        self.live.push(copied);
    }

    /// Device to pinned to (another) device; the pinned buffer dropped at once.
    fn host_round_trip(&mut self) {
        let Some(i) = self.pick() else { return };
        let to = self.below(self.devices.len());
        let src = &self.live[i];
        let len = src.model.len();
        let mut host = PinnedBuffer::<u32>::alloc(&self.devices[src.device], len).unwrap();
        copy_to_host(&self.streams[src.device], &src.buffer.view(..), &mut host.view_mut(..)).unwrap();
        let mut back = DeviceBuffer::<u32>::alloc(&self.devices[to], len).unwrap();
        // The upload runs on another device's stream: order it after the download.
        let point = self.streams[src.device].point().unwrap();
        self.streams[to].wait_point(&point).unwrap();
        copy_from_host(&self.streams[to], &host.view(..), &mut back.view_mut(..)).unwrap();
        let model = src.model.clone();
        self.drop_timed(host);
        self.live.push(Tracked { device: to, buffer: back, model });
    }

    /// `dst += pinned` with the kernel reading pinned memory; the pinned buffer dropped at once.
    fn reduce_from_host(&mut self) {
        let Some(i) = self.pick() else { return };
        let t = &mut self.live[i];
        let len = t.model.len();
        let mut host = PinnedBuffer::<u32>::alloc(&self.devices[t.device], len).unwrap();
        let seed = self.rng.next_u64();
        fill_random(host.as_mut_slice().unwrap(), seed);
        let t = &mut self.live[i];
        reduce_from_host(&self.streams[t.device], &mut t.buffer.view_mut(..), &host.view(..), ReduceOp::Sum, 1)
            .unwrap();
        // The addend again from its seed: reading `host` back would wait for the kernel.
        let mut addend = vec![0u32; len];
        fill_random(&mut addend, seed);
        for (m, a) in t.model.iter_mut().zip(&addend) {
            *m = m.wrapping_add(*a);
        }
        self.drop_timed(host);
    }

    /// An all_reduce or all_gather over two buffers, one per device; inputs dropped at once.
    fn collective(&mut self) {
        let len = self.length();
        let a = self.fresh(0, len);
        let b = self.fresh(1, len);
        let mut pair = [a, b];
        if self.below(2) == 0 {
            let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][self.below(3)];
            {
                let [x, y] = &mut pair;
                let mut ranks = vec![
                    Rank { buffer: x.buffer.view_mut(..), stream: &self.streams[0] },
                    Rank { buffer: y.buffer.view_mut(..), stream: &self.streams[1] },
                ];
                all_reduce(self.engine, &mut ranks, op, Receive::Auto).unwrap();
            }
            let folded: Vec<u32> = pair[0]
                .model
                .iter()
                .zip(&pair[1].model)
                .map(|(x, y)| match op {
                    ReduceOp::Sum => x.wrapping_add(*y),
                    ReduceOp::Max => *x.max(y),
                    _ => *x.min(y),
                })
                .collect();
            for t in &mut pair {
                t.model = folded.clone();
            }
            let [x, y] = pair;
            self.live.push(x);
            self.live.push(y);
        } else {
            let mut outs: Vec<DeviceBuffer<u32>> =
                (0..2).map(|d| DeviceBuffer::alloc(&self.devices[d], 2 * len).unwrap()).collect();
            {
                let views: Vec<_> = pair.iter().map(|t| t.buffer.view(..)).collect();
                let mut ranks: Vec<Rank<'_, u32>> = outs
                    .iter_mut()
                    .zip(&self.streams)
                    .map(|(o, s)| Rank { buffer: o.view_mut(..), stream: s })
                    .collect();
                all_gather(self.engine, &views, &mut ranks, Receive::Auto).unwrap();
            }
            let gathered = [pair[0].model.clone(), pair[1].model.clone()].concat();
            let [x, y] = pair;
            self.drop_timed(x.buffer);
            self.drop_timed(y.buffer);
            for (d, buffer) in outs.into_iter().enumerate() {
                self.live.push(Tracked { device: d, buffer, model: gathered.clone() });
            }
        }
    }

    /// Synchronise once, at the end, and compare every surviving buffer with its model.
    fn check(mut self, thread: usize, seed: u64) -> Tally {
        for s in &self.streams {
            s.synchronize().unwrap();
        }
        for (k, t) in self.live.iter().enumerate() {
            let got = t.buffer.to_host_vec(&self.streams[t.device]).unwrap();
            let wrong = got.iter().zip(&t.model).filter(|(g, w)| g != w).count();
            let first = got.iter().zip(&t.model).position(|(g, w)| g != w);
            assert!(
                wrong == 0 && got.len() == t.model.len(),
                "seed {seed}: thread {thread}, buffer {k} ({} elements on device {}): {wrong} wrong, first at {first:?}",
                t.model.len(),
                t.device
            );
            self.tally.checked += 1;
        }
        self.tally
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn random_operations_from_many_threads_without_host_synchronisation() {
    // One GPU at least; a second, where present, takes half the work and the cross-device copies.
    needs!(gpus: 1);
    let count = Device::count().expect("a driver that just counted the devices");
    let devices: Vec<Device> = (0..count.min(2)).map(device).collect();
    let total: usize = env_or("GP2P_STRESS_OPS", 2000);
    let threads: usize = env_or("GP2P_STRESS_THREADS", THREADS).max(1);
    let seed: u64 = env_or(
        "GP2P_STRESS_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    );
    println!(
        "stress: seed {seed} (GP2P_STRESS_SEED={seed} replays it), {total} operations, {threads} threads, {} devices",
        devices.len()
    );
    let engine = Engine::new();
    let tallies = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (devices, engine, tallies) = (&devices, &engine, &tallies);
            scope.spawn(move || {
                let mut worker = Worker {
                    rng: SplitMix64::new(seed ^ (thread as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    devices,
                    streams: devices.iter().map(|d| Stream::new(d).unwrap()).collect(),
                    engine,
                    live: Vec::new(),
                    tally: Tally::default(),
                };
                let ops = total / threads + usize::from(thread < total % threads);
                for _ in 0..ops {
                    worker.step();
                }
                let tally = worker.check(thread, seed);
                tallies.lock().unwrap().push(tally);
            });
        }
    });
    let tallies = tallies.into_inner().unwrap();
    let mut drops: Vec<DropTime> = tallies.iter().flat_map(|t| t.drops.iter().copied()).collect();
    drops.sort_by_key(|d| d.took);
    let checked: usize = tallies.iter().map(|t| t.checked).sum();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let at = |q: usize| drops.get(drops.len() * q / 1000).map_or(Duration::ZERO, |d| d.took);
    let (p99, p999) = (at(990), at(999));
    let own_max = drops.iter().map(DropTime::own).max().unwrap_or_default();
    println!(
        "stress: {total} operations in {:.2} s, {checked} buffers checked, {} drops: p99 {:.1} us, p99.9 {:.1} us, max {:.1} us; max without runqueue waits {:.1} us",
        started.elapsed().as_secs_f64(),
        drops.len(),
        us(p99),
        us(p999),
        us(drops.last().map_or(Duration::ZERO, |d| d.took)),
        us(own_max),
    );
    for d in drops.iter().rev().take(5) {
        println!(
            "stress: slow drop of {} (its thread's drop #{}): {:.1} us, {:.1} us of it runnable, waiting for a CPU",
            d.what,
            d.nth,
            us(d.took),
            us(d.runnable)
        );
    }
    assert!(checked > 0, "some buffers survive to be checked");
    // The drops themselves take microseconds (gpu_lifetime times each kind alone). With eight
    // threads, the driver's threads and the reclaimer on a shared machine, a thread is now
    // and then descheduled in the middle of one (measured on H200 machines: p99.9 of 1-1.8
    // ms): time spent runnable, waiting for a CPU, is the scheduler's, so the bound on every
    // drop excludes it, and the 99th percentile is bounded with it included.
    assert!(p99 < drop_limit(), "seed {seed}: the 99th percentile of drops took {p99:?}");
    assert!(
        own_max < drop_limit(),
        "seed {seed}: a drop blocked the host for {own_max:?} (not counting runqueue waits)"
    );
    // And, runqueue waits included, no drop beyond the earlier bound of five times the limit.
    let max = drops.last().map_or(Duration::ZERO, |d| d.took);
    assert!(max < 5 * drop_limit(), "seed {seed}: a drop took {max:?}, runqueue waits included");
    assert_eq!(geforce_p2p::cuda::take_deferred_error(), None, "seed {seed}: a destructor failed");
}
