"""The layout of the library: data flows one way, and so do the imports.

packing -> data -> models -> config -> engine -> tasks -> cli: a module imports only from its own layer or a
lower one, no two modules import each other (directly or around a circle), and no module imports its own
package's `__init__` (a package's `__init__` only re-exports or registers). Every task folder registers itself
and every entry point is a shim of the one command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bert_ipu"

# the layers, lowest first; a module belongs to the first prefix that matches its name
LAYERS = [("bert_ipu.files", "bert_ipu.processes", "bert_ipu.arguments"), ("bert_ipu.packing",), ("bert_ipu.data", "bert_ipu.hf"), ("bert_ipu.ops", "bert_ipu.models"),
          ("bert_ipu.config",), ("bert_ipu.engine",), ("bert_ipu.tasks",), ("bert_ipu.cli", "bert_ipu.__main__")]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    if name == "bert_ipu":
        return -1  # the root package's docstring
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS")


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The bert_ipu modules `name` imports, at module level or inside functions: `from . import x` where x is a
    submodule counts as importing x, `from .pkg import y` as importing pkg (its __init__) unless y is a module."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                module = ".".join(anchor + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = []
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.append(sub if sub in known else module)
        else:
            continue
        found |= {t for t in targets if t == "bert_ipu" or t.startswith("bert_ipu.")}
    return {t for t in found if t in known} - {name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_imports_flow_one_way():
    """No module imports from a higher layer (packing < data < models < config < engine < tasks < cli)."""
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in graph().items() for b in sorted(targets) if layer(b) > layer(a)]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    """No two modules reach each other through imports (Tarjan's strongly connected components)."""
    g = graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_module_imports_its_own_package():
    """A package's __init__ re-exports or registers; the modules inside never import it (an upward import that
    makes circles likely)."""
    bad = [f"{a} imports {b}" for a, targets in graph().items() for b in targets
           if a.startswith(b + ".") and (ROOT / Path(*b.split("."))).is_dir()]
    assert not bad, bad


def test_the_checker_sees_an_upward_import_and_a_circle(tmp_path):
    """The checks above can fail: a data module importing the engine is upward, and two modules importing each
    other are a circle."""
    known = {"bert_ipu.data.a": None, "bert_ipu.engine.b": None, "bert_ipu.data.c": None}
    a = tmp_path / "a.py"
    a.write_text("from ..engine import b\nfrom . import c\n")
    c = tmp_path / "c.py"
    c.write_text("def f():\n    from .a import x\n")
    assert imports("bert_ipu.data.a", a, known) == {"bert_ipu.engine.b", "bert_ipu.data.c"}
    assert imports("bert_ipu.data.c", c, known) == {"bert_ipu.data.a"}
    assert layer("bert_ipu.engine.b") > layer("bert_ipu.data.a")


def test_every_task_folder_registers_and_every_entry_point_is_a_shim():
    """Each folder of bert_ipu/tasks/ is a task found by its kind, and the entry point its config class names is
    `python -m bert_ipu` or a file of a few lines calling the one command line."""
    from bert_ipu.tasks import registry

    folders = sorted(p.name for p in (PACKAGE / "tasks").iterdir() if (p / "__init__.py").is_file())
    specs = registry()
    assert sorted(s.config.__module__.split(".")[2] for s in specs.values()) == folders
    for spec in (s for s in specs.values() if s.script != "-m bert_ipu"):
        script = ROOT / spec.script
        code = [line for line in script.read_text().splitlines() if line.strip() and not line.startswith('"""')]
        assert len(code) <= 3 and f'run("{spec.kind}", __file__)' in code[-1], script
