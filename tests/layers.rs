//! The import graph of `src/`: no cycle between top-level modules, `util`
//! at the bottom importing nothing of ours, the layers below kept apart,
//! and no two files of one folder importing each other unless the pair is
//! listed below with its reason.
//!
//! The graph is read from the source text: every `crate::` path (including
//! each item of a `crate::{a, b::c}` group) names the top-level module it
//! reaches, and `super::x` or `crate::<folder>::x` in a file names the
//! sibling file `x`. Comments and string literals are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level modules that must not import another, even where no cycle
/// would follow (in tests too), each with why.
const APART: &[(&str, &str, &str)] = &[(
    "changes",
    "review",
    "changes/ is the one module that writes the user's workspace and is audited alone; the review interface sits \
     on top of it",
)];

/// Two files of one folder that import each other, each with why it stays.
/// The same reason is written next to the import in the code.
const FOLDER_CYCLES: &[(&str, &str, &str, &str)] = &[
    ("changes", "apply", "store", "a store test applies what it staged, to check that a sparse file lands sparse"),
    (
        "guest",
        "changes",
        "channel",
        "the control loop runs the checkpoints the host asks for; an export reports on its connection",
    ),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The source with comments, string literals and character literals blanked
/// out, so that only code remains to be searched.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if (rest.starts_with(b"r#") || rest.starts_with(b"r\"") || rest.starts_with(b"br"))
            && (i == 0 || !ident(b[i - 1]))
            && raw_string_end(b, i).is_some()
        {
            i = raw_string_end(b, i).unwrap();
            out.push_str("\"\"");
        } else if b[i] == b'"' || (b[i] == b'b' && rest.get(1) == Some(&b'"') && (i == 0 || !ident(b[i - 1]))) {
            i += if b[i] == b'b' { 2 } else { 1 };
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && rest.get(1) == Some(&b'\\') {
            // An escaped character literal: '\n', '\u{..}', '\''.
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if b[i] == b'\'' && char_literal_len(&src[i + 1..]).is_some() {
            i += 1 + char_literal_len(&src[i + 1..]).unwrap();
            out.push_str("' '");
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Where the raw string starting at `at` (`r"`, `r#"`, `br"`) ends.
fn raw_string_end(b: &[u8], at: usize) -> Option<usize> {
    let mut i = at + if b[at] == b'b' { 2 } else { 1 };
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
    let from = i + 1;
    b[from..].windows(close.len()).position(|w| w == close.as_slice()).map(|p| from + p + close.len())
}

/// The length after the opening quote of an unescaped character literal
/// (`'a'`), or `None` for a lifetime (`'a`).
fn char_literal_len(rest: &str) -> Option<usize> {
    let c = rest.chars().next()?;
    (rest[c.len_utf8()..].starts_with('\'')).then_some(c.len_utf8() + 1)
}

/// The first path segment of each path that follows `prefix` in `code`:
/// `prefix::a::b` gives `a`, `prefix::{a, b::c}` gives `a` and `b`.
fn segments_after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(pos) = code[from..].find(prefix) {
        let at = from + pos;
        from = at + prefix.len();
        let boundary =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':');
        if !boundary {
            continue;
        }
        let rest = code[from..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && depth == 0 && !c.is_whitespace() => {
                        item_start = false;
                        found.push(leading_ident(&group[i..]));
                    }
                    _ => {}
                }
            }
        } else {
            found.push(leading_ident(rest));
        }
    }
    found.retain(|s| !s.is_empty() && s != "self");
    found
}

fn leading_ident(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// A file's path under `src/` as its folders and its module name.
fn place(file: &Path) -> (Vec<String>, String) {
    let rel = file.strip_prefix(src_dir()).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let name = parts.pop().unwrap().trim_end_matches(".rs").to_string();
    (parts, name)
}

/// Top-level module -> modules it imports -> files that do.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn top_level_graph() -> Graph {
    let mut graph = Graph::new();
    for file in rust_files(&src_dir()) {
        let (folders, name) = place(&file);
        let from = folders.first().cloned().unwrap_or(name.clone());
        if from == "main" {
            continue;
        }
        let code = code_only(&fs::read_to_string(&file).unwrap());
        let shown = file.strip_prefix(src_dir()).unwrap().display().to_string();
        let edges = graph.entry(from.clone()).or_default();
        for to in segments_after(&code, "crate::") {
            if to != from {
                edges.entry(to).or_default().insert(shown.clone());
            }
        }
    }
    graph
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_cycle_between_top_level_modules() {
    let graph = top_level_graph();
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let files: Vec<&str> = graph[&w[0]][&w[1]].iter().map(String::as_str).collect();
                format!("  {} -> {} (in {})", w[0], w[1], files.join(", "))
            })
            .collect();
        panic!(
            "the top-level modules import each other in a cycle: {}\n{}\nmove the shared piece below both (util/ \
             for helpers, protocol/ for formats) or into the one that uses it",
            cycle.join(" -> "),
            steps.join("\n")
        );
    }
}

