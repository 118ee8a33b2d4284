//! The communicator's all-reduce: the one-kernel paths (lines, flagged chunks) for small
//! buffers, the two-rank pipeline above them, and among more than two the cost model's
//! choice of the line kernel or the two-shot rounds, with the two-shot in flagged chunks
//! between them where the communicator was made with room for it.
#![allow(unsafe_code)]

use gp2p_cuda::raw::{ManyChunkAreas, memcpy_dtod_async, memset_elements_async, plan_chunks_many};

use super::*;

impl Communicator {
    /// In place on every rank: `buf = op(every rank's buf)`, ordered after the work queued
    /// on `stream` so far; later work there sees the result. For avg the sum is divided by
    /// the world size. Where the communicator was made to compress ([`CommOptions::compress`]
    /// or `GP2P_COMPRESS`), sums and averages of f32, f16 and bf16 from its minimum size on
    /// run [`Communicator::all_reduce_compressed`] instead.
    pub fn all_reduce<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        let (ptr, len) = (buf.raw_ptr(), buf.len());
        self.all_reduce_checked::<T>(InOut::in_place(ptr), len, stream, op, |point| buf.note_use(point))
    }

    /// Out of place: `output = op(every rank's input)`, `input` left as it was (what a
    /// server's custom all-reduce returns: a new tensor). Pairs with any rank's all-reduce of
    /// the same length, in place or not. Up to [`Communicator::small_max_bytes`] the one kernel
    /// reads `input` and writes `output`, so the call costs what the in-place one does;
    /// above, `input` is copied into `output` on `stream` first. `output` must have `input`'s
    /// length and lie apart from it.
    pub fn all_reduce_into<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        let buf = self.check_into(stream, input, output)?;
        self.all_reduce_checked::<T>(buf, input.len(), stream, op, |point| {
            input.note_use(point);
            output.note_use(point);
        })
    }

    /// An out-of-place all-reduce's buffers checked (on this rank's device, as long as each
    /// other, apart) and the call with them: its addresses.
    pub(super) fn check_into<T: Element>(
        &mut self,
        stream: &Stream,
        input: &DeviceView<'_, T>,
        output: &DeviceViewMut<'_, T>,
    ) -> Result<InOut> {
        self.check_call(stream, &[("input", input.device()), ("output", output.device())])?;
        if output.len() != input.len() {
            return Err(Error::OutputLength { output: output.len(), input: input.len() });
        }
        if !input.is_empty() {
            check_apart(input.byte_range(), output.byte_range())?;
        }
        Ok(InOut { src: input.raw_ptr(), dst: output.raw_ptr() })
    }

    /// [`Communicator::all_reduce`] and [`Communicator::all_reduce_into`] once their buffers
    /// are checked: `len` elements at `buf.src` and `buf.dst`, on this device, the same or
    /// apart; `note` takes the point after the call.
    pub(super) fn all_reduce_checked<T: Element>(
        &mut self,
        buf: InOut,
        len: usize,
        stream: &Stream,
        op: ReduceOp,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let bytes = len * T::DTYPE.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        if let Some(compress) = self.compress
            && self.world() > 1
            && bytes >= compress.min_bytes
            && super::compressed::compressible::<T>(op)
        {
            return self.compressed_checked::<T>(buf, len, stream, op, compress.format, note);
        }
        // The staged paths fold into the output: it starts as this rank's input.
        let local = (buf.src != buf.dst).then_some((buf.dst, buf.src, bytes));
        let divide_by = self.divisor(op);
        // Two ranks above the one-kernel sizes take the exchange, or the rounds where forced or
        // where they share one link (see AllReducePaths::two_ranks_take_rounds).
        if self.world() != 2 || (bytes > self.small_max_bytes() && self.all_reduce_paths().two_ranks_take_rounds(bytes))
        {
            return self.all_reduce_many::<T>(buf, len, stream, op, note);
        }
        if bytes > self.small_max_bytes() {
            let receive = Some((buf.dst, Landing::Fold { op, divide_by }));
            let transfer = Transfer { bytes, dtype: T::DTYPE, send: Some(buf.src), receive, local };
            return self.enqueue(stream, transfer, note);
        }
        // SAFETY: `buf` is `len` elements on this device, its two addresses the same or apart
        // (checked by the caller), and `len` does not exceed the one-kernel size (above).
        unsafe { self.one_kernel::<T>(buf, len, stream, op, &Around::default(), note) }
    }

    /// Where this communicator's exact all-reduces go by size, for the cost model to price
    /// ([`crate::choice::all_reduce_prediction`]; `gp2p bench comm` prints it beside each row).
    pub fn all_reduce_paths(&self) -> AllReducePaths {
        AllReducePaths {
            world: self.world(),
            small_max: self.small_max_bytes(),
            slot_bytes: self.layout.slot_bytes,
            chunk_bytes: self.layout.fixed_chunk(),
            many: self.many,
            shared_link: self.shared_link,
        }
    }

    /// [`Communicator::all_reduce_checked`] among more (or fewer) than two ranks, and between
    /// two that take the rounds: every rank's lines read by every other (one kernel), or the
    /// two-shot rounds, as the cost model or the forced algorithm picks (see the `choice`
    /// module).
    fn all_reduce_many<T: Element>(
        &mut self,
        buf: InOut,
        len: usize,
        stream: &Stream,
        op: ReduceOp,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let (bytes, divide_by) = (len * T::DTYPE.size_bytes(), self.divisor(op));
        let local = (buf.src != buf.dst).then_some((buf.dst, buf.src, bytes));
        if self.world() == 1 {
            // Its own input is the result (avg divides by 1): copied where it goes elsewhere.
            let transfer = ManyTransfer {
                rounds: Rounds { world: 1, legs: Vec::new() },
                dtype: T::DTYPE,
                main: buf.dst,
                part: 0,
                op,
                divide_by,
                local,
                wires: None,
            };
            return match local {
                Some(_) => self.enqueue_many(stream, transfer, note),
                None => Ok(()),
            };
        }
        if self.many.path(bytes) == ManyPath::Rounds {
            let rounds = Rounds::all_reduce(self.world(), bytes);
            let transfer =
                ManyTransfer { rounds, dtype: T::DTYPE, main: buf.dst, part: 0, op, divide_by, local, wires: None };
            return self.enqueue_many(stream, transfer, note);
        }
        // SAFETY: `buf` is `len` elements on this device, its two addresses the same or apart
        // (checked by the caller), and the lines take `len` (the path above says so).
        unsafe { self.one_kernel::<T>(buf, len, stream, op, &Around::default(), note) }
    }

    /// The one-kernel all-reduce of `len` elements at `buf` in one call (see
    /// [`Communicator::call`]): between two ranks the lines or the flagged chunks, among more
    /// the line kernel or, above the lines, the many-rank flagged chunks; `around`'s zeroing and copies on `stream` right before and after the
    /// kernel, inside the call (after this rank's previous call, before the point `note` takes).
    ///
    /// # Safety
    /// `buf` is `len` elements of `T` on this device, its two addresses the same or apart, held
    /// until the work completes (`note`); `len` elements are at most the layout's room for
    /// the one kernel (`CommOptions::small_max_bytes`, at least [`Communicator::small_max_bytes`])
    /// between two ranks, and among more what the lines hold or, where
    /// [`ManyChoice::path`] takes the flagged chunks, what their areas hold;
    /// `around`'s ranges are this device's, held likewise (its own contract); every rank makes
    /// the same call.
    pub(super) unsafe fn one_kernel<T: Element>(
        &mut self,
        buf: InOut,
        len: usize,
        stream: &Stream,
        op: ReduceOp,
        around: &Around,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let (bytes, divide_by) = (len * T::DTYPE.size_bytes(), self.divisor(op));
        if self.world() == 2 {
            let (timeout_ns, chunk_blocks, lines_max) = (self.timeout_ns(), self.chunk_blocks, self.layout.lines_max);
            let (lines, areas) = (self.exchange_lines(), self.chunk_areas());
            return self.call(
                stream,
                // SAFETY: `buf` is `len` elements on this device, its two addresses the same or
                // apart, and `around`'s ranges are this device's (this function's contract); both
                // ranks' areas (two halves each) lie in the registered staging area, 256-aligned,
                // laid out by Layout::new for `small_max_bytes`, which `len` does not exceed (the
                // contract): the lines for up to the layout's lines_max, then the chunks. Only this rank's kernels write its
                // own area (the peer writes its own); `failed` is this rank's aligned u32 of it,
                // `broken` the communicator's; the counter is this communicator's own two device
                // words, touched only by its small-path kernels, which run in order (each call
                // waits for the last, or a captured graph's launches are ordered by the caller:
                // allow_graph_capture's contract), and both kernels number calls alike (the line
                // kernel leaves the ticket at 0). The registration and counter outlive the
                // kernel: `call` notes its point on them, or, captured, they stay for the
                // process's life. The peer enqueues the same call (it takes the same kernel: the
                // size decides). The launch cache is this rank's, and its launches are these
                // calls, each after the last.
                |comm| unsafe {
                    around.before(stream)?;
                    let launches = comm.launches.as_mut();
                    if bytes <= lines_max {
                        exchange(stream, buf, len, T::DTYPE, op, lines, 0, divide_by, timeout_ns, launches)?;
                    } else {
                        // Between processes a peer that never arrives may have died: the same
                        // bound either way, so every rank hears of it within the peer timeout.
                        let waits = ChunkWaits { timeout_ns, queue_timeout_ns: timeout_ns };
                        let blocks = chunk_grid(bytes, chunk_blocks);
                        let device = stream.device();
                        if let Some(kernel) =
                            plan_exchange_chunks(device, buf, len, T::DTYPE, op, areas, divide_by, waits, blocks)?
                        {
                            kernel.enqueue(stream, launches)?;
                        }
                    }
                    around.after(stream)
                },
                note,
            );
        }
        let (timeout_ns, lines, lines_max) = (self.timeout_ns(), self.many_lines(), self.layout.lines_max);
        let (chunk_blocks, areas) = (self.chunk_blocks, self.many_chunk_areas());
        self.call(
            stream,
            // SAFETY: `buf` is `len` elements on this device, its two addresses the same or
            // apart, `around`'s ranges this device's, and `len` within the lines or, above
            // them, the chunk areas (this function's contract); every rank's area (two halves
            // each, `2 * half` apart) lies in the registered staging area, laid out by
            // Layout::new with lines for up to lines_max and after them, where the layout
            // made them, chunk areas for small_max (many_chunks chunks); only this rank's
            // kernels write its own. The failed, broken and counter words and the launch cache
            // are as for the two-rank kernels (see all_reduce_checked), and outlive the kernel
            // likewise; both kernels number calls from the counter alike. Every rank enqueues
            // the same call (the size decides the kernel on every rank).
            |comm| unsafe {
                around.before(stream)?;
                let launches = comm.launches.as_mut();
                if bytes <= lines_max {
                    exchange_many(stream, buf, len, T::DTYPE, op, lines, divide_by, timeout_ns, launches)?;
                } else {
                    let waits = ChunkWaits { timeout_ns, queue_timeout_ns: timeout_ns };
                    let blocks = chunk_grid(bytes, chunk_blocks);
                    let device = stream.device();
                    if let Some(kernel) =
                        plan_chunks_many(device, buf, len, T::DTYPE, op, areas, divide_by, waits, blocks)?
                    {
                        kernel.enqueue(stream, launches)?;
                    }
                }
                around.after(stream)
            },
            note,
        )
    }

    /// Every rank's areas for the many-rank flagged-chunk kernel, after their lines,
    /// numbered from the device counter.
    fn many_chunk_areas(&self) -> ManyChunkAreas {
        let at = |offset: usize| self.staging + offset as u64;
        ManyChunkAreas {
            areas: at(self.layout.area_of(0, 0) + self.layout.lines_bytes),
            area_stride: 2 * self.layout.half as u64,
            half_stride: self.layout.half as u64,
            area_chunks: self.layout.many_chunks as u64,
            rank: self.rank(),
            world: self.world(),
            counter: self.seq_counter.raw_ptr(),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
        }
    }

    /// Every rank's lines for the line kernel among more than two ranks.
    fn many_lines(&self) -> ManyLines {
        let at = |offset: usize| self.staging + offset as u64;
        ManyLines {
            lines: at(self.layout.area_of(0, 0)),
            area_stride: 2 * self.layout.half as u64,
            rank: self.rank(),
            world: self.world(),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
            counter: self.seq_counter.raw_ptr(),
            half_stride: self.layout.half as u64,
        }
    }

    /// The lines of the smallest all-reduces, numbered from the device counter.
    fn exchange_lines(&self) -> ExchangeLines {
        let peer = 1 - self.rank();
        let at = |offset: usize| self.staging + offset as u64;
        ExchangeLines {
            out_lines: at(self.layout.area_of(self.rank(), 0)),
            in_lines: at(self.layout.area_of(peer, 0)),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
            numbering: Numbering::Counted { counter: self.seq_counter.raw_ptr(), half_stride: self.layout.half as u64 },
        }
    }

    /// The flagged chunks of the other small all-reduces, numbered from the device counter.
    fn chunk_areas(&self) -> ChunkAreas {
        let peer = 1 - self.rank();
        let at = |offset: usize| self.staging + offset as u64;
        ChunkAreas {
            out_area: at(self.layout.area_of(self.rank(), 0) + self.layout.lines_bytes),
            in_area: at(self.layout.area_of(peer, 0) + self.layout.lines_bytes),
            half_stride: self.layout.half as u64,
            flags_offset: self.layout.flags_offset as u64,
            counter: self.seq_counter.raw_ptr(),
            failed: at(self.layout.flag(self.rank())),
            broken: at(self.layout.broken()),
        }
    }
}

