//! The 128 bytes `ncclGetUniqueId` hands out while the door is on: where the door's
//! rendezvous listens (address and port) and a random secret every rank must present there.
//! A communicator handed over gets the
//! real NCCL's own id from that process with the rendezvous's verdict, made only then: every
//! real id starts a bootstrap thread in the process that makes it, which waits for its ranks
//! for ever, so an id made for every door id (most of which serve) would leave one such thread
//! a communicator.
//!
//! An id without the door's magic is the real NCCL's (made with the door off): a
//! communicator made with it is handed over whole.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::abi::{RawUniqueId, UNIQUE_ID_BYTES};
use crate::error::{Error, Result};

/// The first bytes of every door id.
const MAGIC: [u8; 8] = *b"gp2pDOOR";
/// The layout below; raised whenever it changes, so ranks of different door versions refuse
/// each other's ids by name instead of misreading them (version 1 carried the real id).
const VERSION: u8 = 2;
/// Bytes of the rendezvous secret.
pub const SECRET_BYTES: usize = 16;

/// A unique id made by the door.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DoorId {
    /// Where the rendezvous listens.
    pub rendezvous: SocketAddr,
    /// What every rank presents to it.
    pub secret: [u8; SECRET_BYTES],
}

impl std::fmt::Debug for RawUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.internal.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "RawUniqueId({} bytes used)", used)
    }
}

impl PartialEq for RawUniqueId {
    fn eq(&self, other: &Self) -> bool {
        self.internal == other.internal
    }
}

impl Eq for RawUniqueId {}

impl DoorId {
    /// The id as NCCL's 128 bytes.
    pub fn to_raw(&self) -> RawUniqueId {
        let mut out = [0u8; UNIQUE_ID_BYTES];
        out[..8].copy_from_slice(&MAGIC);
        out[8] = VERSION;
        out[10..12].copy_from_slice(&self.rendezvous.port().to_be_bytes());
        let ip = match self.rendezvous.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out[12..28].copy_from_slice(&ip.octets());
        out[28..28 + SECRET_BYTES].copy_from_slice(&self.secret);
        RawUniqueId { internal: out }
    }

    /// The door id in `raw`, or `None` where `raw` is not one (a real NCCL id).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id of the door's magic but another layout version
    /// (ranks running different versions of the door).
    pub fn from_raw(raw: &RawUniqueId) -> Result<Option<DoorId>> {
        let b = &raw.internal;
        if b[..8] != MAGIC {
            return Ok(None);
        }
        if b[8] != VERSION {
            return Err(Error::argument(
                "commId",
                format!(
                    "made by the NCCL door's id version {}, this one reads version {VERSION}: every rank must load the same geforce-p2p",
                    b[8]
                ),
            ));
        }
        let port = u16::from_be_bytes([b[10], b[11]]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[12..28]);
        let ip = Ipv6Addr::from(ip);
        let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&b[28..28 + SECRET_BYTES]);
        Ok(Some(DoorId { rendezvous: SocketAddr::new(ip, port), secret }))
    }
}

/// A fresh secret from the operating system.
///
/// # Errors
/// [`Error::Rendezvous`] where the operating system gives no random bytes.
pub fn fresh_secret() -> Result<[u8; SECRET_BYTES]> {
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret)
        .map_err(|e| Error::Rendezvous { problem: format!("no random bytes for the secret: {e}") })?;
    Ok(secret)
}

/// The address the real NCCL's id names for its bootstrap root (NCCL's handle: an 8-byte
/// magic, then a `sockaddr_in` or `sockaddr_in6`), where it is one: the interface NCCL chose
/// for reaching the other ranks, which the door's rendezvous then listens on too.
pub fn real_root_address(real: &RawUniqueId) -> Option<IpAddr> {
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;
    let b = &real.internal;
    let family = u16::from_ne_bytes([b[8], b[9]]);
    match family {
        AF_INET => Some(IpAddr::from([b[12], b[13], b[14], b[15]])),
        AF_INET6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[16..32]);
            Some(IpAddr::from(ip))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL 2.28.9's id as `ncclGetUniqueId` made it on a machine without a GPU: magic,
    /// `AF_INET`, port 58887, 192.0.2.2, zeros.
    fn real_id() -> RawUniqueId {
        let mut internal = [0u8; UNIQUE_ID_BYTES];
        let head = [0x50, 0xe0, 0x4d, 0xa8, 0x58, 0xf6, 0xb3, 0x27, 0x02, 0x00, 0xe6, 0x07, 0xc0, 0x00, 0x02, 0x02];
        internal[..head.len()].copy_from_slice(&head);
        RawUniqueId { internal }
    }

    #[test]
    fn an_id_round_trips_and_carries_no_real_id() {
        for addr in ["127.0.0.1:4000", "[fe80::1]:65535", "192.0.2.2:1"] {
            let addr: SocketAddr = addr.parse().expect("address");
            let id = DoorId { rendezvous: addr, secret: [7; SECRET_BYTES] };
            let raw = id.to_raw();
            assert!(raw.internal[28 + SECRET_BYTES..].iter().all(|&b| b == 0), "no real id inside");
            assert_eq!(DoorId::from_raw(&raw).expect("reads"), Some(id));
        }
    }

    #[test]
    fn a_real_id_is_not_a_door_id_and_names_its_root() {
        assert_eq!(DoorId::from_raw(&real_id()).expect("reads"), None);
        assert_eq!(real_root_address(&real_id()), Some(IpAddr::from([192, 0, 2, 2])));
    }

    #[test]
    fn another_version_of_the_door_is_named() {
        let id = DoorId { rendezvous: "127.0.0.1:1".parse().expect("address"), secret: [0; SECRET_BYTES] };
        let mut raw = id.to_raw();
        raw.internal[8] = VERSION - 1;
        let e = DoorId::from_raw(&raw).expect_err("refused").to_string();
        assert!(e.contains("same geforce-p2p"), "{e}");
    }
}
