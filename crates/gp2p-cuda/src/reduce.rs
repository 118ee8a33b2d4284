//! The checked launch of the reduce kernel family on typed views, `dst[i] = op(dst[i],
//! src[i])`, and the warm-up that loads every kernel before kernels that wait for each other run.
#![allow(unsafe_code)]

use gp2p_kernels::{
    CHUNK_BLOCK_THREADS, DType, Element, KernelFamily, REDUCE_BLOCK_THREADS, ReduceOp, WAIT_FLAG_KERNEL,
    WAIT_FLAGS_KERNEL, chunks_kernel_name, chunks_many_kernel_name, exchange_kernel_name, exchange_many_kernel_name,
    reduce_kernel_name,
};

use crate::launch::{
    ChunksArgs, ChunksManyArgs, ExchangeArgs, ExchangeManyArgs, ONE_THREAD, ReduceArgs, SourceMemory, WaitFlagArgs,
    WaitFlagsArgs, launch_kernel,
};
use crate::replay::LaunchCache;
use crate::{DeviceView, DeviceViewMut, Error, LaunchConfig, Module, Result, Stream};

/// Enqueue `dst[i] = op(dst[i], src[i])` for every element on `stream`.
///
/// `divide_by` serves [`ReduceOp::Avg`]: the sum is divided by it (pass the number of
/// contributions on the last step and 1 on every other); other ops ignore it. It must be ≥ 1.
///
/// Both views must be on the stream's device and have equal lengths; `src` may be device
/// memory or (through `gp2p-pinned`) mapped pinned host memory. Asynchronous; starts after
/// earlier work on `stream`.
pub fn reduce<T: Element>(
    stream: &Stream,
    dst: &mut DeviceViewMut<'_, T>,
    src: &DeviceView<'_, T>,
    op: ReduceOp,
    divide_by: u32,
) -> Result<()> {
    for (what, device) in [("dst", dst.device()), ("src", src.device())] {
        if device != stream.device() {
            return Err(Error::WrongDevice { what, got: device.ordinal(), expected: stream.device().ordinal() });
        }
    }
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch { what: "src", got: src.len(), expected: dst.len() });
    }
    // SAFETY: both views were checked to be on the stream's device with equal lengths; a
    // DeviceViewMut is exclusive and a DeviceView shared, so they do not overlap unless the
    // caller broke a from_raw contract.
    unsafe {
        crate::raw::reduce(
            stream,
            dst.raw_ptr(),
            src.raw_ptr(),
            dst.len(),
            T::DTYPE,
            op,
            divide_by,
            SourceMemory::Device,
        )?
    };
    if !dst.is_empty() {
        let point = stream.point()?;
        dst.note_use(&point);
        src.note_use(&point);
    }
    Ok(())
}

