#!/usr/bin/env python3
"""Import circles between the modules of Rust library crates.

Usage: python3 .ci/module_cycles.py CRATE_SRC_DIR...   (e.g. sdk/src sdk/ctl/src simulation/src)

A node is a module file (`lib.rs` is `crate`, `a.rs` or `a/mod.rs` is `crate::a`). There is an
edge A -> B when A's code names an item of B: `use crate::…`, `use super::…`, a child module's
path (`args::Api`), or the same paths written inline. A name re-exported with `pub use` counts
as an edge to the module that defines it. Declaring a module (`mod b;`) is not an edge, and
`#[cfg(test)] mod tests` blocks are left out (their `use super::*` is the file itself).
Prints every strongly connected component of more than one module with the edges inside it;
exits 1 if there is any.
"""

import re
import sys
from pathlib import Path

STRING = re.compile(r'r#*"[\s\S]*?"#*|"(?:\\[\s\S]|[^"\\])*"|\'(?:\\.|[^\'\\])\'')
LINE_COMMENT = re.compile(r"//[^\n]*")
BLOCK_COMMENT = re.compile(r"/\*(?:.|\n)*?\*/")
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
PATH = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+\w+\s*\{")


def module_of(root: Path, file: Path) -> tuple:
    rel = file.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(text: str) -> str:
    m = TESTS.search(text)
    if m:
        text = text[: m.start()]  # test modules sit at the end of a file
    text = BLOCK_COMMENT.sub(" ", text)
    text = STRING.sub('""', text)
    return LINE_COMMENT.sub("", text)


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, self}}` -> [[a, b], [a, c, d], [a, c]]"""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        # split s at top-level commas
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for item in filter(None, items):
            if "{" in item:
                head, rest = item.split("{", 1)
                head = [p for p in head.split("::") if p]
                walk(prefix + head, rest[:-1])
            else:
                item = item.split(" as ")[0].split("as")[0] if " as " in item else item
                segs = [p for p in re.split(r"::", re.sub(r"as\w+$", "", item)) if p]
                if segs == ["self"]:
                    out.append(prefix)
                elif segs == ["*"]:
                    out.append(prefix + ["*"])
                else:
                    out.append(prefix + segs)

    walk([], tree)
    return out


def main(dirs):
    found = False
    for d in dirs:
        root = Path(d)
        files = sorted(p for p in root.rglob("*.rs") if p.name != "main.rs" or p.parent != root)
        files = [p for p in files if "bin" not in p.relative_to(root).parts]
        mods = {module_of(root, f): f for f in files}
        code = {m: code_of(f.read_text()) for m, f in mods.items()}
        children = {m: set(MOD_DECL.findall(c)) for m, c in code.items()}

        def absolute(m, segs):
            if not segs:
                return None
            if segs[0] == "crate":
                return list(segs[1:])
            if segs[0] == "self":
                return list(m) + list(segs[1:])
            if segs[0] == "super":
                base = list(m)
                while segs and segs[0] == "super":
                    base = base[:-1]
                    segs = segs[1:]
                return base + list(segs)
            if segs[0] in children.get(m, ()):
                return list(m) + list(segs)
            return None  # another crate, std, a local name

        # Re-exports: (module, name) -> absolute path of what it names.
        reexports = {}
        for m, c in code.items():
            for vis, tree in USE.findall(c):
                if not vis.startswith("pub"):
                    continue
                for segs in expand_use(tree):
                    a = absolute(m, segs)
                    if a and segs[-1] != "*":
                        reexports[(m, segs[-1])] = a

        def resolve(a, seen=0):
            """The module that defines what absolute path `a` names."""
            best = ()
            for i in range(len(a) + 1):
                if tuple(a[:i]) in mods:
                    best = tuple(a[:i])
            rest = a[len(best):]
            if rest and (best, rest[0]) in reexports and seen < 8:
                return resolve(reexports[(best, rest[0])] + rest[1:], seen + 1)
            return best

        edges = {m: {} for m in mods}
        for m, c in code.items():
            paths = [segs for _, t in USE.findall(c) for segs in expand_use(t)]
            paths += [p.split("::") for p in PATH.findall(USE.sub(" ", c))]
            for segs in paths:
                segs = [s for s in segs if s != "*"]
                a = absolute(m, segs)
                if a is None:
                    continue
                t = resolve(a)
                if t != m:
                    edges[m].setdefault(t, "::".join(segs))

        for comp in sccs(edges):
            if len(comp) < 2:
                continue
            found = True
            names = sorted("::".join(("crate",) + x) for x in comp)
            print(f"{d}: circle of {len(comp)}: {', '.join(names)}")
            for a in sorted(comp):
                for b, via in sorted(edges[a].items()):
                    if b in comp:
                        print(f"    {'::'.join(('crate',) + a)} -> {'::'.join(('crate',) + b)}  ({via})")
        if "-v" in sys.argv:
            for a in sorted(edges):
                print("  " + "::".join(("crate",) + a) + " -> " + ", ".join(sorted("::".join(("crate",) + b) for b in edges[a])))
        n_edges = sum(len(v) for v in edges.values())
        print(f"{d}: {len(mods)} modules, {n_edges} edges")
    print("circles found" if found else "no circles")
    return 1 if found else 0


def sccs(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if a != "-v"] or ["src"]))
