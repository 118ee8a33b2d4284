//! A caller's `ncclConfig_t`, read once into owned values: what the door needs of it (whether
//! creation may block), and an exact copy for the real NCCL, good after the caller's own config
//! and strings are gone (a creation the door finishes later, on another thread).

use std::ffi::{CString, c_int};
use std::sync::Arc;

use crate::abi::{CONFIG_BLOCKING_END, CONFIG_MAGIC, RawConfig};
use crate::error::{Error, Result};

/// The caller's `ncclConfig_t`, as the real NCCL gets it.
#[derive(Clone)]
pub enum ConfigArg {
    /// None given.
    None,
    /// The caller's own, passed untouched by a creation on the caller's thread, during its
    /// call (its address).
    Caller(usize),
    /// The door's copy, for a creation that outlives the call.
    Owned(Arc<Config>),
}

impl ConfigArg {
    /// Whether a creation with this config may block its caller: NCCL's default, unless the
    /// door's copy says `blocking` is 0 (a caller's own config is read only during its call,
    /// where the door creates on the caller's thread anyway).
    pub fn blocking(&self) -> bool {
        match self {
            ConfigArg::Owned(config) => config.blocking(),
            ConfigArg::None | ConfigArg::Caller(_) => true,
        }
    }
}

/// An `ncclConfig_t` the door owns.
#[derive(Debug, Clone)]
pub struct Config {
    /// The caller's config, its two strings aside (their pointers are null here).
    fields: ConfigFields,
    /// `netName`.
    net_name: Option<CString>,
    /// `commName`.
    comm_name: Option<CString>,
}

/// The plain fields of a config, as `Send` values.
#[derive(Debug, Clone, Copy)]
struct ConfigFields {
    size: usize,
    magic: u32,
    version: u32,
    ints: [c_int; 4],
    split_share: c_int,
    traffic_class: c_int,
    tail: [c_int; 6],
}

impl Config {
    /// A config from the caller's fields (those past its `size` left undefined) and its two
    /// strings.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a config not made with `NCCL_CONFIG_INITIALIZER` (its
    /// magic), as NCCL refuses it.
    pub fn new(raw: &RawConfig, net_name: Option<CString>, comm_name: Option<CString>) -> Result<Config> {
        if raw.magic != CONFIG_MAGIC {
            return Err(Error::argument(
                "config",
                format!("magic {:#x}: initialise it with NCCL_CONFIG_INITIALIZER", raw.magic),
            ));
        }
        let fields = ConfigFields {
            size: raw.size,
            magic: raw.magic,
            version: raw.version,
            ints: [raw.blocking, raw.cga_cluster_size, raw.min_ctas, raw.max_ctas],
            split_share: raw.split_share,
            traffic_class: raw.traffic_class,
            tail: [
                raw.collnet_enable,
                raw.cta_policy,
                raw.shrink_share,
                raw.nvls_ctas,
                raw.n_channels_per_net_peer,
                raw.nvlink_centric_sched,
            ],
        };
        Ok(Config { fields, net_name, comm_name })
    }

    /// Whether creation and calls may block: NCCL's default, unless `blocking` is 0.
    pub fn blocking(&self) -> bool {
        self.fields.size < CONFIG_BLOCKING_END || self.fields.ints[0] != 0
    }

    /// The config for the real NCCL; its strings point into `self`, so it is good while
    /// `self` lives. Its size is at most the door's layout's: a caller's newer fields past it
    /// are not kept, and the real NCCL takes their defaults.
    pub fn to_raw(&self) -> RawConfig {
        let f = &self.fields;
        let string = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        RawConfig {
            size: f.size.min(size_of::<RawConfig>()),
            magic: f.magic,
            version: f.version,
            blocking: f.ints[0],
            cga_cluster_size: f.ints[1],
            min_ctas: f.ints[2],
            max_ctas: f.ints[3],
            net_name: string(&self.net_name),
            split_share: f.split_share,
            traffic_class: f.traffic_class,
            comm_name: string(&self.comm_name),
            collnet_enable: f.tail[0],
            cta_policy: f.tail[1],
            shrink_share: f.tail[2],
            nvls_ctas: f.tail[3],
            n_channels_per_net_peer: f.tail[4],
            nvlink_centric_sched: f.tail[5],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::CONFIG_UNDEF_INT;

    #[test]
    fn a_config_round_trips_and_says_whether_it_blocks() {
        let mut raw = RawConfig::undefined();
        let config = Config::new(&raw, None, Some(CString::from(c"tp"))).expect("valid");
        assert!(config.blocking(), "undefined blocks, as NCCL's default");
        let back = config.to_raw();
        assert_eq!(
            (back.size, back.magic, back.blocking, back.nvlink_centric_sched),
            (80, CONFIG_MAGIC, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT)
        );
        assert!(back.net_name.is_null() && !back.comm_name.is_null());
        raw.blocking = 0;
        assert!(!Config::new(&raw, None, None).expect("valid").blocking());
        raw.size = 16;
        assert!(Config::new(&raw, None, None).expect("valid").blocking(), "too short to hold `blocking`");
        raw.magic = 0;
        assert!(Config::new(&raw, None, None).is_err_and(|e| e.to_string().contains("NCCL_CONFIG_INITIALIZER")));
    }
}
