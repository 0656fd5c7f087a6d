#!/usr/bin/python3
"""The walk of one batch's path through the client library (docs/architecture.md, "The walk").

Starting at a function (bw_loader_next), follow every function it uses -- called, or handed on
as a value (a callback, a transport's operation in an ops table) -- depth first, in the order
they appear in its body, reading each function once. The source file of each function read in
that order is a "room"; a run of functions read in one room is a "stay"; a stay in a room
already left earlier is a "return". Fewer stays and returns: a reader of the path jumps
between fewer files.

The call graph comes from clang's AST (clang -Xclang -ast-dump=json) of the library's sources,
compiled with the flags in the build's compile_commands.json (configure with
-DCMAKE_EXPORT_COMPILE_COMMANDS=ON). Rooms are the files under --scope (client/lib by
default); functions elsewhere (core/, libc, gRPC) are not followed. A call through a table of
operations (a transport) reads each back end's whole table, in field order, where it is first
met: a back end is read as one (--per-call: only the operation called, in each table).

    scripts/walk.py --build build [--root SOURCE_DIR] [--start bw_loader_next] [--verbose]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def compile_args(entry):
    """The preprocessor and language flags of one compile_commands.json entry."""
    argv = entry.get("arguments") or shlex.split(entry["command"])
    keep, i = [], 1
    while i < len(argv):
        a = argv[i]
        if a in ("-I", "-D", "-isystem", "-include"):
            keep += [a, argv[i + 1]]
            i += 2
            continue
        if a.startswith(("-I", "-D", "-std=")):
            keep.append(a)
        i += 1
    return keep


def walk_nodes(node):
    """Yields every node below node, depth first, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.get("inner", [])))


class Graph:
    def __init__(self):
        self.defined = {}  # function (file, name) -> file; (None, name) for an external one
        self.uses = {}  # function -> (its file, [what it uses, in order: names, or ".field"])
        self.tables = {}  # type of a file-scope table -> [[function or None, by field]]

    def add_file(self, path, ast):
        current = None  # clang writes a loc's file only when it changes
        for decl in ast.get("inner", []):
            for key in ("loc", "range"):
                loc = decl.get(key, {})
                for part in (loc, loc.get("begin", {}), loc.get("expansionLoc", {})):
                    if "file" in part:
                        current = part["file"]
            if os.path.realpath(current or "") != os.path.realpath(path):
                continue
            if decl.get("kind") == "FunctionDecl" and any(
                    c.get("kind") == "CompoundStmt" for c in decl.get("inner", [])):
                key = (path if decl.get("storageClass") == "static" else None, decl["name"])
                self.defined[key] = path
                self.uses[key] = (path, self.refs(decl))
            elif decl.get("kind") == "VarDecl":
                self.table(path, decl)

    @staticmethod
    def refs(fn):
        out = []
        for n in walk_nodes(fn):
            if n.get("kind") == "DeclRefExpr":
                d = n.get("referencedDecl", {})
                if d.get("kind") == "FunctionDecl":
                    out.append(d["name"])
            elif n.get("kind") == "MemberExpr" and "(*" in n.get("type", {}).get("qualType", ""):
                # an operation called through a table (ops->start): resolved by field name
                out.append("." + n.get("name", ""))
        return out

    def table(self, path, var):
        """A file-scope table of functions (an ops struct): field name -> functions."""
        for init in var.get("inner", []):
            if init.get("kind") != "InitListExpr":
                continue
            funcs = []
            for item in init.get("inner", []):
                names = [n["referencedDecl"]["name"] for n in walk_nodes(item)
                         if n.get("kind") == "DeclRefExpr"
                         and n.get("referencedDecl", {}).get("kind") == "FunctionDecl"]
                funcs.append((path, names[0]) if names else None)
            var_type = var.get("type", {}).get("qualType", "")
            self.tables.setdefault(var_type.replace("const ", "").strip(), []).append(funcs)


