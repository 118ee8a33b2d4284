//! The unique id one rank makes and the caller hands to every other rank.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Where POSIX shared memory lives on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";
/// The kernel's random id of the current boot: equal on two processes means one host.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// First bytes of every serialized id.
const MAGIC: [u8; 4] = *b"GP2P";
/// Layout version of the serialized id; raised whenever [`UniqueId::to_bytes`] changes.
const VERSION: u8 = 1;
/// Bytes of the random token that names the communicator.
const TOKEN_BYTES: usize = 16;
/// Bytes of a boot id (a UUID).
const BOOT_ID_BYTES: usize = 16;
/// Prefix of every segment name.
pub(crate) const NAME_PREFIX: &str = "gp2p-";

/// A communicator's identity: made once by one rank with [`UniqueId::new`], then passed by the
/// caller to every other rank (through an environment variable, torch.distributed's store,
/// a file), as with `ncclGetUniqueId`.
///
/// It holds a random 128-bit token, which names the shared-memory segment, and what lets a
/// joining rank check that it sees the same shared memory as the rank that made it: the
/// device and inode of `/dev/shm` and the host's boot id. It crosses processes as bytes
/// ([`to_bytes`](Self::to_bytes) / [`from_bytes`](Self::from_bytes), [`UniqueId::BYTES`]
/// long, versioned) or as lowercase hex (`Display` / `FromStr`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UniqueId {
    token: [u8; TOKEN_BYTES],
    shm_dev: u64,
    shm_ino: u64,
    /// All zeros where the host does not publish a boot id: then it is not compared.
    boot_id: [u8; BOOT_ID_BYTES],
}

impl UniqueId {
    /// Length of [`to_bytes`](Self::to_bytes): magic, version, token, `/dev/shm` device and
    /// inode, boot id.
    pub const BYTES: usize = MAGIC.len() + 1 + TOKEN_BYTES + 8 + 8 + BOOT_ID_BYTES;

    /// A fresh id: a random token from the operating system, and this host's `/dev/shm` and
    /// boot id. Call it on one rank only.
    ///
    /// # Errors
    /// [`Error::NoSharedMemory`] where `/dev/shm` does not exist; [`Error::Os`] where the
    /// operating system gives no random bytes.
    pub fn new() -> Result<Self> {
        let mut token = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut token).map_err(|e| Error::Os {
            name: String::from("(none yet)"),
            call: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        let (shm_dev, shm_ino) = shm_identity()?;
        Ok(Self { token, shm_dev, shm_ino, boot_id: boot_id() })
    }

    /// The id as [`UniqueId::BYTES`] bytes, for passing to the other ranks.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        let parts: [&[u8]; 6] =
            [&MAGIC, &[VERSION], &self.token, &self.shm_dev.to_le_bytes(), &self.shm_ino.to_le_bytes(), &self.boot_id];
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        out
    }

