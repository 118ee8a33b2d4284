//! The Python package's tidy check, as `tidy` checks the crates: no modules of
//! `geforce_p2p` import each other in a circle.
//!
//! The graph: a module per `.py` file of the package folder; an edge from a module to each
//! module of the package it imports, at the top or inside a function (an import a function
//! runs later is still a dependency: the two cannot be read apart). `from . import a, b`
//! names modules `a` and `b` where they are files of the package, else names of the package
//! root (an edge to `__init__`); `from .a import x` and `import geforce_p2p.a` name `a`. The
//! compiled extension (`_native`, pyproject.toml's `module-name`) is no file here and a leaf.
//! The package root imports every module, so a module that imports a name from the root is
//! in a circle with it, as it should be: the root's names are for users.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The package's folder, from the workspace root.
const PACKAGE: &str = "crates/gp2p-python/python/geforce_p2p";
/// The package's name, for absolute imports.
const NAME: &str = "geforce_p2p";
/// Modules of the package that are not Python files here (maturin builds them).
const COMPILED: &[&str] = &["_native"];

/// The modules `source` (module `of`'s text) imports among `modules`.
fn imports(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut name = |n: &str, root_if_not_module: bool| {
        let n = n.trim();
        if modules.contains(n) {
            found.insert(n.to_string());
        } else if root_if_not_module && !COMPILED.contains(&n) && !n.is_empty() {
            found.insert("__init__".to_string());
        }
    };
    // Joined continuation lines, so `from . import (a,\n b)` reads as one statement; what
    // lies in triple-quoted strings (docstrings and their examples) is not code.
    let mut statements = Vec::new();
    let mut open = String::new();
    for line in without_triple_quoted(source).lines() {
        let code = line.split('#').next().unwrap_or("");
        if open.is_empty() {
            open = code.trim().to_string();
        } else {
            open.push(' ');
            open.push_str(code.trim());
        }
        if open.matches('(').count() <= open.matches(')').count() && !open.ends_with('\\') {
            statements.push(std::mem::take(&mut open));
        }
    }
    for statement in statements {
        let s = statement.replace(['(', ')', '\\'], " ");
        if let Some(rest) = s.strip_prefix("from ") {
            let Some((from, what)) = rest.split_once(" import ") else { continue };
            let from = from.trim();
            let package_relative = if from == "." || from == NAME {
                None
            } else if let Some(m) = from.strip_prefix('.').or_else(|| from.strip_prefix(&format!("{NAME}."))) {
                Some(m.split('.').next().unwrap_or(m).to_string())
            } else {
                continue;
            };
            match package_relative {
                Some(module) => name(&module, false),
                None => {
                    for item in what.split(',') {
                        name(item.split(" as ").next().unwrap_or(item), true);
                    }
                }
            }
        } else if let Some(rest) = s.strip_prefix("import ") {
            for item in rest.split(',') {
                let item = item.split(" as ").next().unwrap_or(item).trim();
                if let Some(m) = item.strip_prefix(&format!("{NAME}.")) {
                    name(m.split('.').next().unwrap_or(m), false);
                }
            }
        }
    }
    found
}

/// `source` with the insides of its triple-quoted strings (`"""` or `\'\'\'`) blanked.
fn without_triple_quoted(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    loop {
        let next = ["\"\"\"", "'''"].iter().filter_map(|q| rest.find(q).map(|i| (i, *q))).min();
        let Some((start, quote)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..start]);
        let inside = &rest[start + 3..];
        let Some(end) = inside.find(quote) else { return out };
        // Keep the line breaks, so statements stay apart.
        out.extend(inside[..end].chars().filter(|&c| c == '\n'));
        rest = &inside[end + 3..];
    }
}