def record_fields(ast):
    """struct name -> its field names, in order (for the ops tables' initializers)."""
    out = {}
    for n in walk_nodes(ast):
        if n.get("kind") == "RecordDecl" and n.get("completeDefinition") and n.get("name"):
            out[n["name"]] = [f.get("name") for f in n.get("inner", [])
                              if f.get("kind") == "FieldDecl"]
        if n.get("kind") == "TypedefDecl":
            t = n.get("type", {}).get("qualType", "")
            if t.startswith("struct "):
                out.setdefault("typedef:" + n["name"], t[len("struct "):])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="a build directory with compile_commands.json")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the source tree to measure (default: this script's)")
    ap.add_argument("--start", default="bw_loader_next")
    ap.add_argument("--scope", action="append", help="rooms: files under these folders of "
                    "--root (default: client/lib)")
    ap.add_argument("--per-call", action="store_true", help="a call through an ops table "
                    "visits only the operation called in each table (default: the table's every "
                    "operation, in order: a back end is read as one)")
    ap.add_argument("--verbose", action="store_true", help="print each stay and its functions")
    args = ap.parse_args()
    scope = [os.path.join(os.path.realpath(args.root), s) + os.sep
             for s in (args.scope or ["client/lib"])]
    with open(os.path.join(args.build, "compile_commands.json")) as f:
        entries = json.load(f)
    # One entry per source of the library (the same flags serve a --root elsewhere: only the
    # file's place under the tree matters).
    by_rel, flags = {}, None
    for e in entries:
        src = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if "/client/lib/" in src and flags is None:
            flags = compile_args(e)
    if flags is None:
        sys.exit("walk.py: no client/lib source in %s/compile_commands.json" % args.build)
    root = os.path.realpath(args.root)
    for s in scope:
        for dirpath, _, files in os.walk(s):
            for name in files:
                if name.endswith(".c"):
                    p = os.path.join(dirpath, name)
                    by_rel[os.path.relpath(p, root)] = p
    # Include paths of the build's own tree point at --root's instead.
    build_root = None
    for e in entries:
        src = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if "/client/lib/" in src:
            build_root = src[:src.index("/client/lib/")]
            break
    flags = [a.replace(build_root, root) if build_root and a.startswith(("-I" + build_root,
                                                                          build_root)) else a
             for a in flags]

    def dump(path):
        r = subprocess.run(["clang", "-Xclang", "-ast-dump=json", "-fsyntax-only", "-w"] + flags
                           + [path], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("walk.py: clang failed on %s:\n%s" % (path, r.stderr[-2000:]))
        return path, json.loads(r.stdout)

    g = Graph()
    fields = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for path, ast in pool.map(dump, sorted(by_rel.values())):
            g.add_file(path, ast)
            for k, v in record_fields(ast).items():
                fields.setdefault(k, v)
            del ast
    # field name -> the functions tables put there
    ops = {}
    for type_name, rows in g.tables.items():
        rec = type_name[len("struct "):] if type_name.startswith("struct ") else \
            fields.get("typedef:" + type_name, type_name)
        names = fields.get(rec)
        if not names:
            continue
        for row in rows:
            for field, fn in zip(names, row):
                if fn and row not in ops.setdefault(field, []):
                    ops[field].append(row)

    def names_of(tables, field):
        """(table, index of field in it) for each table."""
        out = []
        for type_name, rows in g.tables.items():
            rec = type_name[len("struct "):] if type_name.startswith("struct ") else \
                fields.get("typedef:" + type_name, type_name)
            for row in rows:
                if row in tables and field in fields.get(rec, []):
                    out.append((row, fields[rec].index(field)))
        return out

    def resolve(name, where):
        """The function `name` as file `where` sees it: its own static one, else external."""
        return (where, name) if (where, name) in g.defined else (None, name)

    if (None, args.start) not in g.defined:
        sys.exit("walk.py: %s is not defined under %s" % (args.start, ", ".join(scope)))
    order, seen = [], set()

    def follow(fn):
        seen.add(fn)
        order.append(fn)
        where, refs = g.uses[fn]
        for ref in refs:
            if ref.startswith("."):  # an operation of the tables with that field
                tables = ops.get(ref[1:], [])
                if args.per_call:  # only the operation called, in each table
                    targets = [resolve(row[i][1], row[i][0])
                               for row, i in names_of(tables, ref[1:]) if row[i]]
                else:  # the whole table: a back end is read as one
                    targets = [resolve(name, f) for row in tables for f, name in filter(None, row)]
            else:
                targets = [resolve(ref, where)]
            for t in targets:
                if t in g.defined and t not in seen:
                    follow(t)

    follow((None, args.start))
    stays = []
    for fn in order:
        room = os.path.relpath(g.defined[fn], root)
        if not stays or stays[-1][0] != room:
            stays.append((room, []))
        stays[-1][1].append(fn[1])
    rooms = []
    returns = 0
    for room, _ in stays:
        if room in rooms:
            returns += 1
        else:
            rooms.append(room)
    if args.verbose:
        left = set()
        for room, fns in stays:
            mark = "return" if room in left else "      "
            left.add(room)
            print("%s %-32s %s" % (mark, room, " ".join(fns)))
    print("walk from %s: %d functions, %d rooms, %d stays, %d returns" %
          (args.start, len(order), len(rooms), len(stays), returns))


if __name__ == "__main__":
    main()