    /// The id [`to_bytes`](Self::to_bytes) made.
    ///
    /// # Errors
    /// [`Error::MalformedId`] naming what is wrong: the length, the magic or the version.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: &[u8; Self::BYTES] = bytes
            .try_into()
            .map_err(|_| Error::MalformedId { problem: format!("{} bytes, expected {}", bytes.len(), Self::BYTES) })?;
        let (magic, rest) = bytes.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(Error::MalformedId {
                problem: format!("starts with {}, not the magic {} (\"GP2P\")", hex(magic), hex(&MAGIC)),
            });
        }
        let (version, rest) = rest.split_at(1);
        if version != [VERSION] {
            return Err(Error::MalformedId {
                problem: format!(
                    "layout version {}, this build reads version {VERSION}: every rank must run the same gp2p-comm",
                    version.first().copied().unwrap_or_default()
                ),
            });
        }
        let (token, rest) = rest.split_at(TOKEN_BYTES);
        let (dev, rest) = rest.split_at(8);
        let (ino, boot) = rest.split_at(8);
        // The lengths are fixed by the array type above, so these conversions cannot fail.
        let malformed = |_| Error::MalformedId { problem: String::from("internal length mismatch") };
        Ok(Self {
            token: token.try_into().map_err(malformed)?,
            shm_dev: u64::from_le_bytes(dev.try_into().map_err(malformed)?),
            shm_ino: u64::from_le_bytes(ino.try_into().map_err(malformed)?),
            boot_id: boot.try_into().map_err(malformed)?,
        })
    }

    /// The id of a communicator made from this one's ranks, named by `salt` (what makes it
    /// differ from the others made from it: its colour, how many were made before). Every
    /// rank derives the same id from the same salt, with no exchange; a different salt gives
    /// a different token (hence segment) with the odds of two random tokens meeting.
    pub fn derive(&self, salt: &[u8]) -> UniqueId {
        let mut token = [0u8; TOKEN_BYTES];
        for (half, out) in token.chunks_mut(8).enumerate() {
            // Two FNV-1a passes over token and salt, each finished by splitmix64's mixer,
            // seeded apart: enough to spread a salt over the token; nothing here is secret.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (half as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for &b in self.token.iter().chain(salt) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^= h >> 31;
            out.copy_from_slice(&h.to_le_bytes());
        }
        UniqueId { token, ..*self }
    }

    /// The name of the communicator's shared-memory segment: `/gp2p-<token in hex>`.
    pub fn segment_name(&self) -> String {
        format!("/{NAME_PREFIX}{}", hex(&self.token))
    }

    /// Whether this process sees the shared memory the id was made with.
    ///
    /// # Errors
    /// [`Error::OtherHost`] on another boot id, [`Error::OtherSharedMemory`] on another
    /// `/dev/shm`, [`Error::NoSharedMemory`] where there is none.
    pub(crate) fn check_same_shm(&self) -> Result<()> {
        let here_boot = boot_id();
        let unknown = [0u8; BOOT_ID_BYTES];
        if here_boot != unknown && self.boot_id != unknown && here_boot != self.boot_id {
            return Err(Error::OtherHost { here: uuid(&here_boot), id: uuid(&self.boot_id) });
        }
        let (here_dev, here_ino) = shm_identity()?;
        if (here_dev, here_ino) != (self.shm_dev, self.shm_ino) {
            return Err(Error::OtherSharedMemory { here_dev, here_ino, id_dev: self.shm_dev, id_ino: self.shm_ino });
        }
        Ok(())
    }
}

impl fmt::Display for UniqueId {
    /// Lowercase hex of [`UniqueId::to_bytes`], `2 * UniqueId::BYTES` characters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.to_bytes()))
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// The id `Display` wrote (hex, either case; surrounding whitespace ignored).
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != 2 * Self::BYTES {
            return Err(Error::MalformedId {
                problem: format!("{} characters, expected {} hex digits", s.len(), 2 * Self::BYTES),
            });
        }
        let mut bytes = [0u8; Self::BYTES];
        let mut digits = s.char_indices();
        for byte in &mut bytes {
            let mut value = 0u8;
            for _ in 0..2 {
                let Some((at, c)) = digits.next() else {
                    return Err(Error::MalformedId { problem: String::from("ends early") });
                };
                let Some(d) = c.to_digit(16) else {
                    return Err(Error::MalformedId {
                        problem: format!("character {c:?} at position {at} is not a hex digit"),
                    });
                };
                // A hex digit is below 16, so it fits in a nibble.
                value = (value << 4) | u8::try_from(d).unwrap_or_default();
            }
            *byte = value;
        }
        Self::from_bytes(&bytes)
    }
}