/// Zeroing and copies on the caller's stream around a one-kernel all-reduce, inside its call:
/// what the `by_sum` module sends through the kernel. The default does nothing.
#[derive(Debug, Default)]
pub(super) struct Around {
    /// Byte ranges `(at, bytes)` set to zero before the kernel.
    pub(super) zero: [(RawDevicePtr, usize); 2],
    /// `(dst, src, bytes)` copied before the kernel.
    pub(super) before: Option<(RawDevicePtr, RawDevicePtr, usize)>,
    /// `(dst, src, bytes)` copied after it.
    pub(super) after: Option<(RawDevicePtr, RawDevicePtr, usize)>,
}

impl Around {
    /// The zeroing, then the copy before the kernel.
    ///
    /// # Safety
    /// Every range is device memory of the stream's device, writable where written, the
    /// copies' two sides apart, held until the work completes.
    unsafe fn before(&self, stream: &Stream) -> Result<()> {
        for &(at, bytes) in &self.zero {
            // SAFETY: the caller's contract; one byte at a time, so any alignment.
            unsafe { memset_elements_async(stream, at, 1, 0, bytes)? };
        }
        // SAFETY: the caller's contract.
        unsafe { copy(stream, self.before) }
    }

    /// The copy after the kernel.
    ///
    /// # Safety
    /// As for [`Around::before`].
    unsafe fn after(&self, stream: &Stream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { copy(stream, self.after) }
    }
}

/// `(dst, src, bytes)` copied on `stream`, where given.
///
/// # Safety
/// As for [`Around::before`].
unsafe fn copy(stream: &Stream, copy: Option<(RawDevicePtr, RawDevicePtr, usize)>) -> Result<()> {
    if let Some((dst, src, bytes)) = copy {
        // SAFETY: the caller's contract.
        unsafe { memcpy_dtod_async(stream, dst, src, bytes)? };
    }
    Ok(())
}
