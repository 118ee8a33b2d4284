//! Tidy checks kept as ordinary tests, as rust-analyzer keeps its own: no crate of the
//! workspace has modules that import each other in a circle.
//!
//! Inside a crate, layers matter as much as between crates (`raw`, the door to the driver,
//! imports nothing above it). A circle of modules means none of them can be read, or
//! changed, without the others; it comes back one convenient `use` at a time, so a test
//! catches it the moment it does.
//!
//! The graph of one crate: its modules, found by following `mod` declarations from the crate
//! root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`), inline `mod x { … }` included; an edge
//! from a module to each module a path in it names: `crate::a::…`, `super::…`, `self::…`, and
//! a path that starts with one of the module's own children (a `use` tree is expanded first).
//! What is not an edge: a `mod x;` declaration (parents declare children), a path that names
//! an item of the crate root (`use crate::{Device, Error}`: the root is the crate's public
//! face, declaring every module and re-exporting their items, so every module reaches it; the
//! re-exports are not followed to the module that defines the item), `$crate` in macros, and
//! anything in comments, strings and `pub(in …)`.
//!
//! A circle is a strongly connected set of modules with at least one edge between two modules
//! neither of which contains the other. A parent and its own children may use each other, as
//! every module uses the crate root: the parent declares them, re-exports and dispatches to
//! them, and they use what it keeps for all of them. A circle that leaves the folder (a child
//! using a sibling of its parent that uses the parent) is still one.
//!
//! The lexer is small and knows Rust only as far as paths need: it is a tidy check, not a
//! compiler, and its own unit tests below feed it circles it must find.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module of one crate, by its path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// One module as read from its source: where it is declared, its children and the paths it names.
#[derive(Debug, Default)]
struct Module {
    /// The file it lives in (an inline module lives in its parent's file).
    file: PathBuf,
    children: BTreeSet<String>,
    /// Paths named in the module, each as written: its first segment may be `crate`, `super`,
    /// `self` or a name.
    paths: Vec<Vec<String>>,
}

/// One crate's modules, read from `root` (a `lib.rs`, `main.rs` or `src/bin/*.rs`) through
/// `read`, which returns a file's text or `None` where there is no such file.
fn read_crate(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Result<BTreeMap<ModPath, Module>, String> {
    let mut modules = BTreeMap::new();
    // (module path, its file, the folder its `mod x;` children's files are in)
    let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut pending = vec![(Vec::new(), root.to_path_buf(), dir)];
    while let Some((path, file, child_dir)) = pending.pop() {
        let text = read(&file).ok_or_else(|| format!("cannot read {}", file.display()))?;
        let tokens = lex(&text);
        for (module, declared) in parse_module_file(&tokens, &path) {
            let here =
                modules.entry(module.clone()).or_insert_with(|| Module { file: file.clone(), ..Module::default() });
            here.children.extend(declared.inline.iter().cloned());
            here.children.extend(declared.external.iter().cloned());
            here.paths.extend(declared.paths);
            // `mod x;` inside the file's module, or inside an inline module of it: the file is
            // under the folder of that module.
            let inline_dir = module[path.len()..].iter().fold(child_dir.clone(), |d, m| d.join(m));
            for child in declared.external {
                let flat = inline_dir.join(format!("{child}.rs"));
                let nested = inline_dir.join(&child).join("mod.rs");
                let (child_file, grandchild_dir) = if read(&flat).is_some() {
                    (flat, inline_dir.join(&child))
                } else if read(&nested).is_some() {
                    (nested, inline_dir.join(&child))
                } else {
                    return Err(format!(
                        "{}: `mod {child};` has no file ({} or {})",
                        file.display(),
                        flat.display(),
                        nested.display()
                    ));
                };
                let mut child_path = module.clone();
                child_path.push(child);
                pending.push((child_path, child_file, grandchild_dir));
            }
        }
    }
    Ok(modules)
}

/// Edges of the module graph: for each module, the modules its paths name (itself and the
/// crate root left out).
fn edges(modules: &BTreeMap<ModPath, Module>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut out = BTreeMap::new();
    for (from, module) in modules {
        let targets: BTreeSet<ModPath> = module
            .paths
            .iter()
            .filter_map(|p| absolute(from, p, modules))
            .filter_map(|p| longest_module_prefix(&p, modules))
            .filter(|to| to != from && !to.is_empty())
            .collect();
        out.insert(from.clone(), targets);
    }
    out
}

/// The path `path`, written in module `from`, from the crate root; `None` for a path that
/// does not start in this crate (`std::…`, a local type's `Foo::new`).
fn absolute(from: &ModPath, path: &[String], modules: &BTreeMap<ModPath, Module>) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut base = from.clone();
            base.pop()?;
            base
        }
        name if modules.get(from).is_some_and(|m| m.children.contains(name)) => {
            let mut base = from.clone();
            base.push(name.to_owned());
            base
        }
        _ => return None,
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
        base.pop()?;
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The deepest module of `modules` that `path` starts with (the root at least).
fn longest_module_prefix(path: &[String], modules: &BTreeMap<ModPath, Module>) -> Option<ModPath> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains_key(p))
}