/// Device and inode of `/dev/shm`: equal on two processes means one shared-memory filesystem.
fn shm_identity() -> Result<(u64, u64)> {
    let meta = std::fs::metadata(SHM_DIR).map_err(|source| Error::NoSharedMemory { path: SHM_DIR, source })?;
    if !meta.is_dir() {
        return Err(Error::NoSharedMemory {
            path: SHM_DIR,
            source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    Ok((meta.dev(), meta.ino()))
}

/// This host's boot id, or zeros where the kernel does not publish one (it is then not checked).
fn boot_id() -> [u8; BOOT_ID_BYTES] {
    let mut out = [0u8; BOOT_ID_BYTES];
    let Ok(text) = std::fs::read_to_string(BOOT_ID_PATH) else { return out };
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    if digits.len() != 2 * BOOT_ID_BYTES {
        return out;
    }
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).unwrap_or("00");
        *byte = u8::from_str_radix(pair, 16).unwrap_or_default();
    }
    out
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        // Writing into a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A boot id in its usual UUID spelling.
fn uuid(b: &[u8; BOOT_ID_BYTES]) -> String {
    let h = hex(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> UniqueId {
        UniqueId { token: [0xab; TOKEN_BYTES], shm_dev: 0x1234, shm_ino: 7, boot_id: [0x5c; BOOT_ID_BYTES] }
    }

    #[test]
    fn derived_ids_agree_for_one_salt_and_differ_across_salts() {
        let id = sample();
        let a = id.derive(b"split 1 colour 0");
        assert_eq!(a, id.derive(b"split 1 colour 0"));
        let others = [id.derive(b"split 1 colour 1"), id.derive(b"split 2 colour 0"), sample().derive(b""), id];
        for other in others {
            assert_ne!(a.segment_name(), other.segment_name());
        }
        // Everything but the token is the parent's: the same host and /dev/shm.
        assert_eq!((a.shm_dev, a.shm_ino, a.boot_id), (id.shm_dev, id.shm_ino, id.boot_id));
    }

    #[test]
    fn bytes_round_trip() {
        let id = sample();
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    }

    #[test]
    fn hex_round_trip_in_either_case() {
        let id = sample();
        let s = id.to_string();
        assert_eq!(s.len(), 2 * UniqueId::BYTES);
        assert_eq!(s.parse::<UniqueId>().unwrap(), id);
        assert_eq!(format!(" {}\n", s.to_uppercase()).parse::<UniqueId>().unwrap(), id);
    }

    #[test]
    fn new_ids_differ_and_round_trip() {
        if std::fs::metadata(SHM_DIR).is_err() {
            eprintln!("not run: {SHM_DIR} does not exist on this machine");
            return;
        }
        let a = UniqueId::new().unwrap();
        let b = UniqueId::new().unwrap();
        assert_ne!(a.segment_name(), b.segment_name());
        assert_eq!(a.to_string().parse::<UniqueId>().unwrap(), a);
        a.check_same_shm().unwrap();
    }

    fn problem(r: Result<UniqueId>) -> String {
        match r {
            Err(Error::MalformedId { problem }) => problem,
            other => panic!("expected MalformedId, got {other:?}"),
        }
    }

    #[test]
    fn malformed_ids_say_what_is_wrong() {
        let good = sample().to_bytes();
        assert!(problem(UniqueId::from_bytes(&good[1..])).contains("52 bytes, expected 53"));
        let mut bad = good;
        bad[0] = b'X';
        assert!(problem(UniqueId::from_bytes(&bad)).contains("magic"));
        let mut bad = good;
        bad[4] = 9;
        assert!(problem(UniqueId::from_bytes(&bad)).contains("layout version 9"));
        let s = sample().to_string();
        assert!(problem(s[..10].parse()).contains("10 characters, expected 106"));
        let bad = format!("{}z{}", &s[..7], &s[8..]);
        assert!(problem(bad.parse()).contains("'z' at position 7"));
    }

    #[test]
    fn other_shared_memory_is_named() {
        if std::fs::metadata(SHM_DIR).is_err() {
            eprintln!("not run: {SHM_DIR} does not exist on this machine");
            return;
        }
        let mut id = UniqueId::new().unwrap();
        id.shm_ino ^= 1;
        let e = id.check_same_shm().unwrap_err();
        assert!(matches!(e, Error::OtherSharedMemory { .. }), "{e}");
        let mut id = UniqueId::new().unwrap();
        if id.boot_id != [0; BOOT_ID_BYTES] {
            id.boot_id[0] ^= 1;
            let e = id.check_same_shm().unwrap_err();
            assert!(matches!(e, Error::OtherHost { .. }), "{e}");
        }
    }
}
