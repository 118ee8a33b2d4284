//! Kernel launches replayed from CUDA graphs: for callers that launch the same few kernels
//! over and over, in an order the GPU keeps anyway.
//!
//! Why: on the H200 machines this library is measured on, the host pays 4-5 us for a
//! `cuLaunchKernel` and about 2 us for a `cuGraphLaunch`, whatever the graph holds
//! (`benches/probes/driver_call_costs.py`; in the driver-call traces of
//! `benches/probes/trace_calls.py` the launch was 3.9 us of the communicator's 7 us call). A
//! [`LaunchCache`] keeps one single-node graph per kernel; a launch with the shape and
//! arguments of the kernel's last one replays it, other ones are set into it first
//! (`cuGraphExecKernelNodeSetParams`, which affects only later launches).
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

/// Kernels a cache keeps a graph for; the least recently used goes first.
const CACHED_GRAPHS: usize = 16;

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
    function: sys::CUfunction,
    config: LaunchConfig,
    params: Params,
    graph: CUgraph,
    node: CUgraphNode,
    exec: CUgraphExec,
    last_used: u64,
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
    pub(crate) fn prepare(&mut self, function: &Function, config: LaunchConfig, mut params: Params) -> Result<usize> {
        if function.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "kernel of a launch cache",
                got: function.device().ordinal(),
                expected: self.device.ordinal(),
            });
        }
        self.device.bind()?;
        self.uses += 1;
        let index = match self.replays.iter().position(|r| r.function == function.raw()) {
            Some(index) if self.replays[index].config == config && self.replays[index].params == params => index,
            Some(index) => {
                // SAFETY: the node is the kernel node of the graph the executable came from,
                // of the same function, in the context bound above; the arguments are only
                // copied (the launches are the caller's contract).
                match unsafe { set_node(&self.replays[index], config, &mut params) } {
                    Ok(()) => {
                        let replay = &mut self.replays[index];
                        (replay.config, replay.params) = (config, params);
                        index
                    }
                    // A change the executable graph does not take: one made for it instead.
                    Err(Error::Driver { code, .. }) if code == CUresult::CUDA_ERROR_INVALID_VALUE as u32 => {
                        destroy(self.replays.swap_remove(index));
                        self.add(function, config, params)?
                    }
                    Err(e) => return Err(e),
                }
            }
            None => self.add(function, config, params)?,
        };
        self.replays[index].last_used = self.uses;
        Ok(index)
    }

    /// Make a graph of `function` with `params`, making room first; its index. The device is
    /// bound.
    fn add(&mut self, function: &Function, config: LaunchConfig, mut params: Params) -> Result<usize> {
        if self.replays.len() >= CACHED_GRAPHS
            && let Some(oldest) = self.replays.iter().enumerate().min_by_key(|(_, r)| r.last_used).map(|(i, _)| i)
        {
            destroy(self.replays.swap_remove(oldest));
        }
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut graph, 0) }, "cuGraphCreate")?;
        let mut replay = Replay {
            function: function.raw(),
            config,
            params,
            graph,
            node: std::ptr::null_mut(),
            exec: std::ptr::null_mut(),
            last_used: self.uses,
        };
        let mut pointers = params.pointers();
        let node_params = kernel_node(replay.function, config, &mut pointers);
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
    let node_params = kernel_node(replay.function, config, &mut pointers);
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
