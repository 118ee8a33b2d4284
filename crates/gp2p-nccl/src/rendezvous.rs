//! The rendezvous a door id names: a TCP listener in the process that made the id (as NCCL's
//! bootstrap root is), which takes every rank's facts, decides the communicator once
//! ([`crate::decision::decide`]) and sends every rank the same answer. A peer must open with
//! the id's secret: any other connection is closed unread, so what the listener holds is of no
//! use to another user of the host (or network). It serves one communicator and stops once
//! every rank has its answer, or at its deadline.
//!
//! Messages: the client sends the secret, then a length (u32, big-endian) and its
//! [`RankFacts`] as JSON; the server answers with a length and an [`Answer`] as JSON.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, RankFacts, decide};
use crate::error::{Error, Result};
use crate::id::SECRET_BYTES;

/// The largest message either side takes: facts and answers are a few hundred bytes a rank.
const MAX_MESSAGE: u32 = 1 << 20;
/// How long the listener waits for a connection's secret and facts before dropping it, so a
/// stranger that connects and says nothing cannot hold the ranks up.
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between polls of the non-blocking listener while ranks arrive; it doubles while none
/// does, up to [`IDLE_POLL`].
const ACCEPT_POLL: Duration = Duration::from_millis(1);
/// The longest pause between polls.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long the listener waits for the first rank (NCCL's root waits for ever; a listener
/// nobody joins goes away after this).
const FIRST_ARRIVAL: Duration = Duration::from_secs(24 * 60 * 60);
/// Pause between connection attempts of a rank.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// What every rank of a communicator gets back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Served or handed over, and why.
    pub decision: Decision,
    /// For a served communicator, the gp2p-comm unique id (hex) its ranks join.
    pub comm_id: Option<String>,
    /// For one handed over, the real NCCL's unique id (its 128 bytes), made by the process
    /// that made the door id once the verdict was known.
    pub real_id: Option<Vec<u8>>,
    /// Every rank's facts, in rank order.
    pub facts: Vec<RankFacts>,
}

/// The answer on the wire: the verdict, or why there is none (the same for every rank).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The verdict or the failure.
    pub result: std::result::Result<Verdict, String>,
}

/// What the listener needs to decide besides the ranks' facts.
pub struct Maker {
    /// The secret every peer must open with.
    pub secret: [u8; SECRET_BYTES],
    /// Makes the real NCCL's id of a communicator handed over, where this process loads the
    /// real NCCL (`None`: it does not, and a hand-over is refused saying so).
    pub real_id: Option<RealIdMaker>,
    /// This process's host (`gp2p_comm::host_id`): a served communicator's shared memory is
    /// made here, so its ranks must run here.
    pub host: String,
    /// How long to wait for every rank.
    pub timeout: Duration,
    /// Makes the gp2p-comm id of a served communicator.
    pub comm_id: CommIdMaker,
}

/// Makes the gp2p-comm id (hex) of a served communicator, or says why it cannot.
pub type CommIdMaker = Box<dyn FnOnce() -> std::result::Result<String, String> + Send>;

/// Makes the real NCCL's unique id (its bytes) of a communicator handed over, or says why it
/// cannot.
pub type RealIdMaker = Box<dyn FnOnce() -> std::result::Result<Vec<u8>, String> + Send>;

/// Listen on `ip` (port chosen by the system) and serve one communicator's rendezvous on a
/// thread of its own. Returns the address to put in the id.
///
/// # Errors
/// [`Error::Rendezvous`] where no socket can be bound or the thread not started.
pub fn listen(ip: IpAddr, maker: Maker) -> Result<SocketAddr> {
    let fail = |what: &str, e: std::io::Error| Error::Rendezvous { problem: format!("{what} on {ip}: {e}") };
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| fail("cannot listen", e))?;
    listener.set_nonblocking(true).map_err(|e| fail("cannot poll the listener", e))?;
    let addr = listener.local_addr().map_err(|e| fail("no local address", e))?;
    let (key, stop) = ((addr, maker.secret), Arc::new(AtomicBool::new(false)));
    listening().insert(key, Arc::clone(&stop));
    let spawned = std::thread::Builder::new().name("gp2p-nccl-rendezvous".into()).spawn(move || {
        serve(&listener, maker, &stop);
        listening().remove(&key);
    });
    if let Err(e) = spawned {
        listening().remove(&key);
        return Err(fail("cannot start the rendezvous thread", e));
    }
    Ok(addr)
}

