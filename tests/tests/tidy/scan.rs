//! A small Rust source scanner for the tidy checks: comments and literals blanked out, then
//! functions, constants and module references found by their tokens. Approximate by design
//! (no macro expansion), exact enough for this workspace's code.

use std::collections::{BTreeMap, BTreeSet};

/// `text` with comments and string/char literals replaced by spaces (newlines kept), so braces
/// and keywords inside them are not seen.
pub fn clean(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let skip = literal_or_comment(b, i);
        if skip > i {
            out.extend(text[i..skip].chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
            i = skip;
        } else {
            let c = text[i..].chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Where a comment or literal starting at `i` ends (`i` if none starts there).
fn literal_or_comment(b: &[u8], i: usize) -> usize {
    let at = |s: &str| b[i..].starts_with(s.as_bytes());
    let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if at("//") {
        return b[i..].iter().position(|c| *c == b'\n').map_or(b.len(), |p| i + p);
    }
    if at("/*") {
        return find(b, i + 2, b"*/").map_or(b.len(), |p| p + 2);
    }
    if !ident_before && (at("r\"") || at("r#") || at("br\"") || at("br#")) {
        let start = i + if b[i] == b'b' { 2 } else { 1 };
        let hashes = b[start..].iter().take_while(|c| **c == b'#').count();
        if b.get(start + hashes) == Some(&b'"') {
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            return find(b, start + hashes + 1, &close).map_or(b.len(), |p| p + close.len());
        }
    }
    if b[i] == b'"' {
        let mut j = i + 1;
        while j < b.len() && b[j] != b'"' {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        return (j + 1).min(b.len());
    }
    if b[i] == b'\'' {
        // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
        if b.get(i + 1) == Some(&b'\\') {
            return find(b, i + 2, b"'").map_or(i, |p| p + 1);
        }
        let len = std::str::from_utf8(&b[i + 1..])
            .ok()
            .and_then(|s| s.chars().next())
            .map_or(1, char::len_utf8);
        if b.get(i + 1 + len) == Some(&b'\'') {
            return i + len + 2;
        }
    }
    i
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}

/// A function found in cleaned source.
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// The functions with a body: name, first line (1-based) and length in lines.
pub fn functions(clean: &str) -> Vec<Function> {
    let b = clean.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = find(b, i, b"fn ") {
        i = p + 3;
        if p > 0 && (b[p - 1].is_ascii_alphanumeric() || b[p - 1] == b'_') {
            continue;
        }
        let name: String =
            clean[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        let Some(open) = body_start(b, i) else { continue };
        let Some(close) = matching(b, open) else { continue };
        let line = line_of(b, p);
        out.push(Function { name, line, lines: line_of(b, close) - line + 1 });
    }
    out
}

/// The `{` of a body, if the signature from `i` reaches one before a `;`.
fn body_start(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, c) in b.iter().enumerate().skip(i) {
        match c {
            b'(' | b'[' | b'<' => depth += 1,
            b')' | b']' => depth -= 1,
            b'>' if b.get(k.wrapping_sub(1)) != Some(&b'-') => depth -= 1,
            b';' if depth <= 0 => return None,
            b'{' if depth <= 0 => return Some(k),
            _ => {}
        }
    }
    None
}

fn matching(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0;
    for (k, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

fn line_of(b: &[u8], pos: usize) -> usize {
    b[..pos].iter().filter(|c| **c == b'\n').count() + 1
}

/// The named constants: (line, name).
pub fn consts(clean: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in clean.lines().enumerate() {
        let t = line.trim_start();
        let t = t.strip_prefix("pub ").or_else(|| t.strip_prefix("pub(crate) ")).unwrap_or(t);
        let t = t.strip_prefix("pub(super) ").unwrap_or(t);
        if let Some(rest) = t.strip_prefix("const ").or_else(|| t.strip_prefix("static ")) {
            let name: String =
                rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() && name != "_" {
                out.push((n + 1, name));
            }
        }
    }
    out
}

/// Whether a constant's name says it is a bound: `…_MAX` / `…_MIN`, or with a unit after it.
pub fn is_bound(name: &str) -> bool {
    const UNITS: [&str; 9] = ["MS", "S", "US", "NS", "BYTES", "KIB", "MIB", "DAYS", "ROWS"];
    let parts: Vec<&str> = name.split('_').collect();
    match parts.as_slice() {
        [.., last] if *last == "MAX" || *last == "MIN" => parts.len() > 1,
        [.., bound, unit] => (*bound == "MAX" || *bound == "MIN") && UNITS.contains(unit),
        _ => false,
    }
}

/// The module a file under `src/` is (`[]` for `lib.rs`); `None` for binaries.
pub fn module_path(rel: &str) -> Option<Vec<String>> {
    let rel = rel.strip_suffix(".rs")?;
    if rel == "main" || rel.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    Some(parts)
}

/// The modules `clean` (the source of module `me`) refers to through `crate::`, `super::` or
/// `self::` paths, in `use` trees and in code (inline `#[cfg(test)]` modules left out).
pub fn references(
    clean: &str,
    me: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let code = without_inline_tests(clean);
    let mut paths: Vec<Vec<String>> = Vec::new();
    let mut rest = code.as_str();
    while let Some(p) = rest.find("use ") {
        let before_ok = p == 0
            || !rest.as_bytes()[p - 1].is_ascii_alphanumeric() && rest.as_bytes()[p - 1] != b'_';
        let after = &rest[p + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if before_ok {
            paths.extend(expand_use(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    for head in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(p) = code[from..].find(head) {
            let s = from + p;
            from = s + head.len();
            let path: String = code[s..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(path.split("::").filter(|x| !x.is_empty()).map(str::to_string).collect());
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        if let Some(m) = resolve(&p, me, modules).filter(|m| m.as_slice() != me) {
            out.insert(m);
        }
    }
    out
}

/// `clean` without `#[cfg(test)] mod name { … }` blocks (their `super` is the file itself).
fn without_inline_tests(clean: &str) -> String {
    let mut out = String::new();
    let mut rest = clean;
    while let Some(p) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..p]);
        let after = &rest[p..];
        let b = after.as_bytes();
        match (after.find("mod "), after.find('{'), after.find(';')) {
            (Some(m), Some(o), semi) if semi.is_none_or(|s| s > o) && m < o => {
                let close = matching(b, o).unwrap_or(b.len() - 1);
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str(&after[..12]);
                rest = &after[12..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The paths a `use` tree names (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![
            path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        ];
    };
    let prefix: Vec<String> =
        tree[..open].split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    let mut items = Vec::new();
    for (k, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    for item in items.into_iter().filter(|i| !i.trim().is_empty()) {
        for tail in expand_use(item) {
            let tail = if tail == ["self"] { Vec::new() } else { tail };
            out.push(prefix.iter().cloned().chain(tail).collect());
        }
    }
    out
}

/// The module a path leads into: the longest known module prefix of its absolute form.
fn resolve(path: &[String], me: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let (mut base, mut rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "super" | "self" => (me.to_vec(), path),
        _ => return None,
    };
    while let Some(head) = rest.first() {
        match head.as_str() {
            "super" => drop(base.pop()),
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    (0..=base.len()).rev().map(|k| base[..k].to_vec()).find(|m| modules.contains(m))
}

/// For every module, the cycles among its children (each child with all modules under it):
/// each cycle as the children's names in order.
pub fn sibling_cycles(
    modules: &BTreeSet<Vec<String>>,
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<String>> {
    let parents: BTreeSet<Vec<String>> =
        modules.iter().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    let mut out = Vec::new();
    for parent in parents {
        let child = |m: &Vec<String>| {
            (m.len() > parent.len() && m.starts_with(&parent)).then(|| m[parent.len()].clone())
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in edges {
            let Some(a) = child(from) else { continue };
            for to in tos {
                if let Some(b) = child(to).filter(|b| *b != a) {
                    graph.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        if let Some(cycle) = find_cycle(&graph) {
            let name = if parent.is_empty() { "crate".to_string() } else { parent.join("::") };
            out.push(std::iter::once(format!("{name}:")).chain(cycle).collect());
        }
    }
    out
}

/// One cycle of a directed graph, if it has any.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}