/// The private names (a leading underscore) `source` takes from other modules of the package:
/// `from .m import _x`, `from . import _x` where `_x` is no module, and `m._x` where `m` is a
/// module of the package. A name private to a module is its own; what others use, it names
/// without the underscore.
fn private_names(source: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let code = without_triple_quoted(source);
    let mut found = Vec::new();
    for line in code.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let words: Vec<&str> = line.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).collect();
        if let Some(rest) = line.strip_prefix("from .") {
            let Some((from, what)) = rest.split_once(" import ") else { continue };
            for item in what.replace(['(', ')'], " ").split(',') {
                let item = item.split(" as ").next().unwrap_or(item).trim();
                let is_module = from.trim().is_empty() && (modules.contains(item) || COMPILED.contains(&item));
                if item.starts_with('_') && !item.starts_with("__") && !is_module {
                    found.push(format!("from .{} import {item}", from.trim()));
                }
            }
        }
        for word in words {
            if let Some((module, name)) = word.split_once('.')
                && modules.contains(module)
                && name.starts_with('_')
                && !name.starts_with("__")
            {
                found.push(word.to_string());
            }
        }
    }
    found
}

/// The package's import graph, module by module, read from `package`.
fn graph(package: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let read = |p: &Path| fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(package).map_err(|e| format!("listing {}: {e}", package.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|e| e == "py") {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            files.insert(stem, read(&path)?);
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    Ok(files.iter().map(|(m, text)| (m.clone(), imports(text, &modules))).collect())
}

/// Every circle of `graph`: its strongly connected sets of more than one module, and modules
/// that import themselves.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability by search from each module: the package has a few tens of modules.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = graph.get(from).into_iter().flatten().collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m.clone()) {
                todo.extend(graph.get(m).into_iter().flatten());
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for m in graph.keys() {
        let mut set: Vec<String> =
            graph.keys().filter(|o| (*o == m || reached[m].contains(*o)) && reached[*o].contains(m)).cloned().collect();
        set.sort();
        if !set.is_empty() && !found.contains(&set) {
            found.push(set);
        }
    }
    found
}

#[test]
fn the_python_package_has_no_circle_of_imports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let graph = graph(&root.join(PACKAGE)).expect("reading the package");
    assert!(graph.contains_key("_compile") && graph.contains_key("__init__"), "the package was read: {graph:?}");
    assert!(graph["__init__"].contains("_compile"), "the root's imports are found: {:?}", graph["__init__"]);
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "{PACKAGE}: modules importing each other in a circle (also inside functions): {found:?}; \
         pass what one needs as an argument or a hook set from the package root, or move the shared part \
         into a module both import"
    );
}

#[test]
fn no_module_of_the_python_package_takes_another_s_private_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PACKAGE);
    let graph = graph(&root).expect("reading the package");
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    let mut found = Vec::new();
    for module in &modules {
        let text = fs::read_to_string(root.join(format!("{module}.py"))).expect("reading a module");
        found.extend(private_names(&text, &modules).into_iter().map(|n| format!("{module}.py: {n}")));
    }
    assert!(found.is_empty(), "{PACKAGE}: private names used across modules: {found:?}; drop the underscore");
    let sample = "from ._api import REDUCE_OPS, _copy\nfrom . import _native, _compile\nfrom ._native import __version__\nx = _api._target(1)\n\
                  y = _compile.ops\nz = self._api._x\n";
    let mods: BTreeSet<String> = ["_api", "_compile"].map(String::from).into();
    assert_eq!(private_names(sample, &mods), ["from ._api import _copy", "_api._target"]);
}

#[test]
fn the_import_reader_finds_every_form_and_the_circles_they_make() {
    let modules: BTreeSet<String> = ["__init__", "a", "b", "c", "d", "e"].map(String::from).into();
    let text = "\"\"\"Doc:\n    import geforce_p2p.e\n\"\"\"\nfrom . import a, b as bee\nimport os\ndef f():\n\
                \x20   from .c import x\n    import geforce_p2p.d\nfrom . import _native\nfrom typing import (Any,\n  \
                Optional)\nfrom . import (\n  a,\n  Thing)\n";
    let found = imports(text, &modules);
    assert_eq!(
        found,
        ["__init__", "a", "b", "c", "d"].map(String::from).into(),
        "Thing is a root name, e only in a docstring"
    );
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    g.insert("d".into(), ["a".to_string()].into());
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    g.insert("c".into(), BTreeSet::new());
    assert!(circles(&g).is_empty(), "a chain is no circle");
}
