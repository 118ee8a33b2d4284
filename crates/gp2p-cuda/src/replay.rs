//! Kernel launches replayed from CUDA graphs: for callers that launch the same few kernels
//! over and over, in an order the GPU keeps anyway.
//!
//! Why: on the H200 machines this library is measured on, the host pays 4-5 us for a
//! `cuLaunchKernel` and about 2 us for a `cuGraphLaunch`, whatever the graph holds
//! (`benches/probes/driver_call_costs.py`; in the driver-call traces of
//! `benches/probes/trace_calls.py` the launch was 3.9 us of the communicator's 7 us call). A
//! [`LaunchCache`] keeps single-node graphs of each kernel, a few per kernel: a launch with
//! the shape and arguments one of them holds replays it, another one is made into a graph of
//! its own while the kernel has fewer than [`VARIANTS_PER_KERNEL`], and is otherwise set into
//! the kernel's least recently used graph first (`cuGraphExecKernelNodeSetParams`, which
//! affects only later launches, and costs about as much host time as the replay). A few per
//! kernel because a server's out-of-place all-reduce writes a new tensor each call, which
//! torch's caching allocator hands out from a few addresses that recur.
//!
//! The cost of replaying: a launch of a graph is ordered after the earlier launches of that
//! graph, on whatever stream they ran. So one cache serves one caller whose launches may run
//! one after another (a communicator's rank), never kernels that must run at the same time:
//! that is the contract of [`LaunchCache::launch`].
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUgraph, CUgraphExec, CUgraphNode, CUresult};

use crate::driver::{check, defer_error};
use crate::{Device, Error, Function, LaunchConfig, Result, Stream};

#[cfg(target_endian = "big")]
compile_error!("kernel arguments are kept in 64-bit slots read through their first bytes: little-endian only");

/// The most arguments a kernel of this crate takes (the flagged-chunk and many-rank exchange
/// kernels take 13; launch.rs's tests check every family's count against its PTX).
const MAX_PARAMS: usize = 16;

/// Graphs a cache keeps, of every kernel; the least recently used goes first.
const CACHED_GRAPHS: usize = 32;

/// Graphs a cache keeps of one kernel, each with its own arguments.
pub(crate) const VARIANTS_PER_KERNEL: usize = 8;

/// A kernel's arguments by value, each in a 64-bit slot, a 32-bit one in its low half (the
/// driver reads as many bytes from each slot as the parameter takes), so that a launch can
/// tell whether they changed since the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Params {
    slots: [u64; MAX_PARAMS],
    len: usize,
}

impl Params {
    pub(crate) fn u64(mut self, value: u64) -> Params {
        assert!(self.len < MAX_PARAMS, "a kernel of this crate takes at most {MAX_PARAMS} arguments");
        self.slots[self.len] = value;
        self.len += 1;
        self
    }

    pub(crate) fn u32(self, value: u32) -> Params {
        self.u64(u64::from(value))
    }

