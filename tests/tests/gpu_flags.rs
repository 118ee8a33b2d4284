//! GPU: the stream memory operations that hand a communicator's slots over between processes.
//! `write_flag` and `write_flags` (a writer's flags for its readers of one slot, one batched
//! driver call) set every word they name to the value, in stream order, and no other word;
//! a batch refuses more flags than it takes and a misaligned one before any work.
//! `wait_flags_stream` until every flag equals a value holds a stream until every flag it names does, and
//! refuses what it cannot take likewise. A stream wait for any of a mask's bits with a note
//! around it (the watched waits' form) runs in order and holds where the flag has none of them.

// The flag writes are the driver's raw stream operations: unsafe fns over addresses.
#![allow(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::PinnedBuffer;
use geforce_p2p::cuda::Error as CudaError;
use geforce_p2p::cuda::raw::{
    MAX_FLAG_BATCH, MAX_MEM_OPS, MemOp, Note, Until, mapped_device_ptr, mem_ops, wait_flags_stream, write_flag,
    write_flags,
};
use gp2p_tests::{needs, with_stream};

#[test]
#[ignore = "needs a CUDA GPU"]
fn flag_batches_set_every_word_they_name_in_stream_order_and_refuse_what_they_cannot_take() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    const WORDS: usize = 96;
    let mut host = PinnedBuffer::<u32>::alloc(&device, WORDS).unwrap();
    host.as_mut_slice().unwrap().fill(u32::MAX);
    let base = mapped_device_ptr(&device, host.host_ptr().cast()).unwrap();
    let word = |i: usize| base + 4 * i as u64;

    // Batches of every size up to the most, each over its own words, every third one (as a
    // slot's flags for its readers sit, with the writer's own left out); what each word
    // should hold afterwards.
    let mut want = vec![u32::MAX; WORDS];
    let mut next = 0;
    for (count, value) in [(1, 7u32), (2, 8), (3, 9), (7, 10), (MAX_FLAG_BATCH, 11)] {
        let flags: Vec<_> = (0..count).map(|k| next + 3 * k).collect();
        next = flags[count - 1] + 1;
        let addresses: Vec<_> = flags.iter().map(|&i| word(i)).collect();
        // SAFETY: words of a live mapped pinned buffer, 4-byte aligned, kept until the sync.
        unsafe { write_flags(&stream, &addresses, value).unwrap() };
        for i in flags {
            want[i] = value;
        }
    }
    assert!(next <= WORDS, "the batches fit the buffer");
    // In stream order: a single write, then a batch over the same word, then another single.
    // SAFETY: as above.
    unsafe {
        write_flag(&stream, word(WORDS - 1), 1).unwrap();
        write_flags(&stream, &[word(WORDS - 2), word(WORDS - 1)], 2).unwrap();
        write_flag(&stream, word(WORDS - 2), 3).unwrap();
    }
    want[WORDS - 1] = 2;
    want[WORDS - 2] = 3;
    // Refused before any work: too many flags, a misaligned one; an empty batch does nothing.
    let too_many = vec![word(0); MAX_FLAG_BATCH + 1];
    // SAFETY: refused before the driver sees them (and would be valid words if not).
    let refused = unsafe { write_flags(&stream, &too_many, 99) }.unwrap_err();
    assert!(matches!(refused, CudaError::InvalidArgument { name: "flags", .. }), "{refused}");
    // SAFETY: as above.
    let misaligned = unsafe { write_flags(&stream, &[word(0), word(1) + 2], 99) }.unwrap_err();
    assert!(matches!(misaligned, CudaError::InvalidArgument { name: "flag", .. }), "{misaligned}");
    // SAFETY: no flags.
    unsafe { write_flags(&stream, &[], 99).unwrap() };
    stream.synchronize().unwrap();
    assert_eq!(host.as_slice().unwrap(), want.as_slice());
}

/// Zeroed words of pinned memory that the GPU polls and writes, which the host sets and reads
/// through the raw pointer, one volatile word at a time, never a slice over them.
struct Words {
    host: PinnedBuffer<u32>,
    base: u64,
}

impl Words {
    fn new(device: &geforce_p2p::Device, count: usize) -> Words {
        let mut host = PinnedBuffer::<u32>::alloc(device, count).unwrap();
        host.as_mut_slice().unwrap().fill(0);
        let base = mapped_device_ptr(device, host.host_ptr().cast()).unwrap();
        Words { host, base }
    }

    /// The device's address of word `i`.
    fn device(&self, i: usize) -> u64 {
        self.base + 4 * i as u64
    }

    fn set(&self, i: usize, value: u32) {
        assert!(i < self.host.len());
        // SAFETY: a word of the live buffer (checked just above).
        unsafe { self.host.host_ptr().cast_mut().add(i).write_volatile(value) };
    }

