"""Writes docs/refused.md: every refusal of the project's code, the message it prints, grouped by where it is
raised. The refusals are collected from the source (every `raise X(...)` of one of the project's error classes,
and of ValueError/TypeError in the library API; a re-raise of another error's message is not a refusal of its
own), so the page cannot miss one: tests/test_docs.py regenerates it
and fails when the page is not current.

    .venv/bin/python tools/refusals.py          # rewrite docs/refused.md
    .venv/bin/python tools/refusals.py --check  # exit 1 when docs/refused.md is not current
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "refused.md"
SOURCES = ["bert_ipu", "data", "run_pretraining.py", "run_squad.py", "run_glue.py", "run_causal_lm.py",
           "run_profiling.py"]

# the project's errors, each printed as one `error:` line by its command, and what each one is about
ERRORS = {
    "ConfigError": "a config or an override that no run can mean",
    "RunError": "a run that cannot start or go on (data, checkpoints, topology, faults)",
    "Interrupted": "a run stopped by a signal (exit 128 + the signal)",
    "DataInputError": "input text, JSON lines, vocabularies and tokenizers",
    "WikipediaError": "a Wikipedia dump or its prepared text",
    "DatasetError": "a dataset's manifest, shards or layout",
    "PackingInputError": "length histograms and packing settings",
    "EngineError": "the data jobs' engine (local pool or Dask)",
    "GlueInputError": "GLUE files and datasets",
    "SquadInputError": "SQuAD files",
    "ProfilingError": "profiling settings",
    "ExportError": "the Hugging Face export",
    "OutputBusy": "an output another process writes",
    "CustomOpNotBuilt": "the C++ mask op",
    "ArgumentTypeError": "a command-line value (argparse)",
    "ValueError": "the Python API (bad arguments)",
    "TypeError": "the Python API (bad argument types)",
}
AREAS = [("bert_ipu/packing", "Packing"), ("bert_ipu/data", "Data preparation and loading"), ("data/", "Data commands"),
         ("bert_ipu/models", "Models and export"), ("bert_ipu/engine", "Training engine"),
         ("bert_ipu/tasks", "Tasks"), ("bert_ipu/hf.py", "Hugging Face integration"), ("", "Configs and command line")]


def _text(node: ast.AST, names: dict | None = None) -> str:
    """A message as a reader sees it: literal text, ‹name› for a value filled in, … for a computed part; a local
    variable holding the message (`names`: the function's assignments) is read through."""
    if names and isinstance(node, ast.Name) and node.id in names:
        return _text(names[node.id])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, names) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        inner = node.value
        if isinstance(inner, (ast.Name, ast.Attribute)):
            return f"‹{ast.unparse(inner)}›"
        if isinstance(inner, ast.Subscript) and isinstance(inner.value, (ast.Name, ast.Attribute)):
            return f"‹{ast.unparse(inner)}›"
        return "…"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left, names) + _text(node.right, names)
    if isinstance(node, ast.IfExp):
        a, b = _text(node.body, names), _text(node.orelse, names)
        return a if a == b else f"[{a} | {b}]"
    if isinstance(node, ast.Name):
        return f"‹{node.id}›"
    return "…"


def _error_name(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name if name in ERRORS else None


def collect(root: Path = ROOT) -> list[tuple[str, str, str, str]]:
    """(file, function, error class, message) of every refusal, in file order."""
    files = []
    for source in SOURCES:
        path = root / source
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes: list[str] = []
        assigned: list[dict] = [{}]

        def visit(node: ast.AST) -> None:
            named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if named:
                scopes.append(node.name)
                assigned.append({t.id: a.value for a in ast.walk(node) if isinstance(a, ast.Assign)
                                 for t in a.targets if isinstance(t, ast.Name)
                                 and isinstance(a.value, (ast.JoinedStr, ast.Constant, ast.BinOp, ast.IfExp))})
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                kind = _error_name(node.exc)
                if kind and node.exc.args:
                    message = " ".join(_text(node.exc.args[0], assigned[-1]).split())
                    if any(c.isalpha() for c in re.sub("‹[^›]*›", "", message)):  # words of its own
                        found.append((rel, ".".join(scopes) or "(module)", kind, message))
            for child in ast.iter_child_nodes(node):
                visit(child)
            if named:
                scopes.pop()
                assigned.pop()

        visit(tree)
    return found


def _area(rel: str) -> str:
    return next(title for prefix, title in AREAS if rel.startswith(prefix))


def render(found: list[tuple[str, str, str, str]]) -> str:
    lines = ["# What is refused", "",
             "<!-- generated by tools/refusals.py from the source; tests/test_docs.py fails when it is not current -->",
             "",
             "Every refusal in the code, with the message it prints: a command prints it as one `error:` line and "
             "exits with code 2 (a run stopped by a signal: 128 + the signal), having written nothing (outputs are "
             "written under a temporary name, then renamed). In a message, `‹name›` is a value filled in from your "
             "input and `…` a computed part (a list, a count); `[a | b]` is one of two wordings. How the faults "
             "(kills, full disks, damaged checkpoints) are handled is in "
             "[Training engine](training.md#what-is-refused-what-is-skipped-and-counted).", "",
             f"{len(found)} refusals, by kind:", "", "| error | about | count |", "|---|---|---|"]
    for kind, about in ERRORS.items():
        n = sum(1 for f in found if f[2] == kind)
        if n:
            lines.append(f"| `{kind}` | {about} | {n} |")
    for _, title in AREAS:
        group = [f for f in found if _area(f[0]) == title]
        if not group:
            continue
        lines += ["", f"## {title}", ""]
        current = None
        for rel, scope, kind, message in group:
            if rel != current:
                lines += ([""] if current else []) + [f"`{rel}`", ""]
                current = rel
            text = "".join("&lt;" if c == "<" else "\\" + c if c in "\\`*_[]|#" else c for c in message)
            lines.append(f"- `{scope}` ({kind}): {text}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/refused.md from the refusals in the source.")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/refused.md is not current")
    args = parser.parse_args(argv)
    page = render(collect())
    if args.check:
        current = PAGE.is_file() and PAGE.read_text(encoding="utf-8") == page
        if not current:
            print(f"{PAGE} is not current: run python tools/refusals.py", file=sys.stderr)
        return 0 if current else 1
    tmp = PAGE.with_suffix(".md.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(PAGE)
    print(f"wrote {PAGE.relative_to(ROOT)}: {page.count(chr(10) + '- ')} refusals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
