//! All-gather and reduce-scatter: every rank's part into every rank's whole, or the whole
//! reduced and each rank's part of it kept, apart or in place (NCCL's forms); small gathers as
//! one all-reduce kernel (see `by_sum`), the rest through the pipeline.
#![allow(unsafe_code)]

use super::*;

/// Which way an all-gather or reduce-scatter moves its parts (see `Communicator::split`).
#[derive(Debug, Clone, Copy)]
enum Split {
    Gather,
    Scatter(ReduceOp),
}

impl Communicator {
    /// Every rank's `input` in rank order into `output` (of `world` times `input`'s length),
    /// on every rank, ordered after the work queued on `stream`.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        self.split_apart(input, output, stream, Split::Gather)
    }

    /// Every rank's `input` (of `world` times `output`'s length) reduced with `op`, and this
    /// rank's share of the result in `output`: `output = op over ranks of input[rank's part]`,
    /// ordered after the work queued on `stream`.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.split_apart(input, output, stream, Split::Scatter(op))
    }

    /// An all-gather or reduce-scatter whose input and output lie apart: the whole (`world`
    /// parts) is the gather's output and the scatter's input, the part the other.
    fn split_apart<T: Element>(
        &mut self,
        input: &DeviceView<'_, T>,
        output: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        how: Split,
    ) -> Result<()> {
        self.check_call(stream, &[("input", input.device()), ("output", output.device())])?;
        let (whole_name, (whole, whole_len), (part, part_len)) = match how {
            Split::Gather => ("output", (output.raw_ptr(), output.len()), (input.raw_ptr(), input.len())),
            Split::Scatter(_) => ("input", (input.raw_ptr(), input.len()), (output.raw_ptr(), output.len())),
        };
        self.check_lengths(whole_name, whole_len, part_len * self.world())?;
        if part_len == 0 {
            return Ok(());
        }
        check_apart(input.byte_range(), output.byte_range())?;
        let part_bytes = part_len * size_of::<T>();
        if matches!(how, Split::Gather) && self.by_sum(whole_len * size_of::<T>()) {
            let keep = self.rank() * part_bytes..(self.rank() + 1) * part_bytes;
            // SAFETY: the output (`whole`) and input (`part`) are this device's, of the checked
            // lengths, apart; their views note the call's point.
            return unsafe {
                self.sum_bytes(stream, (whole, whole_len * size_of::<T>()), keep, Some(part), |point| {
                    input.note_use(point);
                    output.note_use(point);
                })
            };
        }
        if let Split::Scatter(op) = how
            && self.by_sum(whole_len * size_of::<T>())
        {
            // SAFETY: the input (`whole`) and output (`part`) are this device's, of the checked
            // lengths, apart; their views note the point.
            return unsafe {
                self.scatter_by_sum::<T>(stream, (whole, whole_len), part, op, |p| {
                    input.note_use(p);
                    output.note_use(p);
                })
            };
        }
        if self.world() != 2 {
            let transfer = self.split_many::<T>(whole, Some(part), part_len, how);
            return self.enqueue_many(stream, transfer, |point| {
                input.note_use(point);
                output.note_use(point);
            });
        }
        let transfer = self.split::<T>(whole, Some(part), part_len, how);
        self.enqueue(stream, transfer, |point| {
            input.note_use(point);
            output.note_use(point);
        })
    }

    /// [`Communicator::all_gather`] in place: `buf` holds `world` parts, this rank's input in
    /// part `rank`; afterwards every part holds its rank's input (NCCL's in-place form,
    /// where the input is the output's own part).
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut DeviceViewMut<'_, T>, stream: &Stream) -> Result<()> {
        self.split_in_place(buf, stream, Split::Gather)
    }

    /// [`Communicator::reduce_scatter`] in place: `buf` holds `world` parts; afterwards part
    /// `rank` holds `op` over every rank's part `rank` (the other parts are left as they
    /// were). NCCL's in-place form, where the output is the input's own part.
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        op: ReduceOp,
    ) -> Result<()> {
        self.split_in_place(buf, stream, Split::Scatter(op))
    }

    fn split_in_place<T: Element>(
        &mut self,
        buf: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
        how: Split,
    ) -> Result<()> {
        self.check_call(stream, &[("buf", buf.device())])?;
        let len = self.part_len("buf", buf.len())?;
        if len == 0 {
            return Ok(());
        }
        if matches!(how, Split::Gather) && self.by_sum(buf.bytes()) {
            let part_bytes = len * size_of::<T>();
            let keep = self.rank() * part_bytes..(self.rank() + 1) * part_bytes;
            // SAFETY: `buf` is this device's, its own part in place; its view notes the point.
            return unsafe { self.sum_bytes(stream, (buf.raw_ptr(), buf.bytes()), keep, None, |p| buf.note_use(p)) };
        }
        if let Split::Scatter(op) = how
            && self.by_sum(buf.bytes())
        {
            let (whole, own) = (buf.raw_ptr(), buf.raw_ptr() + (self.rank() * len * size_of::<T>()) as u64);
            // SAFETY: `buf` is this device's, its own part inside it; its view notes the point.
            return unsafe { self.scatter_by_sum::<T>(stream, (whole, buf.len()), own, op, |p| buf.note_use(p)) };
        }
        if self.world() != 2 {
            let transfer = self.split_many::<T>(buf.raw_ptr(), None, len, how);
            return self.enqueue_many(stream, transfer, |point| buf.note_use(point));
        }
        let transfer = self.split::<T>(buf.raw_ptr(), None, len, how);
        self.enqueue(stream, transfer, |point| buf.note_use(point))
    }

    /// The transfer of an all-gather or reduce-scatter over `whole`, two parts of `len`
    /// elements (the gather's output, the scatter's input), and `part`, this rank's separate
    /// part (the gather's input, the scatter's output), or `None` in place (this rank's part
    /// of `whole`). A gather sends this rank's part and copies the peer's in; a scatter sends
    /// the peer's part and folds the peer's copy of this rank's part into it.
    fn split<T: Element>(&self, whole: RawDevicePtr, part: Option<RawDevicePtr>, len: usize, how: Split) -> Transfer {
        let bytes = len * size_of::<T>();
        let at = |index: usize| whole + (index * bytes) as u64;
        let (own, peer) = (at(self.rank()), at(1 - self.rank()));
        let mine = part.unwrap_or(own);
        let (send, receive, local) = match how {
            Split::Gather => (mine, (peer, Landing::Copy), (own, mine)),
            Split::Scatter(op) => (peer, (mine, Landing::Fold { op, divide_by: self.divisor(op) }), (mine, own)),
        };
        // In place, this rank's part is where it belongs already.
        let local = part.map(|_| (local.0, local.1, bytes));
        Transfer { bytes, dtype: T::DTYPE, send: Some(send), receive: Some(receive), local }
    }

    /// [`Communicator::split`] among more than two ranks: the scatter's or the gather's rounds,
    /// after this rank's own part is copied where it belongs (unless in place).
    fn split_many<T: Element>(
        &self,
        whole: RawDevicePtr,
        part: Option<RawDevicePtr>,
        len: usize,
        how: Split,
    ) -> ManyTransfer {
        let bytes = len * size_of::<T>();
        let (world, in_place) = (self.world(), part.is_none());
        let own = whole + (self.rank() * bytes) as u64;
        let (rounds, op, local) = match how {
            Split::Gather => (Rounds::all_gather(world, bytes, in_place), ReduceOp::Sum, part.map(|p| (own, p, bytes))),
            Split::Scatter(op) => (Rounds::reduce_scatter(world, bytes, in_place), op, part.map(|p| (p, own, bytes))),
        };
        let divide_by = self.divisor(op);
        ManyTransfer {
            rounds,
            dtype: T::DTYPE,
            main: whole,
            part: part.unwrap_or(0),
            op,
            divide_by,
            local,
            wires: None,
        }
    }
}
