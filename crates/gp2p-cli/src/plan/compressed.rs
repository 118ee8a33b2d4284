//! `gp2p plan`'s lines on the compressed all-reduce: the communicator's exact all-reduce and
//! its compressed one (int8, 64 values a block) as the model prices them from bf16 at each
//! size, and the size from which `GP2P_COMPRESS` switches it on (`gp2p_comm::compression`).

use geforce_p2p::collectives::cost::Machine;
use geforce_p2p::comm::choice::AllReducePaths;
use geforce_p2p::comm::compression::{
    COMPRESSED_STEP_OPS, DEFAULT_BLOCK, ONE_SHOT_MAX_VALUES, compressed_prediction, compressed_shots,
    compressing_slot_bytes, exact_prediction, min_bytes,
};
use geforce_p2p::comm::{COMPRESS_VAR, CommOptions, MAX_RANKS, WireFormat};
use geforce_p2p::kernels::compress::{BlockSize, Format, Shots};

use crate::sizes::format_size;
use crate::table::{num, table};

/// The table, for `sizes`; empty where the communicator does not take the machine's ranks.
pub(super) fn compressed_table(m: &Machine, sizes: &[usize]) -> String {
    if m.ranks < 2 || m.ranks > MAX_RANKS {
        return String::new();
    }
    let Ok(block) = BlockSize::new(DEFAULT_BLOCK) else { return String::new() };
    let format = WireFormat { format: Format::Int8, block };
    // The exact calls too run on the compressing communicator's slots.
    let options = CommOptions::for_world(m.ranks);
    let slot_bytes = compressing_slot_bytes(&options, m.ranks);
    let Ok(paths) = AllReducePaths::of(m.ranks, &CommOptions { slot_bytes, ..options }, None) else {
        return String::new();
    };
    let min = min_bytes(m, &paths, slot_bytes, format);
    let how = match compressed_shots(m.ranks, paths.many.forced, 0) {
        Shots::One => format!(
            "one-shot up to {} Mi values (each rank's wire up once and the other's down, one handoff), above that \
             two-shot (one more handoff than the exact rounds)",
            ONE_SHOT_MAX_VALUES >> 20
        ),
        Shots::Two => "two-shot: one more handoff than the exact rounds".to_string(),
    };
    let mut out = format!(
        "Compressed all-reduce (opt-in: {COMPRESS_VAR}=int8|fp8[:BLOCK][@MIN]; bf16 as int8 in blocks of 64, about half \
         the bytes, {how}, {} operations a piece's step): exact below {}, compressed from there on, \
         with the default slots (a communicator on a smaller /dev/shm takes smaller ones and prices its own).\n",
        COMPRESSED_STEP_OPS,
        format_size(min)
    );
    let mut t = table(&["size", "exact µs", "compressed µs", "runs"], &["runs"]);
    for &bytes in sizes {
        let exact = exact_prediction(m, &paths, bytes).seconds;
        let shots = compressed_shots(m.ranks, paths.many.forced, bytes / 2);
        let compressed = compressed_prediction(m, bytes, format, 2, slot_bytes, shots).seconds;
        let runs = if bytes >= min { "compressed" } else { "exact" };
        t.add_row(vec![format_size(bytes), num(exact * 1e6, 1), num(compressed * 1e6, 1), runs.to_owned()]);
    }
    out.push_str(&format!("{}\n", t.trim_fmt()));
    out
}
