#!/usr/bin/env python3
"""The structure CI holds: no module cycle in any crate, no source file over 1,000 lines, and
no function over 120 lines outside tests.

A module is a source file. An arrow runs from a file to each file whose items it names through
a `crate::`, `super::` or `self::` path (or a path that starts with one of its own child
modules), in a `use` or inline. A name reached through a re-export (`pub use`) counts where it
is defined, and the re-export itself is no arrow: a facade that re-exports its children is not
a dependency of theirs. `mod` declarations are no arrows either.

Usage: scripts/check_structure.py [--report] [ROOT]
  --report  also print every crate's longest functions and each file's arrows
Exits 1, listing what is wrong, when a rule is broken.
"""

import os
import re
import sys

MAX_FILE_LINES = 1000
MAX_FN_LINES = 120


def strip(text):
    """Source with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|\\x..|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (self in a group means the prefix)."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s, i):
        paths, prefix = [], []
        seg = ""
        while i < len(s):
            c = s[i]
            if s.startswith("::", i):
                prefix.append(seg)
                seg = ""
                i += 2
            elif c == "{":
                inner, i = parse_group(s, i + 1)
                paths.extend(prefix + p for p in inner)
                return paths, i
            elif c in ",}":
                break
            else:
                seg += c
                i += 1
        if seg:
            paths.append(prefix + ([] if seg == "self" and prefix else [seg]))
        return paths, i

    def parse_group(s, i):
        out = []
        while i < len(s) and s[i] != "}":
            paths, i = parse(s, i)
            out.extend(paths)
            if i < len(s) and s[i] == ",":
                i += 1
        return out, i + 1

    paths, _ = parse(tree, 0)
    return [p for p in paths if p]


def clean_alias(tree):
    return re.sub(r"\s+as\s+\w+", "", tree)


class Crate:
    def __init__(self, name, root_file):
        self.name = name
        self.root_file = root_file
        self.modules = {}  # tuple path -> file
        self.children = {}  # tuple path -> set of child names (file or inline modules)
        self.reexports = {}  # (module, name) -> absolute path list
        self.globs = {}  # module -> list of absolute module paths re-exported with *
        self.refs = {}  # module -> list of (absolute path list)
        self.load(root_file, ())

    def child_file(self, parent_file, name, is_root_like):
        base = os.path.dirname(parent_file)
        if not is_root_like:
            base = os.path.join(base, os.path.splitext(os.path.basename(parent_file))[0])
        for candidate in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
            if os.path.exists(candidate):
                return candidate
        return None

    def load(self, path, modpath):
        self.modules[modpath] = path
        text = strip(open(path, encoding="utf-8").read())
        is_root_like = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs") or modpath == ()
        self.children[modpath] = set()
        # Modules in files of their own; an inline one (`mod tests { ... }`) stays part of this
        # file, its paths resolved from its own place in it (below).
        for m in re.finditer(r"\b(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            name = m.group(1)
            self.children[modpath].add(name)
            child = self.child_file(path, name, is_root_like)
            if child:
                self.load(child, modpath + (name,))
        inline = []  # (start, end, name) of inline modules: `super::` inside one is this file
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
            self.children[modpath].add(m.group(1))
            inline.append((m.end() - 1, matching_brace(text, m.end() - 1), m.group(1)))

        def scope(at):
            return modpath + tuple(name for a, b, name in inline if a < at < b)

        refs = []
        for m in re.finditer(r"(^|[;{}\]]\s*)(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text, re.M):
            is_pub = bool(m.group(2))
            for p in expand_use_tree(clean_alias(m.group(3))):
                absolute = self.absolute(scope(m.start(3)), p)
                if absolute is None:
                    if is_pub and p[-1] != "*":
                        # A re-export of another crate's item: naming it is no arrow.
                        alias = re.search(r"\b" + re.escape(p[-1]) + r"\s+as\s+(\w+)", m.group(3))
                        self.reexports[(modpath, alias.group(1) if alias else p[-1])] = None
                    continue
                if is_pub:
                    if p[-1] == "*":
                        self.globs.setdefault(modpath, []).append(absolute[:-1])
                    else:
                        alias = re.search(r"\b" + re.escape(p[-1]) + r"\s+as\s+(\w+)", m.group(3))
                        self.reexports[(modpath, alias.group(1) if alias else p[-1])] = absolute
                else:
                    refs.append(absolute if p[-1] != "*" else absolute[:-1])
        body = re.sub(r"(^|[;{}\]]\s*)(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);",
                      lambda u: u.group(1) + " " * (len(u.group(0)) - len(u.group(1))), text, flags=re.M)
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*\w+)+)", body):
            p = re.sub(r"\s+", "", m.group(1)).split("::")
            absolute = self.absolute(scope(m.start()), p)
            if absolute:
                refs.append(absolute)
        self.refs[modpath] = refs

    def absolute(self, modpath, p):
        """A path as written in module `modpath`, made absolute; None for external crates."""
        if p[0] == "crate":
            return list(p[1:])
        if p[0] in ("self", "super"):
            base = list(modpath)
            i = 0
            while i < len(p) and p[i] in ("self", "super"):
                if p[i] == "super":
                    if not base:
                        return None
                    base.pop()
                i += 1
            return base + list(p[i:])
        for depth in range(len(modpath), -1, -1):
            if p[0] in self.children.get(modpath[:depth], ()):
                return list(modpath[:depth]) + list(p)
            if modpath[:depth] in self.modules:
                break
        return None

    def resolve(self, path, depth=0):
        """The file module that defines what an absolute path names."""
        best = ()
        for i in range(len(path), -1, -1):
            if tuple(path[:i]) in self.modules:
                best = tuple(path[:i])
                rest = path[i:]
                break
        if rest and depth < 16:
            if (best, rest[0]) in self.reexports:
                target = self.reexports[(best, rest[0])]
                if target is None:
                    return None
                return self.resolve(list(target) + rest[1:], depth + 1)
            for glob in self.globs.get(best, ()):
                candidate = tuple(glob) + (rest[0],)
                if candidate in self.modules or (tuple(glob), rest[0]) in self.reexports:
                    return self.resolve(list(candidate) + rest[1:], depth + 1)
        return best

    def edges(self):
        out = {}
        for mod, refs in self.refs.items():
            targets = set()
            for r in refs:
                t = self.resolve(r)
                if t is not None and t != mod:
                    targets.add(t)
            out[mod] = targets
        return out


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, ()))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    result.append(comp)
    return result


def crate_roots(root):
    for package in sorted(os.listdir(root)):
        pkg = os.path.join(root, package)
        if not os.path.isfile(os.path.join(pkg, "Cargo.toml")):
            continue
        for rel in ("src/lib.rs", "src/main.rs"):
            if os.path.isfile(os.path.join(pkg, rel)):
                yield package, rel, os.path.join(pkg, rel)
        for folder in ("src/bin", "benches", "tests", "examples"):
            d = os.path.join(pkg, folder)
            if not os.path.isdir(d):
                continue
            for entry in sorted(os.listdir(d)):
                full = os.path.join(d, entry)
                if entry.endswith(".rs"):
                    yield package, f"{folder}/{entry}", full
                elif os.path.isfile(os.path.join(full, "main.rs")):
                    yield package, f"{folder}/{entry}/main.rs", os.path.join(full, "main.rs")


def functions(path):
    """(name, first line, line count) of each fn body in a file, test modules left out."""
    text = strip(open(path, encoding="utf-8").read())
    test_spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        test_spans.append((m.start(), matching_brace(text, m.end() - 1)))
    out = []
    for m in re.finditer(r"\bfn\s+(\w+)[^;{]*?\{", text, re.S):
        start = m.end() - 1
        if any(a <= start <= b for a, b in test_spans):
            continue
        end = matching_brace(text, start)
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end) + 1
        out.append((m.group(1), first, last - first + 1))
    return out


def matching_brace(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    report = "--report" in sys.argv
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = []
    seen_files = set()
    longest = {}
    for package, rel, path in crate_roots(root):
        crate = Crate(package, path)
        graph = crate.edges()
        for comp in cycles(graph):
            files = sorted(os.path.relpath(crate.modules[m], root) for m in comp)
            problems.append(f"module cycle in {package} ({rel}), {len(files)} files: " + ", ".join(files))
        if report:
            for mod, targets in sorted(graph.items()):
                names = sorted(os.path.relpath(crate.modules[t], root) for t in targets)
                print(f"{os.path.relpath(crate.modules[mod], root)} -> {', '.join(names)}")
        for file in crate.modules.values():
            if file in seen_files:
                continue
            seen_files.add(file)
            relfile = os.path.relpath(file, root)
            in_tests = "/tests/" in "/" + relfile
            lines = sum(1 for _ in open(file, encoding="utf-8"))
            if lines > MAX_FILE_LINES and not in_tests:
                problems.append(f"{relfile}: {lines} lines, over {MAX_FILE_LINES}")
            if in_tests:
                continue
            for name, first, count in functions(file):
                best = longest.get(package)
                if best is None or count > best[2]:
                    longest[package] = (f"{relfile}:{first}", name, count)
                if count > MAX_FN_LINES:
                    problems.append(f"{relfile}:{first}: fn {name} is {count} lines, over {MAX_FN_LINES}")
    for package, (where, name, count) in sorted(longest.items()):
        print(f"{package}: longest function {name} ({where}), {count} lines")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} structure problems")
        return 1
    print("structure: no module cycle, no file over 1,000 lines, no function over 120 lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