#[test]
fn util_imports_nothing_of_ours() {
    let graph = top_level_graph();
    let imports = graph.get("util").cloned().unwrap_or_default();
    assert!(imports.is_empty(), "util must stay at the bottom, but imports {imports:?}");
}

#[test]
fn layers_stay_apart() {
    let graph = top_level_graph();
    let crossings: Vec<String> = APART
        .iter()
        .filter_map(|(from, to, why)| {
            let files = graph.get(*from)?.get(*to)?;
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            Some(format!("  {from} imports {to} (in {}), but {why}", files.join(", ")))
        })
        .collect();
    assert!(
        crossings.is_empty(),
        "a module reaches into a layer it must not:\n{}\nmove the piece both need into the lower one",
        crossings.join("\n")
    );
}

#[test]
fn the_reader_sees_a_cycle() {
    let code = code_only(
        "use crate::{a::X, b};\n// crate::c in a comment\nlet s = \"crate::d\";\nlet r = r#\"crate::e\"#;\nfn f<'a>(x: &'a u8) { crate::f::g(); let c = '\"'; }",
    );
    assert_eq!(segments_after(&code, "crate::"), ["a", "b", "f"]);
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().entry("b".into()).or_default();
    graph.entry("b".into()).or_default().entry("c".into()).or_default();
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().entry("a".into()).or_default();
    assert_eq!(find_cycle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

/// Pairs of sibling files (not `mod.rs`, which is a folder's interface)
/// that import each other: (folder, one, other), names sorted.
fn folder_cycles() -> BTreeSet<(String, String, String)> {
    let mut imports: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(&src_dir()) {
        let (folders, name) = place(&file);
        if folders.is_empty() || name == "mod" {
            continue;
        }
        let dir = file.parent().unwrap();
        let siblings: BTreeSet<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .filter(|s| s != "mod" && *s != name)
            .collect();
        let code = code_only(&fs::read_to_string(&file).unwrap());
        let folder = folders.join("::");
        let mut reached = segments_after(&code, "super::");
        reached.extend(segments_after(&code, &format!("crate::{folder}::")));
        let entry = imports.entry((folders.join("/"), name)).or_default();
        entry.extend(reached.into_iter().filter(|s| siblings.contains(s)));
    }
    let mut cycles = BTreeSet::new();
    for ((folder, a), reached) in &imports {
        for b in reached {
            let back = imports.get(&(folder.clone(), b.clone())).is_some_and(|r| r.contains(a));
            if back && a < b {
                cycles.insert((folder.clone(), a.clone(), b.clone()));
            }
        }
    }
    cycles
}

#[test]
fn folder_cycles_are_known_and_explained() {
    let found = folder_cycles();
    let known: BTreeSet<(String, String, String)> =
        FOLDER_CYCLES.iter().map(|(f, a, b, _)| (f.to_string(), a.to_string(), b.to_string())).collect();
    let new: Vec<String> =
        found.difference(&known).map(|(f, a, b)| format!("src/{f}/{a}.rs <-> src/{f}/{b}.rs")).collect();
    assert!(
        new.is_empty(),
        "files import each other: {}; move what both need into one of them or a third file, or list the pair in \
         FOLDER_CYCLES with the reason it stays",
        new.join(", ")
    );
    let gone: Vec<String> = known.difference(&found).map(|(f, a, b)| format!("{f}: {a} <-> {b}")).collect();
    assert!(gone.is_empty(), "these cycles are gone; drop them from FOLDER_CYCLES: {}", gone.join(", "));
}
