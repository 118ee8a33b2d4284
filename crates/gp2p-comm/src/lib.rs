//! The foundation of a communicator for one process per GPU on one host (torchrun, vLLM and
//! sglang tensor parallelism) on cards without P2P: how the ranks find each other and the
//! staging memory they share.
//!
//! - [`UniqueId`]: made by one rank ([`UniqueId::new`]) and handed by the caller to every
//!   other rank, as bytes or hex (an environment variable, torch.distributed's store), as
//!   with `ncclGetUniqueId`. It names the communicator and lets a joining rank check that it
//!   sees the same `/dev/shm` on the same host.
//! - [`Segment`]: the communicator's one POSIX shared-memory segment, mode 0600, mapped by
//!   every rank. [`Segment::join`] takes the id, this process's rank and the world size,
//!   refuses mismatched sizes and ranks, and returns once every rank has mapped the segment;
//!   the name is then unlinked, so nothing is left in `/dev/shm`. Segments left by crashed
//!   runs are removed at the next creation. Only names and offsets cross processes.
//!
//! - [`Communicator`]: one rank on one GPU. It joins the segment, registers it with the
//!   driver (portable, device-mapped; ranks in turn), and runs the collectives of 1 to
//!   [`MAX_RANKS`] (8) ranks on the caller's stream (more are refused at creation). Between
//!   two ranks: all_reduce (every op and dtype; out of place too, `all_reduce_into`, which
//!   one kernel runs as cheaply as in place), all_gather, reduce_scatter,
//!   broadcast, send and recv. An all-reduce of at most [`CommOptions::small_max_bytes`] (possibly
//!   less between two ranks on one GPU, for a room over 4 MiB: `Communicator::small_max_bytes`) is one kernel per rank through mapped host memory: up to
//!   [`CommOptions::lines_max_bytes`] (2 KiB by default) its 8-byte lines carry data and the
//!   call's sequence number (NCCL's LL idea); above, it stores the buffer in 4 KiB chunks and
//!   flags each with the number (one fence and one flag per chunk, so many blocks read at once);
//!   an all-gather or broadcast of at most 256 KiB is that kernel too, summing bytes each rank
//!   zeroed but for its own contribution, and a reduce-scatter the all-reduce of its whole
//!   buffer and a copy (the `by_sum` module); everything else goes through
//!   a pipeline of DMA copies via slots of the segment
//!   ([`CommOptions::slot_bytes`], [`CommOptions::slots`]), handed over by handshake flags
//!   that stream memory operations set and a one-thread kernel awaits. Every wait for the
//!   peer runs on the GPU and is bounded by [`CommOptions::peer_timeout`]: the wait kernel's
//!   own clock, or, for the pipeline's waits as stream memory operations
//!   ([`FlagWaits::Watched`]), the communicator's watchdog ([`FlagWaits::Unbounded`], for
//!   measuring, is bounded by nothing). No call keeps a
//!   count on the host (the one-kernel path numbers its calls in device memory), so calls
//!   can be captured into CUDA graphs and replayed, once the caller has promised what
//!   [`Communicator::allow_graph_capture`] asks.
//!
//! Among more than two ranks (the `rounds` module's table): an all-reduce of at most
//! [`CommOptions::lines_max_bytes`] (64 KiB by default there, [`CommOptions::for_world`]) is one
//! kernel per rank that writes its lines and reads every other rank's, folding all N in rank
//! order (one-shot, every rank the same bits); above, the two-shot rounds: each rank hands
//! every other its share through its slots and folds the shares it gets, then hands its
//! folded share to everyone, so each link carries 2(N−1)/N of the buffer each way.
//! all_gather, reduce_scatter, broadcast and send/recv are rounds of the same kind (all_gather
//! and broadcast, where the whole buffer's all-reduce would take the line kernel, that kernel
//! over bytes each rank zeroed but for its contribution; reduce_scatter there, that kernel's
//! all-reduce and a copy). The slots'
//! flags have one word per reader, so a slot read by any rank, in any call, is free for its
//! writer once that reader is done.
//!
//! Measured on one H200 with N processes sharing it under an MPS daemon (so only a check
//! for regressions: every byte crosses the one card's link N times), int32 sum, medians
//! (`benches/results/h200/many-latency-*.txt`): replayed from a CUDA graph, up to 2 KiB 5.3-5.9
//! us a call for 2 ranks, 12.8-15.6 for 4, 40-44 for 8; 128 KiB on the rounds 333 us for 4
//! and 1.36 ms for 8. Eager calls of the rounds took 5-16 times their replays (1.9-5.8 ms for
//! 4 ranks at 128 KiB-2 MiB with 150 us of host time a call). That follows the hardware
//! queues: with `CUDA_DEVICE_MAX_CONNECTIONS=1` (a process's streams in one queue, run in the
//! order enqueued) eager calls match their replays (4 ranks, 128 KiB: 336 against 326 us;
//! `many-connections.txt`); why several queues cost that much among MPS clients is not
//! known, nor whether it happens with a GPU per process.
//!
//! Joining waits on the host, polling, bounded by a timeout.
//!
//! Measured on two H200s, one process each (`benches/python/mp_allreduce.py`, f32 sum, CUDA
//! events around back-to-back calls, medians), against NCCL's shared-memory path
//! (NCCL_P2P_DISABLE=1) in the same processes, which took 23-26 us up to 32 KiB in that run
//! (41-45 us in earlier ones): with the one-kernel path's earlier 8-byte lines, 8.0-8.4 us
//! per call up to 2 KiB, 15 us at 8 KiB, 26 us at 16-32 KiB; the pipeline 27 us at 64 KiB,
//! 34 us at 256 KiB, 66 and 188 us at 1 and 4 MiB (NCCL 64 and 174) and, from 64 MiB to
//! 1 GiB, 0.88-0.92 of the duplex ceiling (0.79-0.83 of NCCL's time). With lines up to 2 KiB
//! and 4 KiB chunks up to 256 KiB (seventh session, NCCL 24.7-35.4 us up to 256 KiB in that
//! run): 8.5-12.4 us a call up to 64 KiB (the host's enqueue, 8-11 us, bounds it), 15.1 at
//! 128 KiB, 19.7 at 256 KiB; replayed from a CUDA graph, 4.6-5.6 us up to 2 KiB and 7.7-17.9
//! from 8 to 256 KiB, against NCCL's 15.0-39.9. Eighth session (four runs, the chunk kernel
//! with two teams per block): 7.6-14.8 us a call up to 64 KiB and 15.2-17.8 at 128 KiB (NCCL
//! 22.8-45.9); above 128 KiB the kernel ran in two modes between processes (1 MiB 49.6 or
//! 240-318 us). Tenth session: those modes follow the kernel's grid, and with the grids that
//! ran steadily (see [`CommOptions::chunk_blocks`]) one kernel takes everything up to 4 MiB
//! by default: two process pairs, NCCL in the same processes, 6.7-11.4 us up to 2 KiB
//! (0.31-0.34 of NCCL's time), 11.6-13.2 us from 8 to 64 KiB, 15.8-16.1 at 128 KiB (0.68-0.71),
//! 1 MiB 48.3-49.3 (0.76-0.78), 4 MiB 148.3-148.4 (0.86-0.87); 256 KiB took 20 us in one pair
//! and 55 in four of seven loops of the other with 64 blocks of one chunk, which are no longer
//! made (32 blocks of two: 22.3-23.5 us in 18 of 18 loops against NCCL, 0.64); 1 MiB's 64
//! blocks of four still took 87 us instead of 49 in five of nine loops of one later process
//! pair (a milder third mode: the cause is not known); the pipeline 0.95-0.96 of NCCL's time
//! at 16 MiB and 0.84-0.91 of the duplex ceiling from 64 MiB. The two-process GPU tests are
//! `tests/tests/gpu_comm.rs` (also run under compute-sanitizer memcheck and racecheck).
//!
//! The segment in /dev/shm takes about 65 MiB with the default options (the one-kernel
//! areas for 4 MiB, two halves per rank, and 3 pipeline slots of 8 MiB per rank): a
//! container with Docker's default 64 MiB /dev/shm needs `--shm-size`, or smaller options
//! (`small_max_bytes` of 1 MiB: about 53 MiB). Creation reserves the whole segment first,
//! so too little space is an error that names /dev/shm, never a crash later.
//!
//! Two ranks, here two threads of one process (in real use, two processes):
//! ```
//! use std::time::Duration;
//! use gp2p_comm::{Error, Segment, UniqueId};
//!
//! let id = match UniqueId::new() {
//!     Ok(id) => id,
//!     Err(Error::NoSharedMemory { .. }) => return Ok(()), // no /dev/shm on this machine
//!     Err(e) => return Err(e),
//! };
//! // Rank 0 passes `text` to the other ranks, e.g. in an environment variable.
//! let text = id.to_string();
//! let staging_bytes = 1 << 20;
//! let timeout = Duration::from_secs(10);
//! let (a, b) = std::thread::scope(|s| {
//!     let rank1 = s.spawn(|| {
//!         let id: UniqueId = text.parse()?;
//!         Segment::join(&id, 1, 2, staging_bytes, timeout)
//!     });
//!     let a = Segment::join(&id, 0, 2, staging_bytes, timeout);
//!     (a, rank1.join().expect("rank 1 panicked"))
//! });
//! let (a, b) = (a?, b?);
//! assert_eq!((a.rank(), b.rank(), a.world()), (0, 1, 2));
//! // Both map the same memory, at different addresses: exchange offsets, not pointers.
//! a.staging()[7].store(42, std::sync::atomic::Ordering::Release);
//! assert_eq!(b.staging()[7].load(std::sync::atomic::Ordering::Acquire), 42);
//! // Every rank has mapped it, so the name is gone from /dev/shm.
//! assert!(!std::path::Path::new(&format!("/dev/shm{}", a.name())).exists());
//! # Ok::<(), Error>(())
//! ```