/// Strongly connected components of more than one module (Tarjan's algorithm), each sorted,
/// the list sorted too.
fn circles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct State<'g> {
        graph: &'g BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'g ModPath, usize>,
        low: BTreeMap<&'g ModPath, usize>,
        stack: Vec<&'g ModPath>,
        on_stack: BTreeSet<&'g ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g ModPath) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            // An edge to a module the graph does not list (no file was read for it) leads nowhere.
            let Some((w, _)) = s.graph.get_key_value(w) else { continue };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found.sort();
    s.found
}

/// Whether `a` contains `b` or `b` contains `a` (a module contains itself).
fn nested(a: &ModPath, b: &ModPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The circles of `graph` (see the module's doc): its strongly connected sets with an edge
/// between two modules that do not contain one another.
fn tangles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    circles(graph)
        .into_iter()
        .filter(|set| set.iter().any(|from| graph[from].iter().any(|to| set.contains(to) && !nested(from, to))))
        .collect()
}

/// What is wrong with one crate, `root` naming it: each circle with the edges inside it.
fn describe_circles(root: &Path, modules: &BTreeMap<ModPath, Module>) -> Vec<String> {
    let graph = edges(modules);
    tangles(&graph)
        .into_iter()
        .map(|circle| {
            let names: Vec<String> = circle.iter().map(name).collect();
            let inner: Vec<String> = circle
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| circle.contains(to))
                        .map(move |to| format!("    {} -> {} ({})", name(from), name(to), modules[from].file.display()))
                })
                .collect();
            format!(
                "{}: modules import each other in a circle: {}\n{}",
                root.display(),
                names.join(", "),
                inner.join("\n")
            )
        })
        .collect()
}

fn name(module: &ModPath) -> String {
    if module.is_empty() { "crate".into() } else { module.join("::") }
}

// ---------------------------------------------------------------------------------------
// Reading the source: tokens, then the modules and paths of one file.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation, one character (`{`, `}`, `;`, `,`, `*`, `$`, `(`, `)`, `<`, …).
    Punct(char),
}