/// The rendezvous this process listens for, by address and secret, each with the flag that
/// stops it.
type Listening = HashMap<(SocketAddr, [u8; SECRET_BYTES]), Arc<AtomicBool>>;

fn listening() -> std::sync::MutexGuard<'static, Listening> {
    static LISTENING: LazyLock<Mutex<Listening>> = LazyLock::new(Mutex::default);
    LISTENING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Stop the rendezvous at `addr` with `secret` where this process listens for it and no rank
/// will come: the ids of `ncclCommInitRankScalable` past the first, which the door does not
/// use (each would otherwise hold a thread and a port until its deadline). Elsewhere, nothing.
pub fn stop_unused(addr: SocketAddr, secret: &[u8; SECRET_BYTES]) {
    if let Some(stop) = listening().remove(&(addr, *secret)) {
        stop.store(true, Ordering::Release);
    }
}

/// The listener's loop: gather facts until as many ranks are in as the largest world size any
/// of them gave (or the deadline, counted from the first arrival), answer all the same, then
/// keep answering latecomers until the deadline: with the refusal where there was one, else
/// with one saying the communicator was made without them. Polls fast while ranks arrive and
/// slowly while none does.
fn serve(listener: &TcpListener, maker: Maker, stop: &AtomicBool) {
    let started = Instant::now();
    let mut deadline = started + FIRST_ARRIVAL;
    let mut pause = ACCEPT_POLL;
    let mut peers: Vec<(TcpStream, RankFacts)> = Vec::new();
    let mut accept = |peers: &mut Vec<(TcpStream, RankFacts)>| match listener.accept() {
        Ok((stream, _)) => {
            if let Some(facts) = greet(stream, &maker.secret) {
                peers.push(facts);
            }
            pause = ACCEPT_POLL;
        }
        Err(_) => {
            std::thread::sleep(pause);
            pause = (pause * 2).min(IDLE_POLL);
        }
    };
    loop {
        if peers.is_empty() && stop.load(Ordering::Acquire) {
            return;
        }
        let expected = peers.iter().map(|(_, f)| f.nranks).max();
        if expected.is_some_and(|n| peers.len() >= n) || Instant::now() >= deadline {
            break;
        }
        let before = peers.len();
        accept(&mut peers);
        if before == 0 && !peers.is_empty() {
            deadline = Instant::now() + maker.timeout;
        }
    }
    if peers.is_empty() {
        return;
    }
    let mut facts: Vec<RankFacts> = peers.iter().map(|(_, f)| f.clone()).collect();
    facts.sort_by_key(|f| f.rank);
    let world = facts.iter().map(|f| f.nranks).max().unwrap_or(0);
    let agree = facts.iter().all(|f| f.nranks == world);
    let result = if agree && facts.len() < world {
        Err(format!(
            "{} of {world} ranks did not arrive within {:?} of the first (set GP2P_NCCL_TIMEOUT to wait longer)",
            world - facts.len(),
            maker.timeout
        ))
    } else {
        verdict(facts, &maker.host, maker.comm_id, maker.real_id)
    };
    let answer = Answer { result };
    for (stream, _) in &mut peers {
        // A rank that went away meanwhile learns nothing; the others still get their answer.
        let _ = send(stream, &answer);
    }
    let late = Answer {
        result: match &answer.result {
            Err(refusal) => Err(refusal.clone()),
            Ok(_) => Err(format!(
                "the communicator of this id was made with {} rank(s) before this one arrived: every rank must pass the same nranks, and each id serves one communicator",
                peers.len()
            )),
        },
    };
    while Instant::now() < deadline {
        let before = peers.len();
        accept(&mut peers);
        for (stream, _) in &mut peers[before..] {
            let _ = send(stream, &late);
        }
    }
}

