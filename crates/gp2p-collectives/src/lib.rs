//! Ring collectives over pinned host memory, for GPUs that cannot reach each other.
//!
//! This crate starts with the part that needs no GPU: [`schedule`], ring reduce-scatter,
//! all-gather, all-reduce and broadcast as plain data, proven on host buffers. The GPU
//! executor (all_reduce with the Scratch and ZeroCopy transports) builds on these schedules
//! and on `gp2p-transport`'s staging rings.
//!
//! ```
//! use gp2p_collectives::schedule::Schedule;
//!
//! // Three ranks sum their buffers; every rank ends with the total.
//! let schedule = Schedule::all_reduce(3, 10, 4);
//! let mut buffers = vec![vec![1u64; 10], vec![2; 10], vec![4; 10]];
//! schedule.run_on_host(&mut buffers, |d, s, _last| d + s);
//! assert!(buffers.iter().all(|b| b.iter().all(|&v| v == 7)));
//! ```

pub mod schedule;