    fn get(&self, i: usize) -> u32 {
        assert!(i < self.host.len());
        // SAFETY: as for `set`.
        unsafe { self.host.host_ptr().add(i).read_volatile() }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn unbounded_waits_hold_the_stream_until_every_flag_equals_the_value_and_refuse_what_they_cannot_take() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    const WORDS: usize = 8;
    const AFTER: usize = WORDS - 1;
    let host = Words::new(&device, WORDS);
    let (word, set, get) = (|i| host.device(i), |i, value| host.set(i, value), |i| host.get(i));

    // A wait on three flags for 5, then a write behind it.
    // SAFETY: words of a live mapped pinned buffer, 4-byte aligned, kept until the sync; the
    // host sets the three flags to 5 below, before it waits for the stream.
    unsafe {
        wait_flags_stream(&stream, word(0), 3, Until::Equal(5), None).unwrap();
        write_flag(&stream, word(AFTER), 1).unwrap();
    }
    // Two flags equal and the third above the value: a wait for equality still holds.
    set(0, 5);
    set(1, 5);
    set(2, 6);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let while_held = get(AFTER);
    set(2, 5);
    stream.synchronize().unwrap();
    assert_eq!(while_held, 0, "the write ran before every flag equalled the value");
    assert_eq!(get(AFTER), 1, "the write ran once they did");

    // Refused before any work: too many flags, a misaligned or missing address; none is no wait.
    // SAFETY: refused before the driver sees them (and would be valid words if not).
    let too_many =
        unsafe { wait_flags_stream(&stream, word(0), MAX_FLAG_BATCH + 1, Until::Equal(5), None) }.unwrap_err();
    assert!(matches!(too_many, CudaError::InvalidArgument { name: "count", .. }), "{too_many}");
    // SAFETY: as above.
    let misaligned = unsafe { wait_flags_stream(&stream, word(0) + 2, 1, Until::Equal(5), None) }.unwrap_err();
    assert!(matches!(misaligned, CudaError::InvalidArgument { name: "flags", .. }), "{misaligned}");
    // SAFETY: as above.
    let missing = unsafe { wait_flags_stream(&stream, 0, 1, Until::Equal(5), None) }.unwrap_err();
    assert!(matches!(missing, CudaError::InvalidArgument { name: "flags", .. }), "{missing}");
    // SAFETY: no flags, so nothing is enqueued (word 3 holds 0, which a wait for 5 would
    // hold the stream on for good).
    unsafe {
        wait_flags_stream(&stream, word(3), 0, Until::Equal(5), None).unwrap();
        write_flag(&stream, word(AFTER), 2).unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(get(AFTER), 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_batch_notes_holds_until_the_flag_has_a_bit_of_the_mask_and_notes_again_in_order() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    const WORDS: usize = 4;
    const LEFT: u32 = 1 << 31;
    let (progress, flag, after) = (0, 1, 3);
    let host = Words::new(&device, WORDS);
    let (word, set, get) = (|i| host.device(i), |i, value| host.set(i, value), |i| host.get(i));
    set(flag, 1);
    // SAFETY: words of a live mapped pinned buffer, kept until the sync; the host sets the
    // flag's other bit below, before it waits for the stream.
    unsafe {
        let note = Note { word: word(progress), entered: 5, left: 5 | LEFT };
        wait_flags_stream(&stream, word(flag), 1, Until::AnyBit(2), Some(note)).unwrap();
        write_flag(&stream, word(after), 1).unwrap();
    }
    // The flag holds the other bit only: the batch holds after its first note (seen within
    // 10 s however the GPU is shared), and holds on for 100 ms more.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while get(progress) != 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (noted, while_held) = (get(progress), get(after));
    set(flag, 3); // both bits: what the watchdog writes to end any watched wait
    stream.synchronize().unwrap();
    assert_eq!((noted, while_held), (5, 0), "the first note ran and the wait held");
    assert_eq!((get(progress), get(after)), (5 | LEFT, 1), "then the second note and the write after");

    // Refused before any work: too many operations, a missing or misaligned flag.
    let too_many = vec![MemOp::Write { flag: word(progress), value: 1 }; MAX_MEM_OPS + 1];
    // SAFETY: refused before the driver sees them (and would be valid words if not).
    let refused = unsafe { mem_ops(&stream, &too_many) }.unwrap_err();
    assert!(matches!(refused, CudaError::InvalidArgument { name: "ops", .. }), "{refused}");
    for bad in [0, word(flag) + 2] {
        // SAFETY: as above.
        let refused = unsafe { mem_ops(&stream, &[MemOp::WaitAny { flag: bad, mask: 1 }]) }.unwrap_err();
        assert!(matches!(refused, CudaError::InvalidArgument { name: "flag", .. }), "{refused}");
        let note = Note { word: bad, entered: 1, left: 2 };
        // SAFETY: as above.
        let refused = unsafe { wait_flags_stream(&stream, word(flag), 1, Until::AnyBit(1), Some(note)) }.unwrap_err();
        assert!(matches!(refused, CudaError::InvalidArgument { name: "note", .. }), "{refused}");
    }
}
