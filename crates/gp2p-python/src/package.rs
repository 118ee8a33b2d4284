//! Which Python package this copy of the native module belongs to, so that it imports its
//! own Python half and never another copy's.
//!
//! Installed with pip the package is `geforce_p2p`; loaded through Hugging Face `kernels` it
//! is the build's unique id (`metadata.json`'s `id`, under which `kernels` registers it in
//! `sys.modules`), and both copies may live in one process. Each copy is its own shared
//! library with its own statics, so remembering the name once, at module initialisation,
//! keeps them apart.

use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::PyModule;

/// The package name a plain `import _native` (no parent package) falls back to.
const DEFAULT_PACKAGE: &str = "geforce_p2p";

static PACKAGE: OnceLock<String> = OnceLock::new();

/// Note the package from the native module's full name (`<package>._native`), as CPython
/// hands it to the module's initialisation. Only the first call counts.
pub(crate) fn remember(module_name: &str) {
    PACKAGE.get_or_init(|| package_of(module_name).to_owned());
}

/// The package of module `module_name`: everything before its last dot.
fn package_of(module_name: &str) -> &str {
    match module_name.rsplit_once('.') {
        Some((package, _)) if !package.is_empty() => package,
        _ => DEFAULT_PACKAGE,
    }
}

/// The package this copy belongs to.
pub(crate) fn name() -> &'static str {
    PACKAGE.get().map_or(DEFAULT_PACKAGE, String::as_str)
}

/// Import this package's submodule `module` (`_errors`, `_tensors`).
pub(crate) fn import<'py>(py: Python<'py>, module: &str) -> PyResult<Bound<'py, PyModule>> {
    py.import(format!("{}.{module}", name()))
}

#[cfg(test)]
mod tests {
    use super::package_of;

    #[test]
    fn the_package_is_the_name_before_the_last_dot() {
        assert_eq!(package_of("geforce_p2p._native"), "geforce_p2p");
        assert_eq!(package_of("_geforce_p2p_cuda_0d3275b_1a2b3c4d._native"), "_geforce_p2p_cuda_0d3275b_1a2b3c4d");
        assert_eq!(package_of("a.b._native"), "a.b");
        assert_eq!(package_of("_native"), "geforce_p2p");
        assert_eq!(package_of("._native"), "geforce_p2p");
    }
}