    /// Pointers to each argument, as `cuLaunchKernel` takes them (valid while `self` stays
    /// where it is).
    pub(crate) fn pointers(&mut self) -> [*mut c_void; MAX_PARAMS] {
        let mut pointers = [std::ptr::null_mut(); MAX_PARAMS];
        for (pointer, slot) in pointers.iter_mut().zip(&mut self.slots[..self.len]) {
            *pointer = (slot as *mut u64).cast();
        }
        pointers
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// One kernel's graph: its template (whose node the shape and arguments are set through) and
/// the executable graph the launches replay, with the shape and arguments it holds now.
struct Replay {
    held: Held,
    graph: CUgraph,
    node: CUgraphNode,
    exec: CUgraphExec,
}

/// What a cached graph holds, as [`pick`] compares it: the kernel (its raw handle), its shape
/// and arguments, and when it was last launched.
#[derive(Debug, Clone, Copy)]
struct Held {
    function: sys::CUfunction,
    config: LaunchConfig,
    params: Params,
    last_used: u64,
}

/// How a launch gets its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// This one holds the launch's shape and arguments.
    Replay(usize),
    /// None does, and the kernel has room for one more graph.
    Add,
    /// None does, and this one, the kernel's least recently used, is set to them.
    Set(usize),
}

/// How a launch of `function` with `config` and `params` gets its graph among `replays`.
fn pick(replays: &[Replay], function: sys::CUfunction, config: LaunchConfig, params: &Params) -> Pick {
    let of_kernel = || replays.iter().map(|r| &r.held).enumerate().filter(|(_, h)| h.function == function);
    if let Some((index, _)) = of_kernel().find(|(_, h)| h.config == config && h.params == *params) {
        return Pick::Replay(index);
    }
    match of_kernel().min_by_key(|(_, h)| h.last_used) {
        Some((index, _)) if of_kernel().count() >= VARIANTS_PER_KERNEL => Pick::Set(index),
        _ => Pick::Add,
    }
}

/// Graphs of the kernels one caller launches, replayed instead of launched (see the module
/// docs). Made for one device; dropping it never blocks (a graph still running is freed by
/// the driver when it completes).
pub struct LaunchCache {
    device: Device,
    replays: Vec<Replay>,
    /// A tick per prepared launch, for `Replay::last_used`.
    uses: u64,
}

// SAFETY: the graph handles are opaque driver handles, usable from any thread; the cache is
// changed only through `&mut self`.
unsafe impl Send for LaunchCache {}
// SAFETY: `&LaunchCache` gives access to nothing.
unsafe impl Sync for LaunchCache {}

impl LaunchCache {
    /// An empty cache for launches on `device`.
    pub fn new(device: &Device) -> LaunchCache {
        LaunchCache { device: device.clone(), replays: Vec::new(), uses: 0 }
    }

    /// How many kernels it keeps a graph for.
    pub fn len(&self) -> usize {
        self.replays.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.replays.is_empty()
    }

    /// Launch `function` on `stream` with `params`, replaying this cache's graph of it. A
    /// stream capturing a graph gets a plain launch (the capture records it as a kernel node).
    ///
    /// # Safety
    /// As [`Function::launch`] for `params`; and the caller's launches through this cache must
    /// be ones the GPU may run one after another in the order they are made: a replay is
    /// ordered after the earlier launches of its graph, on whatever stream they ran (two
    /// kernels that wait for each other must not share a cache).
    pub(crate) unsafe fn launch(
        &mut self,
        function: &Function,
        stream: &Stream,
        config: LaunchConfig,
        mut params: Params,
    ) -> Result<()> {
        if stream.is_capturing()? {
            let (mut pointers, len) = (params.pointers(), params.len());
            // SAFETY: the caller's contract; the pointers point into `params`, alive and
            // unmoved through the call.
            return unsafe { function.launch(stream, config, &mut pointers[..len]) };
        }
        function.check_launch(stream, config)?;
        let index = self.prepare(function, config, params)?;
        let exec = self.replays[index].exec;
        // SAFETY: a live executable graph of this device's context, current (bound by
        // `prepare`), and a live stream of it.
        check(unsafe { sys::cuGraphLaunch(exec, stream.raw()) }, "cuGraphLaunch")
    }