/// The verdict for a whole set of facts: the decision, and the id its ranks make their
/// communicator with: a served one's (`comm_id`), or the real NCCL's (`real_id`, made only for
/// a hand-over).
fn verdict(
    facts: Vec<RankFacts>,
    host: &str,
    comm_id: CommIdMaker,
    real_id: Option<RealIdMaker>,
) -> std::result::Result<Verdict, String> {
    // Inconsistent facts (world sizes, ranks, versions) are refused here, the same for all.
    let decision = decide(&facts, real_id.is_some(), Some(host))?;
    let (comm_id, real_id) = match &decision {
        Decision::Serve { .. } => (Some(comm_id()?), None),
        Decision::HandOver { .. } => {
            let make = real_id.ok_or("no real NCCL in the process that made the unique id")?;
            let id = make().map_err(|e| format!("the real NCCL made no unique id for the hand-over: {e}"))?;
            (None, Some(id))
        }
    };
    Ok(Verdict { decision, comm_id, real_id, facts })
}

/// Read a new connection's secret and facts; `None` (and the connection closed) for anything
/// else.
fn greet(mut stream: TcpStream, secret: &[u8; SECRET_BYTES]) -> Option<(TcpStream, RankFacts)> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(GREETING_TIMEOUT)).ok()?;
    let mut presented = [0u8; SECRET_BYTES];
    stream.read_exact(&mut presented).ok()?;
    if !same_secret(&presented, secret) {
        return None;
    }
    let facts: RankFacts = receive(&mut stream).ok()?;
    stream.set_read_timeout(None).ok()?;
    Some((stream, facts))
}

/// Compare secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8; SECRET_BYTES], b: &[u8; SECRET_BYTES]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Join the rendezvous at `addr` as the rank `facts` describes, and wait (at most `timeout`)
/// for the answer every rank gets.
///
/// # Errors
/// [`Error::Rendezvous`] where the listener cannot be reached, goes away, or answers with a
/// failure (the same for every rank).
pub fn join(addr: SocketAddr, secret: &[u8; SECRET_BYTES], facts: &RankFacts, timeout: Duration) -> Result<Verdict> {
    let deadline = Instant::now() + timeout;
    let fail = |problem: String| Error::Rendezvous { problem };
    let mut stream = connect(addr, deadline).map_err(|e| {
        fail(format!(
            "cannot reach the rendezvous at {addr} ({e}): is the process that called ncclGetUniqueId still running, and reachable from this host?"
        ))
    })?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left)).map_err(|e| fail(format!("socket: {e}")))?;
    stream.write_all(secret).map_err(|e| fail(format!("sending to {addr}: {e}")))?;
    send(&mut stream, facts).map_err(|e| fail(format!("sending to {addr}: {e}")))?;
    let answer: Answer = receive(&mut stream).map_err(|e| {
        fail(format!(
            "no answer from {addr} within {timeout:?} ({e}): did every rank call ncclCommInitRank with this id?"
        ))
    })?;
    answer.result.map_err(fail)
}

fn connect(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() + CONNECT_RETRY >= deadline => return Err(e),
            Err(_) => std::thread::sleep(CONNECT_RETRY),
        }
    }
}

fn send<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_MESSAGE)
        .ok_or_else(|| std::io::Error::other("message too long"))?;
    stream.write_all(&len.to_be_bytes())?;
    stream.write_all(&body)?;
    stream.flush()
}

fn receive<T: for<'de> Deserialize<'de>>(stream: &mut TcpStream) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!("a message of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests;
