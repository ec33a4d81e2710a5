#!/usr/bin/env python3
"""Counts the review rules of issue 53 over crates/*/src (test modules left out):

  string-errors   error variants whose only field is a String: `V(String)` or `V { f: String }`
                  in enums that derive thiserror's Error (`Error)]` in the derive line)
  result-string   functions returning `Result<_, String>`
  long-fns        functions of more than 150 lines (shipped code: src/, not tests or examples)

Usage: scripts/dev/code-metrics.py [string-errors|result-string|long-fns|all] [--skip CRATE]...
Each prints one line per hit (crate/path:line and the name) and a total; `--skip cli` leaves a
crate out (the CLI may use strings: it is the skin that prints them).
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LIMIT = 150


def sources(skip):
    base = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(base)):
        src = os.path.join(base, crate, "src")
        if crate in skip or not os.path.isdir(src):
            continue
        for dp, _, fs in os.walk(src):
            for f in sorted(fs):
                if f.endswith(".rs"):
                    p = os.path.join(dp, f)
                    text = open(p, encoding="utf-8").read()
                    # Test modules are not shipped code.
                    text = re.split(r"#\[cfg\(test\)\]\s*\n\s*mod tests", text)[0]
                    yield os.path.relpath(p, base), blank_literals(text)


def blank_literals(text):
    """Empties string and char literals (keeping their line breaks), so that braces, quotes and
    `;` inside them do not count as code."""

    def keep_lines(m):
        return m.group(0)[0] + "\n" * m.group(0).count("\n") + m.group(0)[-1]

    text = re.sub(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^'\\\n])'", "' '", text)
    text = re.sub(r'r(#+)".*?"\1', lambda m: "\"" + "\n" * m.group(0).count("\n") + "\"", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', keep_lines, text, flags=re.S)
    # Comments (doc examples included) are not code.
    return re.sub(r"//[^\n]*", "", text)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def block(text, start):
    """The text from `start` (an opening brace) to its matching close."""
    depth = 0
    i = start
    in_str = False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                return text[start:]
            continue
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    return text[start:]


def string_errors(skip):
    hits = []
    for rel, text in sources(skip):
        for m in re.finditer(r"#\[derive\([^)]*\bError\b[^)]*\)\](?:\s*#\[[^\]]*\]|\s*//[^\n]*)*\s*pub(?:\([^)]*\))?\s+enum\s+(\w+)[^{]*\{", text):
            body = block(text, m.end() - 1)[1:-1]
            body = re.sub(r"//[^\n]*", "", body)
            body = re.sub(r"#\[[^\]]*\]", "", body)
            for v in re.finditer(r"\b([A-Z]\w*)\s*(\((?:[^()]|\([^()]*\))*\)|\{[^{}]*\})?\s*(,|$)", body):
                fields = v.group(2)
                if not fields:
                    continue
                inner = fields[1:-1].strip().rstrip(",")
                parts = [p.strip() for p in inner.split(",") if p.strip()]
                if len(parts) != 1:
                    continue
                ty = parts[0].split(":")[-1].strip() if fields[0] == "{" else parts[0]
                ty = re.sub(r"^pub\s+", "", ty)
                if ty in ("String", "std::string::String"):
                    pos = m.end() + body.find(v.group(0))
                    hits.append(f"{rel}:{line_of(text, pos)} {m.group(1)}::{v.group(1)}")
    return hits


def result_string(skip):
    hits = []
    for rel, text in sources(skip):
        for m in re.finditer(r"\bfn\s+(\w+)[^{;]*?->\s*Result<[^{;]*,\s*String>\s*(where[^{]*)?\{", text):
            hits.append(f"{rel}:{line_of(text, m.start())} {m.group(1)}")
    return hits


def long_fns(skip):
    hits = []
    for rel, text in sources(skip):
        for m in re.finditer(r"\bfn\s+(\w+)\s*(<[^{;]*?>)?\s*\([^{;]*?\{", text):
            body = block(text, m.end() - 1)
            n = body.count("\n") + 1
            if n > LIMIT:
                hits.append((n, f"{rel}:{line_of(text, m.start())} {m.group(1)} {n} lines"))
    return [h for _, h in sorted(hits, reverse=True)]


def main(argv):
    what = "all"
    skip = set()
    it = iter(argv)
    for a in it:
        if a == "--skip":
            skip.add(next(it))
        else:
            what = a
    checks = {"string-errors": string_errors, "result-string": result_string, "long-fns": long_fns}
    if what != "all" and what not in checks:
        sys.exit(__doc__)
    for name, f in checks.items():
        if what in ("all", name):
            hits = f(skip)
            for h in hits:
                print(f"  {h}")
            print(f"{name}: {len(hits)}")


if __name__ == "__main__":
    main(sys.argv[1:])