    /// Have this cache's graph of `function` hold `config` and `params` now (made, or set),
    /// so that a launch of them then only binds and replays it (no call that may wait for a
    /// device); its index. Binds the
    /// device: the handles of the default streams (0, legacy, per-thread) name the current
    /// context's, so a replay after it goes to this device's.
    pub(crate) fn prepare(&mut self, function: &Function, config: LaunchConfig, params: Params) -> Result<usize> {
        if function.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "kernel of a launch cache",
                got: function.device().ordinal(),
                expected: self.device.ordinal(),
            });
        }
        self.device.bind()?;
        self.uses += 1;
        let index = match pick(&self.replays, function.raw(), config, &params) {
            Pick::Replay(index) => index,
            Pick::Add => self.add(function, config, params)?,
            Pick::Set(index) => self.set(index, function, config, params)?,
        };
        self.replays[index].held.last_used = self.uses;
        Ok(index)
    }

    /// Set `config` and `params` into the graph at `index` (of `function`); its index after
    /// (a graph the change does not fit is replaced by a new one). The device is bound.
    fn set(&mut self, index: usize, function: &Function, config: LaunchConfig, mut params: Params) -> Result<usize> {
        // SAFETY: the node is the kernel node of the graph the executable came from, of the
        // same function, in the context bound by the caller; the arguments are only copied
        // (the launches are the caller's contract).
        match unsafe { set_node(&self.replays[index], config, &mut params) } {
            Ok(()) => {
                let held = &mut self.replays[index].held;
                (held.config, held.params) = (config, params);
                Ok(index)
            }
            // A change the executable graph does not take: one made for it instead.
            Err(Error::Driver { code, .. }) if code == CUresult::CUDA_ERROR_INVALID_VALUE as u32 => {
                destroy(self.replays.swap_remove(index));
                self.add(function, config, params)
            }
            Err(e) => Err(e),
        }
    }

    /// Make a graph of `function` with `params`, making room first; its index. The device is
    /// bound.
    fn add(&mut self, function: &Function, config: LaunchConfig, mut params: Params) -> Result<usize> {
        if self.replays.len() >= CACHED_GRAPHS
            && let Some(oldest) = self.replays.iter().enumerate().min_by_key(|(_, r)| r.held.last_used).map(|(i, _)| i)
        {
            destroy(self.replays.swap_remove(oldest));
        }
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut graph, 0) }, "cuGraphCreate")?;
        let held = Held { function: function.raw(), config, params, last_used: self.uses };
        let mut replay = Replay { held, graph, node: std::ptr::null_mut(), exec: std::ptr::null_mut() };
        let mut pointers = params.pointers();
        let node_params = kernel_node(held.function, config, &mut pointers);
        // SAFETY: a live graph, no dependencies, and node parameters whose argument pointers
        // point into `params`, which the driver copies during the call.
        let added = check(
            unsafe { sys::cuGraphAddKernelNode_v2(&mut replay.node, graph, std::ptr::null(), 0, &node_params) },
            "cuGraphAddKernelNode",
        );
        let made = added.and_then(|()| {
            // SAFETY: a live graph of the current context; out-pointer into `replay`.
            let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut replay.exec, graph, 0) };
            check(code, "cuGraphInstantiate")
        });
        if let Err(e) = made {
            destroy(replay);
            return Err(e);
        }
        self.replays.push(replay);
        Ok(self.replays.len() - 1)
    }
}

impl Drop for LaunchCache {
    fn drop(&mut self) {
        for replay in self.replays.drain(..) {
            destroy(replay);
        }
    }
}

impl std::fmt::Debug for LaunchCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LaunchCache(device {}, {} graphs)", self.device.ordinal(), self.replays.len())
    }
}

/// A kernel node's parameters: `function` in the shape `config`, with the argument pointers
/// `pointers`.
fn kernel_node(
    function: sys::CUfunction,
    config: LaunchConfig,
    pointers: &mut [*mut c_void; MAX_PARAMS],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: function,
        gridDimX: config.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: config.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: config.shared_bytes,
        kernelParams: pointers.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Set the shape `config` and the arguments `params` into `replay`'s executable graph, for its
/// later launches (the launches already made keep theirs).
///
/// # Safety
/// `replay` holds a live executable graph and its template's kernel node; its context is
/// current.
unsafe fn set_node(replay: &Replay, config: LaunchConfig, params: &mut Params) -> Result<()> {
    let mut pointers = params.pointers();
    let node_params = kernel_node(replay.held.function, config, &mut pointers);
    // SAFETY: the caller's contract; the argument pointers point into `params`, which the
    // driver copies during the call.
    check(
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(replay.exec, replay.node, &node_params) },
        "cuGraphExecKernelNodeSetParams",
    )
}

