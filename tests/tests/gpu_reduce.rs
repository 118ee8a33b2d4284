//! GPU: the reduce kernel family, every op × dtype, from device memory and zero-copy from
//! mapped pinned host memory, at lengths 0 to 2^28, aligned and not, against the CPU reference.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::cuda::reduce;
use geforce_p2p::kernels::fp8::{F8E4M3, F8E5M2};
use geforce_p2p::pinned::{copy_from_host, copy_to_host, reduce_from_host};
use geforce_p2p::{DeviceBuffer, PinnedBuffer, ReduceOp, Stream};
use gp2p_tests::{POISON, Reference, check_reduce, device, fill_random, max_len, needs, with_stream};

/// Lengths from the acceptance list; GP2P_TEST_MAX_LEN caps them (the sanitizer runs use it).
const LENGTHS: [usize; 7] = [0, 1, 3, 4095, 65537, (1 << 20) + 3, 1 << 28];
/// Lengths small enough to also run with dst and src misaligned against each other.
const MISALIGNED_MAX: usize = 65537;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    Device,
    /// Zero-copy: mapped pinned host memory.
    ZeroCopy,
}

struct Bench<T: Reference> {
    stream: Stream,
    dst: DeviceBuffer<T>,
    src: DeviceBuffer<T>,
    host_src: PinnedBuffer<T>,
    host_dst: PinnedBuffer<T>,
    host_out: PinnedBuffer<T>,
}

impl<T: Reference> Bench<T> {
    fn new(capacity: usize) -> Self {
        let device = device(0);
        let stream = Stream::new(&device).expect("stream");
        Bench {
            dst: DeviceBuffer::alloc(&device, capacity).expect("dst"),
            src: DeviceBuffer::alloc(&device, capacity).expect("src"),
            host_src: PinnedBuffer::alloc(&device, capacity).expect("pinned src"),
            host_dst: PinnedBuffer::alloc(&device, capacity).expect("pinned dst"),
            host_out: PinnedBuffer::alloc(&device, capacity).expect("pinned out"),
            stream,
        }
    }

    /// One case: dst[dst_off..][..len] = op(dst, src[src_off..][..len]), checked element by
    /// element, with the elements just outside the range checked to be untouched.
    fn case(&mut self, len: usize, dst_off: usize, src_off: usize, op: ReduceOp, source: Source, seed: u64) {
        let divide_by = if op == ReduceOp::Avg { 3 } else { 1 };
        let window = dst_off + len + 1; // one guard element after the range
        fill_random(&mut self.host_src.as_mut_slice().unwrap()[src_off..src_off + len], seed);
        {
            let host_dst = self.host_dst.as_mut_slice().unwrap();
            fill_random(&mut host_dst[dst_off..dst_off + len], seed ^ 0x5555);
        }
        let s = &self.stream;
        self.dst.fill_bytes(s, POISON).unwrap();
        copy_from_host(s, &self.host_dst.view(dst_off..dst_off + len), &mut self.dst.view_mut(dst_off..dst_off + len))
            .unwrap();
        let mut dst_view = self.dst.view_mut(dst_off..dst_off + len);
        match source {
            Source::Device => {
                self.src.fill_bytes(s, POISON).unwrap();
                copy_from_host(
                    s,
                    &self.host_src.view(src_off..src_off + len),
                    &mut self.src.view_mut(src_off..src_off + len),
                )
                .unwrap();
                reduce(s, &mut dst_view, &self.src.view(src_off..src_off + len), op, divide_by).unwrap();
            }
            Source::ZeroCopy => {
                reduce_from_host(s, &mut dst_view, &self.host_src.view(src_off..src_off + len), op, divide_by).unwrap();
            }
        }
        self.host_out.as_mut_slice().unwrap()[..window].fill(T::from_byte(0));
        copy_to_host(s, &self.dst.view(..window), &mut self.host_out.view_mut(..window)).unwrap();
        let out = self.host_out.as_slice().unwrap();
        let dst0 = &self.host_dst.as_slice().unwrap()[dst_off..dst_off + len];
        let src0 = &self.host_src.as_slice().unwrap()[src_off..src_off + len];
        let what = format!("{} {op} {source:?} len {len} dst+{dst_off} src+{src_off} seed {seed}", T::DTYPE);
        if let Err(e) = check_reduce(&out[dst_off..dst_off + len], dst0, src0, op, divide_by) {
            panic!("{what}: {e}");
        }
        let poison = T::from_byte(POISON);
        for guard in (0..dst_off).chain([dst_off + len]) {
            assert!(
                T::matches(out[guard], poison, ReduceOp::Max),
                "{what}: element {guard} outside the range was written"
            );
        }
    }
}