#![deny(unsafe_code)]

pub mod choice;
mod chunking;
mod communicator;
pub mod compression;
mod error;
mod handshake;
mod host;
mod id;
mod layout;
mod pipeline;
mod receive;
mod registration;
mod replay;
mod rounds;
mod segment;
mod size;
mod slots;

pub use chunking::{MIN_PIPELINE_CHUNK, PIPELINE_CHUNKS, pipeline_chunk};
pub use communicator::{Communicator, Control};
pub use compression::{COMPRESS_VAR, Compression, compression_from};
pub use error::{Error, Result};
pub use gp2p_collectives::Receive;
pub use gp2p_collectives::cost::{ALGORITHM_VAR, Algorithm};
pub use gp2p_cuda::codec::WireFormat;
pub use host::{HOST_ID_VAR, MPS_PIPE_VAR, host_id, host_id_from, mps_control_pipe, mps_serves, process_id};
pub use id::UniqueId;
pub use layout::{CommOptions, FlagWaits, MANY_CHUNKS_MAX_BYTES, MANY_CHUNKS_VAR, MAX_RANKS};
pub use pipeline::{SLOT_WAITS_VAR, STREAMS_PER_RANK};
pub use receive::{RECEIVE_VAR, ZERO_COPY_MAX_LANDING, describe as describe_receive};
pub use replay::{REPLAY_VAR, ReplayCounts};
pub use segment::{DEFAULT_JOIN_TIMEOUT, HOST_WORDS, MAX_WORLD, STAGING_ALIGN, Segment, staging_offset};
pub use size::parse_size;
pub use slots::{SLOT_SPAN_BYTES, fit_slot_to_shm};