/// Free a graph and its executable. Never blocks: an executable graph still running is freed
/// by the driver once it completes.
fn destroy(replay: Replay) {
    if !replay.exec.is_null() {
        // SAFETY: a live executable graph, destroyed once.
        defer_error(check(unsafe { sys::cuGraphExecDestroy(replay.exec) }, "cuGraphExecDestroy"));
    }
    // SAFETY: a live graph, destroyed once, after its executable.
    defer_error(check(unsafe { sys::cuGraphDestroy(replay.graph) }, "cuGraphDestroy"));
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: LaunchConfig = LaunchConfig { grid: 1, block: 32, shared_bytes: 0 };

    /// A graph (no driver objects: `pick` reads only what it holds) of the kernel numbered
    /// `function`, holding `address`, last used at `last_used`.
    fn held(function: usize, address: u64, last_used: u64) -> Replay {
        let held = Held {
            function: function as sys::CUfunction,
            config: CONFIG,
            params: Params::default().u64(address),
            last_used,
        };
        Replay { held, graph: std::ptr::null_mut(), node: std::ptr::null_mut(), exec: std::ptr::null_mut() }
    }

    fn picked(replays: &[Replay], function: usize, address: u64) -> Pick {
        pick(replays, function as sys::CUfunction, CONFIG, &Params::default().u64(address))
    }

    #[test]
    fn a_launch_replays_the_graph_holding_its_arguments_whichever_of_the_kernels_it_is() {
        let replays = [held(1, 0x100, 5), held(1, 0x200, 9), held(2, 0x300, 1)];
        assert_eq!(picked(&replays, 1, 0x100), Pick::Replay(0));
        assert_eq!(picked(&replays, 1, 0x200), Pick::Replay(1));
        assert_eq!(picked(&replays, 2, 0x300), Pick::Replay(2));
        // The same arguments held by another kernel's graph are not this kernel's.
        assert_eq!(picked(&replays, 2, 0x100), Pick::Add);
        // Another shape is another launch.
        let wider = LaunchConfig { grid: 2, ..CONFIG };
        assert_eq!(pick(&replays, 1 as sys::CUfunction, wider, &Params::default().u64(0x100)), Pick::Add);
    }

    #[test]
    fn new_arguments_get_a_graph_of_their_own_until_the_kernel_has_its_share_then_its_oldest_is_set() {
        let mut replays: Vec<Replay> =
            (0..VARIANTS_PER_KERNEL as u64 - 1).map(|i| held(7, 0x1000 * (i + 1), 10 + i)).collect();
        // Another kernel's graph, older than any of kernel 7's: never the one set for it.
        replays.push(held(8, 0x5000, 0));
        assert_eq!(picked(&replays, 7, 0xdead), Pick::Add);
        replays.push(held(7, 0xbeef, 3)); // kernel 7's fourth, and now its oldest
        assert_eq!(picked(&replays, 7, 0xdead), Pick::Set(replays.len() - 1));
        assert_eq!(picked(&replays, 7, 0x1000), Pick::Replay(0));
    }

    #[test]
    fn params_keep_each_argument_in_its_own_slot_and_compare_by_value() {
        let mut a = Params::default().u64(0x1234_5678_9abc_def0).u32(7);
        assert_eq!(a.len(), 2);
        let pointers = a.pointers();
        // SAFETY: the pointers point into `a`, alive; the second slot holds a u32 in its
        // first bytes, as the driver reads a 32-bit parameter.
        unsafe {
            assert_eq!(*pointers[0].cast::<u64>(), 0x1234_5678_9abc_def0);
            assert_eq!(*pointers[1].cast::<u32>(), 7);
        }
        assert!(pointers[2].is_null());
        assert_eq!(a, Params::default().u64(0x1234_5678_9abc_def0).u32(7));
        assert_ne!(a, Params::default().u64(0x1234_5678_9abc_def0).u32(8));
    }
}
