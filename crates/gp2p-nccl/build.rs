//! Names the shared object `libnccl.so.2` inside (its SONAME), as NVIDIA's library is named:
//! preloaded, it then also satisfies every later `NEEDED libnccl.so.2`, so the real library
//! is loaded only where the door hands a communicator over (by path, see `src/real.rs`).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