/// The identifiers and punctuation of `text`, with comments, string, char and number
/// literals and lifetimes dropped.
fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            i = end;
        } else if c == '"' || ((c == 'b' || c == 'c') && at(i + 1) == '"') {
            i += if c == '"' { 1 } else { 2 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            // A char literal ('x', '\n', '\'', '\u{1F600}', b'x'), else a lifetime or label ('a).
            let start = if c == 'b' { i + 1 } else { i };
            if at(start + 1) == '\\' {
                // Past the backslash and the character it escapes, to the closing quote.
                i = start + 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(start + 2) == '\'' {
                i = start + 3;
            } else {
                i = start + 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                // `1..n`: a range, not a number's fraction.
                if chars[i] == '.' && at(i + 1) == '.' {
                    break;
                }
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A raw identifier, `r#type`.
            if word == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_') {
                i += 1;
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                tokens.push(Token::Ident(chars[start..i].iter().collect()));
            } else {
                tokens.push(Token::Ident(word));
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token::PathSep);
            i += 2;
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// Where a raw string literal starting at `i` (`r"…"`, `r#"…"#`, `br"…"`, `cr#"…"#`) ends, if
/// one does start there.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    // Not the tail of an identifier such as `bar"`: a raw string starts a token.
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    j += hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && chars[j + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// What one module of a file declares and names.
#[derive(Debug, Default)]
struct Declared {
    inline: Vec<String>,
    external: Vec<String>,
    paths: Vec<Vec<String>>,
}

/// The modules of one file (the file's own, `path`, and its inline modules), each with what it
/// declares and the paths it names.
fn parse_module_file(tokens: &[Token], path: &ModPath) -> BTreeMap<ModPath, Declared> {
    let mut out: BTreeMap<ModPath, Declared> = BTreeMap::new();
    out.insert(path.clone(), Declared::default());
    // The module each open brace belongs to: an inline module's own brace, or a block in the
    // current module.
    let mut scopes: Vec<ModPath> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let current = scopes.last().unwrap_or(path).clone();
        let ident = |j: usize| match tokens.get(j) {
            Some(Token::Ident(s)) => Some(s.as_str()),
            _ => None,
        };
        match &tokens[i] {
            Token::Ident(word) if word == "mod" && ident(i + 1).is_some() => {
                let name = ident(i + 1).unwrap_or_default().to_owned();
                match tokens.get(i + 2) {
                    Some(Token::Punct(';')) => {
                        out.entry(current.clone()).or_default().external.push(name);
                        i += 3;
                    }
                    Some(Token::Punct('{')) => {
                        out.entry(current.clone()).or_default().inline.push(name.clone());
                        let mut inner = current.clone();
                        inner.push(name);
                        out.entry(inner.clone()).or_default();
                        scopes.push(inner);
                        i += 3;
                    }
                    _ => i += 1,
                }
            }
            Token::Ident(word) if word == "use" => {
                let (paths, next) = parse_use(tokens, i + 1);
                out.entry(current.clone()).or_default().paths.extend(paths);
                i = next;
            }
            // `pub(in crate::a)` names where an item is visible, not what the module uses.
            Token::Ident(word) if word == "pub" && tokens.get(i + 1) == Some(&Token::Punct('(')) => {
                i += 2;
                while i < tokens.len() && tokens[i] != Token::Punct(')') {
                    i += 1;
                }
                i += 1;
            }
            // `$crate::…` in a macro: the crate of the macro's definition, used wherever it expands.
            Token::Punct('$') => {
                i += 1;
                while matches!(tokens.get(i), Some(Token::Ident(_) | Token::PathSep)) {
                    i += 1;
                }
            }
            Token::Ident(_) => {
                let (segments, next) = path_segments(tokens, i);
                // Only a path (`a::b`), or a lone `crate`/`super`/`self` item path, is a reference.
                if segments.len() > 1 {
                    out.entry(current.clone()).or_default().paths.push(segments);
                }
                i = next;
            }
            Token::Punct('{') => {
                scopes.push(current);
                i += 1;
            }
            Token::Punct('}') => {
                scopes.pop();
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The identifiers of the path that starts at `tokens[i]`, `a::b::c`, and the index after it.
fn path_segments(tokens: &[Token], mut i: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    while let Some(Token::Ident(s)) = tokens.get(i) {
        segments.push(s.clone());
        i += 1;
        if tokens.get(i) == Some(&Token::PathSep) && matches!(tokens.get(i + 1), Some(Token::Ident(_))) {
            i += 1;
        } else {
            break;
        }
    }
    (segments, i)
}

/// The paths of the `use` tree starting at `tokens[i]` (just after `use`), expanded
/// (`crate::{a::X, b}` gives `crate::a::X` and `crate::b`), and the index after its `;`.
fn parse_use(tokens: &[Token], i: usize) -> (Vec<Vec<String>>, usize) {
    let mut paths = Vec::new();
    let mut i = i;
    // A leading `::` names an extern crate.
    if tokens.get(i) == Some(&Token::PathSep) {
        while i < tokens.len() && tokens[i] != Token::Punct(';') {
            i += 1;
        }
        return (paths, i + 1);
    }
    use_tree(tokens, &mut i, &[], &mut paths);
    while i < tokens.len() && tokens[i] != Token::Punct(';') {
        i += 1;
    }
    (paths, i + 1)
}

/// One use tree at `tokens[*i]` under `prefix`: `a::b`, `a::{…}`, `a::*`, `a as b`, `self`.
fn use_tree(tokens: &[Token], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*i) {
            // `{a, self}`: `self` is the prefix itself.
            Some(Token::Ident(s)) if s == "self" && !path.is_empty() => *i += 1,
            Some(Token::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Token::Punct('*')) => {
                *i += 1;
                break;
            }
            Some(Token::Punct('{')) => {
                *i += 1;
                while !matches!(tokens.get(*i), None | Some(Token::Punct('}'))) {
                    let before = *i;
                    use_tree(tokens, i, &path, out);
                    if tokens.get(*i) == Some(&Token::Punct(',')) || *i == before {
                        // Past the comma, or past a token no tree starts with.
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            _ => break,
        }
        if tokens.get(*i) == Some(&Token::PathSep) {
            *i += 1;
        } else {
            break;
        }
    }
    // `a::b as c`
    if matches!(tokens.get(*i), Some(Token::Ident(s)) if s == "as") {
        *i += 2;
    }
    if !path.is_empty() {
        out.push(path);
    }
}

// ---------------------------------------------------------------------------------------
// The workspace.

/// Every crate root of the workspace's members: `src/lib.rs`, `src/main.rs`, `src/bin/*.rs`
/// and `src/bin/*/main.rs`.
fn workspace_crate_roots(workspace: &Path) -> Result<Vec<PathBuf>, String> {
    let manifest = workspace.join("Cargo.toml");
    let text = fs::read_to_string(&manifest).map_err(|e| format!("reading {}: {e}", manifest.display()))?;
    let mut roots = Vec::new();
    for member in workspace_members(&text) {
        let dirs: Vec<PathBuf> = match member.strip_suffix("/*") {
            Some(parent) => {
                let parent = workspace.join(parent);
                let mut dirs: Vec<PathBuf> = fs::read_dir(&parent)
                    .map_err(|e| format!("listing {}: {e}", parent.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.join("Cargo.toml").is_file())
                    .collect();
                dirs.sort();
                dirs
            }
            None => vec![workspace.join(member)],
        };
        for dir in dirs {
            let src = dir.join("src");
            for root in [src.join("lib.rs"), src.join("main.rs")] {
                if root.is_file() {
                    roots.push(root);
                }
            }
            if let Ok(bins) = fs::read_dir(src.join("bin")) {
                let mut bins: Vec<PathBuf> = bins
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .map(|p| if p.is_dir() { p.join("main.rs") } else { p })
                    .filter(|p| p.extension().is_some_and(|x| x == "rs") && p.is_file())
                    .collect();
                bins.sort();
                roots.extend(bins);
            }
        }
    }
    Ok(roots)
}

/// The `members = [...]` of a workspace manifest.
fn workspace_members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else { return Vec::new() };
    let list = &manifest[start..];
    let (Some(open), Some(close)) = (list.find('['), list.find(']')) else { return Vec::new() };
    list[open + 1..close]
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(','))
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn no_crate_has_a_circle_of_modules() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lies in the workspace");
    let roots = workspace_crate_roots(workspace).expect("the workspace's crates");
    // Paths relative to the workspace, so the message names files as a reader sees them.
    let read = |p: &Path| fs::read_to_string(workspace.join(p)).ok();
    let mut problems = Vec::new();
    let mut modules_read = 0;
    for root in &roots {
        let root = root.strip_prefix(workspace).unwrap_or(root);
        let modules = read_crate(root, &read).unwrap_or_else(|e| panic!("{e}"));
        modules_read += modules.len();
        problems.extend(describe_circles(root, &modules));
    }
    // Not vacuous: the crates and modules this workspace is known to hold were all read.
    assert!(roots.len() >= 12, "only {} crate roots found: {roots:?}", roots.len());
    assert!(modules_read >= 100, "only {modules_read} modules read");
    assert!(roots.iter().any(|r| r.ends_with("crates/gp2p-cuda/src/lib.rs")), "gp2p-cuda not among {roots:?}");
    assert!(
        problems.is_empty(),
        "a module of a crate must not import, through others, what imports it:\n{}",
        problems.join("\n")
    );
}

mod tests {
    use super::*;

    /// The circles of the crate `files` (file name, text) make, its root `src/lib.rs`, by name.
    fn circles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let files: BTreeMap<PathBuf, String> =
            files.iter().map(|(p, t)| (Path::new("src").join(p), (*t).to_owned())).collect();
        let read = |p: &Path| files.get(p).cloned();
        let modules = read_crate(Path::new("src/lib.rs"), &read).unwrap();
        tangles(&edges(&modules)).iter().map(|c| c.iter().map(name).collect()).collect()
    }

    #[test]
    fn a_circle_through_three_files_is_found_and_named() {
        let found = circles_of(&[
            ("lib.rs", "mod a; mod b; mod c; mod d;\npub use a::A;"),
            ("a.rs", "use crate::b::B;\npub struct A;"),
            ("b.rs", "use crate::{c::{self, C}, Error};\npub struct B;"),
            ("c.rs", "pub fn f() { super::a::f() }"),
            ("d.rs", "use crate::a::A;"),
        ]);
        assert_eq!(found, [["a", "b", "c"]]);
        let described = describe_circles(
            Path::new("src/lib.rs"),
            &read_crate(Path::new("src/lib.rs"), &|p: &Path| {
                [("src/lib.rs", "mod a; mod b;"), ("src/a.rs", "use crate::b::X;"), ("src/b.rs", "use crate::a::Y;")]
                    .iter()
                    .find(|(f, _)| Path::new(f) == p)
                    .map(|(_, t)| (*t).to_owned())
            })
            .unwrap(),
        );
        assert_eq!(described.len(), 1);
        assert!(described[0].contains("circle: a, b"), "{}", described[0]);
        assert!(described[0].contains("a -> b (src/a.rs)") && described[0].contains("b -> a (src/b.rs)"));
    }

    #[test]
    fn nested_files_inline_modules_and_bare_child_paths_are_followed() {
        // a/mod.rs names its child through a bare path; the child uses its parent's helper:
        // a folder, not a circle.
        let parent_and_child = [
            ("lib.rs", "mod a; mod c;"),
            ("a/mod.rs", "mod b;\nfn f() { b::g() }"),
            ("a/b.rs", "use super::helper;"),
            ("c.rs", ""),
        ];
        assert!(circles_of(&parent_and_child).is_empty());
        // But a child that uses a sibling of its parent that uses the parent closes one.
        let mut leaving = parent_and_child;
        leaving[2] = ("a/b.rs", "use super::helper;\nuse crate::c::C;");
        leaving[3] = ("c.rs", "use crate::a::A;");
        assert_eq!(circles_of(&leaving), [["a", "a::b", "c"]]);
        // Inline modules nest, and `mod x;` inside one is under its folder.
        let found = circles_of(&[
            ("lib.rs", "mod outer { pub mod inner; }\nmod other;"),
            ("outer/inner.rs", "use crate::other::X;"),
            ("other.rs", "use crate::outer::inner::Y;"),
        ]);
        assert_eq!(found, [["other", "outer::inner"]]);
    }

    #[test]
    fn what_is_not_an_import_makes_no_circle() {
        let found = circles_of(&[
            ("lib.rs", "mod a; mod b;\npub use a::A;\npub use b::B;"),
            // The root's items (re-exports), a child declaration, a test module's `super`.
            ("a.rs", "use crate::{B, Error};\npub struct A;\n#[cfg(test)]\nmod tests { use super::*; }"),
            (
                "b.rs",
                r##"//! See [`crate::a::A`].
use crate::A;
/* crate::a::A /* nested */ crate::a::A */
const S: &str = "crate::a::A";
const R: &str = r#"crate::a::A "quoted" "#;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { x }
pub(in crate::a) fn g() {}
macro_rules! m { () => { $crate::a::A } }
pub struct B;"##,
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn use_trees_expand_into_every_path() {
        let tokens = lex("use crate::{a::{self, X as Y}, b::*, c};");
        let (paths, next) = parse_use(&tokens, 1);
        assert_eq!(next, tokens.len());
        let paths: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(paths, ["crate::a", "crate::a::X", "crate::b", "crate::c"]);
    }

    #[test]
    fn workspace_members_are_read_from_the_manifest() {
        let manifest = "[workspace]\nmembers = [\n    \"kernels\", # the kernels\n    \"crates/*\",\n]\n";
        assert_eq!(workspace_members(manifest), ["kernels", "crates/*"]);
    }
}

// ---------------------------------------------------------------------------------------
// docs/architecture.md: every path it names exists.
//
// The page a newcomer reads first names files to read; a path that moved or went away sends
// them nowhere, so a test reads the page and looks each one up. What counts as a path: the
// text of a code span (relative to the workspace root) or a link's target (relative to the
// page's folder) that is made of path characters only (letters, digits, `_ - . / +`) and
// either holds a `/` or ends in one of `PAGE_PATH_EXTENSIONS`. Not a path: a URL, an anchor,
// anything with spaces (a command), an absolute path (`/proc`: the machine's, not the
// repository's), and a pattern (`*`, `<machine>`, `$OUT`, or a first part in capitals such as
// `DIR/run`, a placeholder). A `path:line` is its path; one `{a,b}` group names each
// alternative; fenced code blocks are commands and are left alone.

/// The page the check reads, from the workspace root.
const ARCHITECTURE_PAGE: &str = "docs/architecture.md";

/// Endings that make a code span without a `/` a path (`Cargo.toml`, `README.md`).
const PAGE_PATH_EXTENSIONS: &[&str] =
    &["rs", "py", "cu", "cuh", "md", "sh", "toml", "json", "txt", "ptx", "svg", "log", "lock"];

/// A path a Markdown page names, as written, and how it resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PagePath {
    /// In a code span: from the workspace root.
    Code(String),
    /// A link's target: from the page's folder.
    Link(String),
}

/// Every path `markdown` names, in order (see the section's comment for what counts).
fn page_paths(markdown: &str) -> Vec<PagePath> {
    // Fenced blocks blanked out, so their backticks open no code span.
    let mut fenced = false;
    let prose: String = markdown
        .lines()
        .map(|line| {
            let fence = line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~");
            let keep = !fenced && !fence;
            fenced ^= fence;
            if keep { line } else { "" }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let chars: Vec<char> = prose.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let run = chars[i..].iter().take_while(|&&c| c == '`').count();
            let close = (i + run..chars.len()).find(|&j| {
                chars[j..].iter().take_while(|&&c| c == '`').count() == run && (j == 0 || chars[j - 1] != '`')
            });
            match close {
                Some(j) => {
                    let span: String = chars[i + run..j].iter().collect();
                    out.extend(repository_paths(span.trim()).into_iter().map(PagePath::Code));
                    i = j + run;
                }
                // An unmatched run is literal text.
                None => i += run,
            }
        } else if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
            let start = i + 2;
            let end = (start..chars.len()).find(|&j| chars[j] == ')').unwrap_or(chars.len());
            let target: String = chars[start..end].iter().collect();
            // `(path "title")`: the path is the first word.
            let target = target.split_whitespace().next().unwrap_or("").trim_matches(['<', '>']);
            out.extend(repository_paths(target).into_iter().map(PagePath::Link));
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// The repository paths `token` names (none, one, or one per `{a,b}` alternative).
fn repository_paths(token: &str) -> Vec<String> {
    if token.is_empty() || token.contains(char::is_whitespace) || token.contains("://") || token.starts_with('#') {
        return Vec::new();
    }
    let token = token.split('#').next().unwrap_or(token);
    // `path:12`, `path:12:3`, `path:12-20`.
    let token = match token.split_once(':') {
        Some((path, line)) if !line.is_empty() && line.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-') => {
            path
        }
        _ => token,
    };
    expand_braces(token).into_iter().filter(|p| looks_like_repository_path(p)).collect()
}

/// `a/{b,c}.sh` as `a/b.sh` and `a/c.sh`; anything else as it is.
fn expand_braces(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else { return vec![token.to_owned()] };
    if close < open {
        return vec![token.to_owned()];
    }
    token[open + 1..close].split(',').map(|alt| format!("{}{alt}{}", &token[..open], &token[close + 1..])).collect()
}

/// Whether `p` (one alternative, its line number gone) is a repository path.
fn looks_like_repository_path(p: &str) -> bool {
    let path_chars = p.chars().all(|c| c.is_ascii_alphanumeric() || "_-./+".contains(c));
    let first = p.split('/').next().unwrap_or("");
    let placeholder = first.chars().any(|c| c.is_ascii_uppercase()) && !first.chars().any(|c| c.is_ascii_lowercase());
    let extension =
        Path::new(p).extension().and_then(|e| e.to_str()).is_some_and(|e| PAGE_PATH_EXTENSIONS.contains(&e));
    path_chars
        && !p.starts_with('/')
        && !placeholder
        && !p.trim_matches(['.', '/']).is_empty()
        && (p.contains('/') || extension)
}

/// `path` with its `.` and `..` parts resolved, as written (no file system).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lies in the workspace");
    let page = Path::new(ARCHITECTURE_PAGE);
    let text = fs::read_to_string(workspace.join(page)).unwrap_or_else(|e| panic!("reading {ARCHITECTURE_PAGE}: {e}"));
    let page_dir = page.parent().unwrap_or(Path::new(""));
    let mut checked = BTreeSet::new();
    let mut missing = BTreeSet::new();
    for named in page_paths(&text) {
        let (written, relative) = match &named {
            PagePath::Code(p) => (format!("`{p}`"), lexically_normal(Path::new(p))),
            PagePath::Link(p) => (format!("a link to {p}"), lexically_normal(&page_dir.join(p))),
        };
        if !workspace.join(&relative).exists() {
            missing.insert(format!("{written} ({} from the workspace root)", relative.display()));
        }
        checked.insert(relative);
    }
    // Not vacuous: the page names dozens of files, and the extractor found them.
    assert!(checked.len() >= 40, "only {} paths found in {ARCHITECTURE_PAGE}: {checked:?}", checked.len());
    assert!(
        missing.is_empty(),
        "{ARCHITECTURE_PAGE} names paths that do not exist (code spans from the workspace root, links from docs/):\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_page_path_extractor_finds_paths_and_ignores_the_rest() {
    let sample = r#"Read [`crates/a/src/lib.rs`](../crates/a/src/lib.rs) and `kernels/common.cuh`, then
`Cargo.toml`, `crates/b/` (a folder), `src/x.rs:120`, `benches/device/{common,suite}.sh` and
[the design](notes.md#layers "title").

Not paths: `Transport::copy`, `gp.copy_`, `torch.ops.<package>`, `cargo xtask ptx --check`,
`DIR/run`, `/dev/shm`, `$OUT/h200`, `kernels/*.cu`, `2(n-1)/n`, `lib.rs
is split`, [a site](https://example.invalid/x.md), [an anchor](#code-map), `` `weird` ``.

```sh
cargo test -p xtask   # `not/a/span.rs` inside a fence
```
"#;
    let found = page_paths(sample);
    let code = |p: &str| PagePath::Code(p.to_owned());
    let link = |p: &str| PagePath::Link(p.to_owned());
    assert_eq!(
        found,
        [
            code("crates/a/src/lib.rs"),
            link("../crates/a/src/lib.rs"),
            code("kernels/common.cuh"),
            code("Cargo.toml"),
            code("crates/b/"),
            code("src/x.rs"),
            code("benches/device/common.sh"),
            code("benches/device/suite.sh"),
            link("notes.md"),
        ]
    );
    assert_eq!(lexically_normal(&Path::new("docs").join("../crates/a/./src/lib.rs")), Path::new("crates/a/src/lib.rs"));
}
