//! `gp2p bench host`: copy_to_host / copy_from_host against the pinned DMA rates.

use clap::Args;
use geforce_p2p::kernels::reference::fill_random;
use geforce_p2p::ops::{copy_from_host, copy_to_host};
use geforce_p2p::{Device, DeviceBuffer, PinnedBuffer};

use super::{CEILING_BYTES, Common, finish, progress};
use crate::error::CliError;
use crate::measure::{Ceilings, timed_runs};
use crate::report::{Report, Row};
use crate::sizes::format_size;
use crate::table::{num, table};

#[derive(Args)]
pub struct HostArgs {
    #[command(flatten)]
    common: Common,
    /// Device ordinal.
    #[arg(short = 'd', long, default_value_t = 0)]
    device: usize,
}

pub fn run(args: &HostArgs) -> Result<(), CliError> {
    let c = &args.common;
    let sizes = c.sizes()?;
    let repeats = c.repeats()?;
    let device = Device::open(args.device)?;
    let stream = c.stream(&device)?;
    eprintln!("measuring ceilings ...");
    let mut ceilings = Ceilings::new(&device, &stream, CEILING_BYTES, repeats)?;
    let (d2h, h2d) = (ceilings.d2h()?, ceilings.h2d()?);
    let measured = ceilings.measured.clone();
    drop(ceilings);
    let max = sizes.iter().max().copied().unwrap_or(0);
    let mut host_in = PinnedBuffer::<u8>::alloc(&device, max)?;
    fill_random(host_in.as_mut_slice()?, 0x4057);
    let mut host_out = PinnedBuffer::<u8>::alloc(&device, max)?;
    let mut dev = DeviceBuffer::<u8>::alloc(&device, max)?;
    let bar = progress(sizes.len() * 2);
    let mut rows = Vec::new();
    for &bytes in &sizes {
        for direction in ["from_host", "to_host"] {
            bar.set_message(format!("{direction} {}", format_size(bytes)));
            let timing = if direction == "from_host" {
                timed_runs(
                    &stream,
                    repeats,
                    || Ok(()),
                    || Ok(copy_from_host(&stream, &host_in.view(..bytes), &mut dev.view_mut(..bytes))?),
                )?
            } else {
                timed_runs(
                    &stream,
                    repeats,
                    || Ok(()),
                    || Ok(copy_to_host(&stream, &dev.view(..bytes), &mut host_out.view_mut(..bytes))?),
                )?
            };
            // from_host leaves host_in's bytes on the device, to_host brings them back.
            let wrong = if direction == "to_host" {
                host_out.as_slice()?[..bytes].iter().zip(&host_in.as_slice()?[..bytes]).filter(|(a, b)| a != b).count()
            } else {
                0
            };
            let (ceiling, name) = if direction == "from_host" { (h2d, "h2d") } else { (d2h, "d2h") };
            let busbw = bytes as f64 / timing.gpu_seconds / 1e9;
            rows.push(Row {
                bench: "host",
                route: direction.into(),
                dtype: "u8".into(),
                op: "none".into(),
                ranks: 1,
                bytes,
                count: bytes,
                time_us: timing.gpu_seconds * 1e6,
                algbw: busbw,
                busbw,
                ceiling,
                ceiling_name: name,
                ratio: busbw / ceiling,
                enqueue_us: Some(timing.enqueue_seconds * 1e6),
                model_us: None,
                wrong,
                error: None,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let report = Report::new(&device, measured, c.iters, rows)?.on_streams(c.stream.name());
    println!(
        "# gp2p bench host on {} ({}), medians of {} timed runs",
        report.gpu.name, report.gpu.driver, report.repeats
    );
    println!("# ceilings (plain pinned DMA, {}): h2d {h2d:.1} GB/s, d2h {d2h:.1} GB/s", format_size(CEILING_BYTES));
    let mut t = table(&["size", "direction", "time us", "GB/s", "/ceil", "#wrong"], &["direction"]);
    for r in &report.rows {
        t.add_row(vec![
            format_size(r.bytes),
            r.route.clone(),
            num(r.time_us, 1),
            num(r.busbw, 2),
            num(r.ratio, 3),
            r.wrong.to_string(),
        ]);
    }
    println!("{}", t.trim_fmt());
    finish(&report, c, "host")
}