fn run_dtype<T: Reference>() {
    let lengths: Vec<usize> = LENGTHS.into_iter().filter(|&l| l <= max_len()).collect();
    let capacity = lengths.iter().max().copied().unwrap_or(0) + 2;
    let mut bench = Bench::<T>::new(capacity);
    let mut seed = 0x6770_3270 ^ (T::DTYPE.index() as u64) << 40;
    for &len in &lengths {
        for op in ReduceOp::ALL {
            for source in [Source::Device, Source::ZeroCopy] {
                // Offset 0 is the all-vector path; offset 1 element breaks 16-byte alignment
                // of both (head, body, tail); dst+1/src+0 can never be vectorised.
                let mut offsets = vec![(0, 0), (1, 1)];
                if len <= MISALIGNED_MAX {
                    offsets.push((1, 0));
                }
                for (dst_off, src_off) in offsets {
                    seed += 1;
                    bench.case(len, dst_off, src_off, op, source, seed);
                }
            }
        }
    }
}

macro_rules! dtype_tests {
    ($($name:ident: $t:ty),*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $name() {
            needs!(gpus: 1);
            run_dtype::<$t>();
        }
    )*};
}
dtype_tests!(
    reduce_f32: f32, reduce_f64: f64, reduce_f16: geforce_p2p::half::f16, reduce_bf16: geforce_p2p::half::bf16,
    reduce_i8: i8, reduce_u8: u8, reduce_i32: i32, reduce_u32: u32, reduce_i64: i64, reduce_u64: u64,
    reduce_f8e4m3: F8E4M3, reduce_f8e5m2: F8E5M2
);

/// Every pair of codes of an 8-bit type under every op (avg dividing by 1 and by 3): the
/// random data above stay within ±2, and this reaches the specials, saturation, the top
/// binades and the subnormals of the fp8 formats.
fn every_pair_of_codes<T: Reference>(stream: &Stream, from_bits: impl Fn(u8) -> T) {
    let dst: Vec<T> = (0..=u16::MAX).map(|i| from_bits((i >> 8) as u8)).collect();
    let src: Vec<T> = (0..=u16::MAX).map(|i| from_bits(i as u8)).collect();
    for op in ReduceOp::ALL {
        for divide_by in if op == ReduceOp::Avg { vec![1, 3] } else { vec![1] } {
            let mut d = DeviceBuffer::from_host(stream, &dst).unwrap();
            let s = DeviceBuffer::from_host(stream, &src).unwrap();
            reduce(stream, &mut d.view_mut(..), &s.view(..), op, divide_by).unwrap();
            let got = d.to_host_vec(stream).unwrap();
            if let Err(e) = check_reduce(&got, &dst, &src, op, divide_by) {
                panic!("{}: {e}", T::DTYPE);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_every_pair_of_codes_under_every_op() {
    let [(_, stream)] = needs!(gpus: 1).map(with_stream);
    every_pair_of_codes(&stream, F8E4M3::from_bits);
    every_pair_of_codes(&stream, F8E5M2::from_bits);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_reduce_arguments_are_refused_before_any_work() {
    let [(_, stream)] = needs!(gpus: 1).map(with_stream);
    let mut dst = DeviceBuffer::from_host(&stream, &[1.0f32; 8]).unwrap();
    let src = DeviceBuffer::from_host(&stream, &[2.0f32; 7]).unwrap();
    let err = reduce(&stream, &mut dst.view_mut(..), &src.view(..), ReduceOp::Sum, 1).unwrap_err();
    assert!(err.to_string().contains("7 elements, expected 8"), "{err}");
    let src8 = DeviceBuffer::from_host(&stream, &[2.0f32; 8]).unwrap();
    let err = reduce(&stream, &mut dst.view_mut(..), &src8.view(..), ReduceOp::Avg, 0).unwrap_err();
    assert!(err.to_string().contains("divide_by"), "{err}");
    assert_eq!(dst.to_host_vec(&stream).unwrap(), [1.0; 8], "a refused call wrote nothing");
}
