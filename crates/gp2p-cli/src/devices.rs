//! `gp2p devices`: what the CUDA layer sees.

use geforce_p2p::Device;
use geforce_p2p::cuda::{MIN_COMPUTE_CAPABILITY, driver_version};

use crate::error::CliError;

pub fn run() -> Result<(), CliError> {
    let (major, minor) = driver_version()?;
    let devices = Device::all_info()?;
    println!("CUDA driver {major}.{minor}, {} device(s)", devices.len());
    println!("{:>3}  {:<28} {:>5}  {:>9}  {:>4}  {:<14} usable", "#", "name", "cc", "memory", "SMs", "pci");
    for d in &devices {
        let (cc_major, cc_minor) = d.compute_capability;
        let usable = if d.is_supported() {
            "yes".to_string()
        } else {
            let (min_major, min_minor) = MIN_COMPUTE_CAPABILITY;
            format!("no: needs compute capability {min_major}.{min_minor}")
        };
        println!(
            "{:>3}  {:<28} {:>5}  {:>6.1} GiB  {:>4}  {:<14} {usable}",
            d.ordinal,
            d.name,
            format!("{cc_major}.{cc_minor}"),
            d.total_memory as f64 / (1u64 << 30) as f64,
            d.multiprocessors,
            d.pci_bus_id,
        );
    }
    Ok(())
}
