//! `gp2p devices`: what the CUDA layer sees.

use geforce_p2p::Device;
use geforce_p2p::cuda::{MIN_COMPUTE_CAPABILITY, driver_version};

use crate::error::CliError;
use crate::table::{num, table};

pub fn run() -> Result<(), CliError> {
    let (major, minor) = driver_version()?;
    let devices = Device::all_info()?;
    println!("CUDA driver {major}.{minor}, {} device(s)", devices.len());
    let mut t = table(&["#", "name", "cc", "memory GiB", "SMs", "pci", "usable"], &["name", "pci", "usable"]);
    for d in &devices {
        let (cc_major, cc_minor) = d.compute_capability;
        let usable = if d.is_supported() {
            "yes".to_string()
        } else {
            let (min_major, min_minor) = MIN_COMPUTE_CAPABILITY;
            format!("no: needs compute capability {min_major}.{min_minor}")
        };
        t.add_row(vec![
            d.ordinal.to_string(),
            d.name.clone(),
            format!("{cc_major}.{cc_minor}"),
            num(d.total_memory as f64 / (1u64 << 30) as f64, 1),
            d.multiprocessors.to_string(),
            d.pci_bus_id.clone(),
            usable,
        ]);
    }
    println!("{}", t.trim_fmt());
    Ok(())
}
