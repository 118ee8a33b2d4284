//! GPU time per call of the library's one-kernel exchanges with both ranks on one GPU (the
//! test-only constructors): the chunk exchange at 8 KiB-1 MiB and the line exchange at 64 B
//! and 2 KiB, f32 sum. Every timed loop queues `--calls` calls on both streams behind host
//! gates (so the host's enqueue rate is not what is timed), opens the gates, and times each
//! stream with events; the figure is the slower stream's time per call, the median of
//! `--repeats` loops after a warm-up loop. Every call's result is checked after each loop.
//!
//!     cargo run --release -p gp2p-tests --example exchange_one_device -- [--calls 100] [--repeats 7]
//!
//! Both ranks share the one link, so these are not two-GPU figures; they compare kernels.

use std::time::Duration;

use geforce_p2p::cuda::{Event, EventKind, HostGate};
use geforce_p2p::pinned::{ChunkExchange, LineExchange, PairExchange};
use geforce_p2p::{Device, DeviceBuffer, ReduceOp, Stream};

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let mut calls = 100usize;
    let mut repeats = 7usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match pair {
            [flag, value] if flag == "--calls" => calls = value.parse()?,
            [flag, value] if flag == "--repeats" => repeats = value.parse()?,
            _ => return Err(format!("usage: exchange_one_device [--calls N] [--repeats N]; got {args:?}").into()),
        }
    }
    let device = Device::open(0)?;
    let streams = [Stream::new(&device)?, Stream::new(&device)?];
    let chunk_max = ChunkExchange::max_bytes_sharing_a_device(&device).min(1 << 20);
    let mut chunks = ChunkExchange::sharing_a_device_for_tests(&device, chunk_max, Duration::from_secs(2))?;
    chunks.set_queue_timeout(Duration::from_secs(10));
    let mut lines = LineExchange::sharing_a_device_for_tests(&device, 2048, Duration::from_secs(10))?;
    lines.set_start_together(false);
    println!("# exchange_one_device on {}, {calls} calls a loop, median of {repeats} loops", device.info().name);
    println!("{:>8} {:>7} {:>10}  each loop", "bytes", "kernel", "us/call");
    for bytes in [64usize, 2048] {
        report(bytes, "lines", time(&mut lines, &streams, bytes, calls, repeats)?);
    }
    for bytes in [8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
        if bytes <= chunk_max {
            report(bytes, "chunks", time(&mut chunks, &streams, bytes, calls, repeats)?);
        }
    }
    Ok(())
}

fn report(bytes: usize, kernel: &str, mut loops: Vec<f64>) {
    let each: Vec<String> = loops.iter().map(|t| format!("{t:.2}")).collect();
    loops.sort_by(f64::total_cmp);
    println!("{bytes:>8} {kernel:>7} {:>10.2}  {}", loops[loops.len() / 2], each.join(" "));
}

/// Per-call GPU time of `exchange` at `bytes`, one figure per timed loop (after a warm-up).
fn time(
    exchange: &mut impl PairExchange,
    streams: &[Stream; 2],
    bytes: usize,
    calls: usize,
    repeats: usize,
) -> Result<Vec<f64>, Failure> {
    let len = bytes / 4;
    let mut loops = Vec::new();
    for repeat in 0..=repeats {
        // Small integers: every sum is exact, so after k calls each element is (a + b) * 2^(k-1).
        let inputs: Vec<Vec<f32>> =
            (0..2).map(|r| (0..len).map(|i| ((i * 7 + r * 3 + repeat) % 5) as f32).collect()).collect();
        let bufs: Vec<DeviceBuffer<f32>> =
            inputs.iter().zip(streams).map(|(h, s)| DeviceBuffer::from_host(s, h)).collect::<Result<_, _>>()?;
        let [mut a, mut b] = <[DeviceBuffer<f32>; 2]>::try_from(bufs).map_err(|_| "two buffers")?;
        streams[0].synchronize()?;
        streams[1].synchronize()?;
        let gates = [
            HostGate::close_until(&streams[0], Duration::from_secs(10))?,
            HostGate::close_until(&streams[1], Duration::from_secs(10))?,
        ];
        let events: Vec<[Event; 2]> = (0..2)
            .map(|_| {
                Ok([
                    Event::new(streams[0].device(), EventKind::Timing)?,
                    Event::new(streams[0].device(), EventKind::Timing)?,
                ])
            })
            .collect::<Result<_, Failure>>()?;
        for (r, s) in streams.iter().enumerate() {
            events[r][0].record(s)?;
        }
        for _ in 0..calls {
            exchange.all_reduce(
                [&mut a.view_mut(..), &mut b.view_mut(..)],
                [&streams[0], &streams[1]],
                ReduceOp::Sum,
                1,
            )?;
        }
        for (r, s) in streams.iter().enumerate() {
            events[r][1].record(s)?;
        }
        let expired = gates.iter().any(HostGate::expired);
        for gate in gates {
            gate.open();
        }
        if expired {
            return Err("a gate expired while the calls were queued: the loop is not timed".into());
        }
        let mut slowest = 0f64;
        for [start, end] in &events {
            end.synchronize()?;
            slowest = slowest.max(f64::from(Event::elapsed_ms(start, end)?) * 1e3 / calls as f64);
        }
        let scale = 2f32.powi(calls as i32 - 1);
        let want: Vec<f32> = inputs[0].iter().zip(&inputs[1]).map(|(x, y)| (x + y) * scale).collect();
        for (r, (buf, stream)) in [&a, &b].into_iter().zip(streams).enumerate() {
            if buf.to_host_vec(stream)? != want {
                return Err(format!("{bytes} bytes, loop {repeat}: rank {r} is wrong").into());
            }
        }
        if repeat > 0 {
            loops.push(slowest);
        }
    }
    Ok(loops)
}
