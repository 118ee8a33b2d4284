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
        self.split_checked::<T>(stream, whole, Some(part), part_len, how, |point| {
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
        self.split_checked::<T>(stream, buf.raw_ptr(), None, len, how, |point| buf.note_use(point))
    }

    /// Both kinds of all-gather and reduce-scatter once their buffers are checked: `whole`,
    /// `world` parts of `len` elements (`len` > 0), and `part`, this rank's separate part, or
    /// `None` in place (see [`Communicator::split`]). `note` takes the call's point.
    fn split_checked<T: Element>(
        &mut self,
        stream: &Stream,
        whole: RawDevicePtr,
        part: Option<RawDevicePtr>,
        len: usize,
        how: Split,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let part_bytes = len * size_of::<T>();
        let whole_bytes = part_bytes * self.world();
        let own = whole + (self.rank() * part_bytes) as u64;
        if self.by_sum(whole_bytes) {
            return match how {
                // SAFETY: `whole` and `part` are this device's, of the checked lengths, `part`
                // apart where given; `note` notes the point on their views.
                Split::Gather => unsafe {
                    let keep = self.rank() * part_bytes..(self.rank() + 1) * part_bytes;
                    self.sum_bytes(stream, (whole, whole_bytes), keep, part, note)
                },
                // SAFETY: as above; in place, this rank's part lies inside `whole`.
                Split::Scatter(op) => unsafe {
                    self.scatter_by_sum::<T>(stream, (whole, len * self.world()), part.unwrap_or(own), op, note)
                },
            };
        }
        if self.world() != 2 {
            let transfer = self.split_many::<T>(whole, part, len, how);
            return self.enqueue_many(stream, transfer, note);
        }
        let transfer = self.split::<T>(whole, part, len, how);
        self.enqueue(stream, transfer, note)
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
