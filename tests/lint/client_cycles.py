#!/usr/bin/python3
"""No cycle among the client library's files (docs/architecture.md, "The client").

The file-level dependency graph of client/lib: A -> B when A #includes B (a header of
client/lib), or when A calls a bw__ function that B defines (the .c file, or the header of a
static inline function). A cycle means two files hold each other's state or calls: one of
them owns something the other should (CONVENTIONS: "each part owns its state"). Functions
reached through an ops table (transport.h, fetch.h's kinds) are not calls by name: that is how
the fetch loop uses back ends it does not depend on.

    tests/lint/client_cycles.py [SOURCE_DIR]      exit 1 and the cycles when there are any
"""
import os
import re
import sys

NAME = re.compile(r"\b(bw__\w+)\s*\(")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def strip(text):
    """The text without comments, string and character literals (same length, same lines)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing(text, i):
    """The index after the parenthesis that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def definitions(code):
    """bw__ functions defined in code: a name at the start of a declarator whose parameter
    list is followed by a body."""
    out = set()
    for m in NAME.finditer(code):
        line_start = code.rfind("\n", 0, m.start()) + 1
        head = code[line_start:m.start()]
        if head[:1].isspace() or "=" in head or "return" in head:
            continue  # a call inside a body, or an initializer
        end = closing(code, m.end() - 1)
        rest = code[end:end + 200].lstrip()
        if rest.startswith("{"):
            out.add(m.group(1))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lib = os.path.join(root, "client", "lib")
    files = sorted(f for f in os.listdir(lib) if f.endswith((".c", ".h")))
    code = {}
    for f in files:
        with open(os.path.join(lib, f), encoding="utf-8") as fh:
            code[f] = fh.read()
    defined_in = {}
    for f in files:
        for name in definitions(strip(code[f])):
            defined_in.setdefault(name, f)
    edges = {f: {} for f in files}  # f -> {g: why}
    for f in files:
        for inc in INCLUDE.findall(code[f]):
            g = os.path.basename(inc)
            if os.path.dirname(inc) == "" and g in code and g != f:
                edges[f].setdefault(g, "#include \"%s\"" % inc)
        stripped = strip(code[f])
        own = definitions(stripped)
        for m in NAME.finditer(stripped):
            line_start = stripped.rfind("\n", 0, m.start()) + 1
            if not stripped[line_start:m.start()][:1].isspace():
                continue  # a declaration or definition at file scope, not a call
            g = defined_in.get(m.group(1))
            if g and g != f and m.group(1) not in own:
                edges[f].setdefault(g, "calls %s" % m.group(1))
    # Tarjan's strongly connected components: any with two files or more holds a cycle.
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in files:
        if v not in index:
            connect(v)
    cycles = [c for c in comps if len(c) > 1]
    nedges = sum(len(e) for e in edges.values())
    if not cycles:
        print("client_cycles: %d files of client/lib, %d dependencies, no cycle" %
              (len(files), nedges))
        return 0
    for c in cycles:
        print("client_cycles: a cycle among %s:" % ", ".join(c))
        for a in c:
            for b, why in sorted(edges[a].items()):
                if b in c:
                    print("  %s -> %s (%s)" % (a, b, why))
    return 1


if __name__ == "__main__":
    sys.exit(main())