/// Load every kernel module on `device` now ([`Module::kernels`] loads all families), and
/// every reduce, exchange, flagged-chunk, codec and wait kernel in them by launching each once,
/// empty, and waiting for them (once per device and process; later calls return at once).
///
/// Under the driver's lazy loading (`CUDA_MODULE_LOADING=LAZY`, the default of recent
/// drivers) a kernel's code is loaded at its first launch, and a load may wait for the whole
/// context to go idle. The exchange kernels spin until their peer kernel runs: a load
/// between the two ranks' launches (another thread's first reduce of a new dtype, say) would
/// wait for the spinning kernel, which waits for a launch held up behind the load, until
/// its timeout. Whoever launches exchange kernels calls this first. (Not done for every
/// module use: under compute-sanitizer each kernel's first launch is slow, and instrumenting
/// all of them made the racecheck run of the collectives' tests outlast its limit.)
pub fn load_all_reduce_kernels(device: &crate::Device) -> Result<()> {
    let module = Module::kernels(device, KernelFamily::Reduce)?;
    // The reduce module's once-flag stands for the device's warm-up of every family.
    module.warm_once(|module| {
        let exchanges = Module::kernels(device, KernelFamily::Exchange)?;
        let many_exchanges = Module::kernels(device, KernelFamily::ExchangeMany)?;
        let flags = Module::kernels(device, KernelFamily::Flags)?;
        let chunks = Module::kernels(device, KernelFamily::Chunks)?;
        let stream = Stream::new(device)?;
        let one = LaunchConfig { grid: 1, block: REDUCE_BLOCK_THREADS, shared_bytes: 0 };
        let one_chunk_block = LaunchConfig { grid: 1, block: CHUNK_BLOCK_THREADS, shared_bytes: 0 };
        // The chunk kernels read their round from the counter's first word and count finished
        // blocks in its second: a zeroed pair of their own.
        let mut counter = crate::DeviceBuffer::<u32>::alloc(device, 2)?;
        counter.fill_bytes(&stream, 0)?;
        let chunk_args = ChunksArgs { seq_counter: counter.raw_ptr(), ..ChunksArgs::default() };
        // The many-rank chunk kernel, with world 0, says so in its failed word: one of its own.
        let mut refused = crate::DeviceBuffer::<u32>::alloc(device, 1)?;
        refused.fill_bytes(&stream, 0)?;
        let chunks_many_args =
            ChunksManyArgs { seq_counter: counter.raw_ptr(), failed: refused.raw_ptr(), ..ChunksManyArgs::default() };
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                // SAFETY: n = 0: the reduce and exchange kernels touch no memory, so null
                // addresses are fine; the chunk kernels touch only their counter, a live
                // zeroed pair, and the many-rank one its failed word, both freed after the
                // point noted below.
                unsafe {
                    let reduce = module.function(reduce_kernel_name(op, dtype))?;
                    launch_kernel(&reduce, &stream, one, &ReduceArgs::default(), None)?;
                    let exchange = exchanges.function(exchange_kernel_name(op, dtype))?;
                    launch_kernel(&exchange, &stream, one, &ExchangeArgs::default(), None)?;
                    // World 0: the kernel returns before it reads anything.
                    let many = many_exchanges.function(exchange_many_kernel_name(op, dtype))?;
                    launch_kernel(&many, &stream, one, &ExchangeManyArgs::default(), None)?;
                    // No chunks: the kernel touches only its counter.
                    let chunk = chunks.function(chunks_kernel_name(op, dtype))?;
                    launch_kernel(&chunk, &stream, one_chunk_block, &chunk_args, None)?;
                    // World 0: the kernel sets its failed word and counts its block, nothing more.
                    let many_chunk = chunks.function(chunks_many_kernel_name(op, dtype))?;
                    launch_kernel(&many_chunk, &stream, one_chunk_block, &chunks_many_args, None)?;
                }
            }
        }
        crate::raw::launch_each_codec_kernel_empty(&stream)?;
        // The wait kernel waits for its flag to equal 0 here: a zeroed word of its own, also
        // the `failed` word it never needs to set.
        let mut word = crate::DeviceBuffer::<u32>::alloc(device, 1)?;
        word.fill_bytes(&stream, 0)?;
        let word_ptr = word.raw_ptr();
        let wait = WaitFlagArgs { flag: word_ptr, value: 0, timeout_ns: 0, failed: word_ptr, broken: word_ptr };
        let wait_kernel = flags.function(WAIT_FLAG_KERNEL)?;
        // Launched, and once more replayed from a graph: whatever the driver sets up at a
        // context's first graph (instantiated and launched) is done now too, not between two
        // ranks' replayed launches (LaunchCache).
        let mut graphs = LaunchCache::new(device);
        // SAFETY: the wait kernel; the flag holds the value by then (zeroed before, in stream
        // order): each launch reads the live word once and returns; the word is freed after
        // the point noted below. The second launch is the cache's only one.
        unsafe {
            launch_kernel(&wait_kernel, &stream, ONE_THREAD, &wait, None)?;
            launch_kernel(&wait_kernel, &stream, ONE_THREAD, &wait, Some(&mut graphs))?;
            // No flags to wait for: the kernel only fences.
            let none = WaitFlagsArgs {
                flags: word_ptr,
                count: 0,
                value: 0,
                timeout_ns: 0,
                failed: word_ptr,
                broken: word_ptr,
            };
            launch_kernel(&flags.function(WAIT_FLAGS_KERNEL)?, &stream, ONE_THREAD, &none, None)?;
        }
        // Waiting on a point, not Stream::synchronize: that would also take (and so hide
        // from its owner) an error some destructor deferred.
        let point = stream.point()?;
        word.view(..).note_use(&point);
        counter.view(..).note_use(&point);
        refused.view(..).note_use(&point);
        point.synchronize()
    })
}
