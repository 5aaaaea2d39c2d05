"""The package's layers (pyproject.toml [tool.importlinter]): imports go downward, no cycles, and imports inside
functions only where a heavy dependency is deferred on purpose, with a comment saying so."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib
from helpers import REPO

PACKAGE = REPO / "scaffold"
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
# Dependencies that take seconds to import (or are optional): a function may import them late, with a comment.
HEAVY = {"torch", "transformers", "vllm", "safetensors", "matplotlib", "ruff"}
# In-function imports known as debt: (file, imported module). A new one fails the test; none is left.
PENDING: set[tuple[str, str]] = set()


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120)


def test_the_import_contract_holds():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout and f"{len(CONFIG['contracts'])} kept" in proc.stdout, proc.stdout


def test_the_contract_can_fail(tmp_path):
    """The same layers upside down must break: the contract sees the real import graph."""
    contracts = [{**c, "layers": c["layers"][::-1]} if c["type"] == "layers" else c for c in CONFIG["contracts"]]
    config = tmp_path / "upside_down.toml"
    lines = ["[tool.importlinter]", f'root_package = "{CONFIG["root_package"]}"']
    for c in contracts:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{key} = {_toml(value)}" for key, value in c.items()]
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = lint_imports("--config", str(config))
    assert proc.returncode != 0 and "BROKEN" in proc.stdout, proc.stdout + proc.stderr


def _toml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_every_module_has_a_layer():
    """A new module says where it sits, or the layers contract would not check it."""
    (layers,) = [c for c in CONFIG["contracts"] if c["type"] == "layers"]
    placed = [f"scaffold.{name.strip()}" for layer in layers["layers"] for name in layer.split("|")]
    homeless = [m for m in modules() if not any(m == p or m.startswith(p + ".") for p in placed)
                and not any(p.startswith(m + ".") for p in placed)]  # a package whose parts are placed
    assert homeless == [] and len(placed) > 10, homeless


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def import_edges() -> dict[str, set[str]]:
    """Who imports whom, counting that importing a.b.c runs the __init__ of a and a.b first."""
    graph = grimp.build_graph("scaffold", cache_dir=None)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        targets = set()
        for target in graph.find_modules_directly_imported_by(module):
            parts = target.split(".")
            targets |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        # A module's own packages contain it; they are not what it depends on.
        edges[module] = {t for t in targets if t != module and not module.startswith(t + ".")}
    return edges


def test_no_import_cycles():
    edges = import_edges()
    assert len(edges) == len(modules()), sorted(set(modules()) ^ set(edges))
    assert _cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    edges = import_edges()
    edges["scaffold.errors"] = edges["scaffold.errors"] | {"scaffold.verify.static"}  # static imports errors
    assert any("scaffold.errors" in c and "scaffold.verify.static" in c for c in _cycles(edges))


def _function_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, commented) for each import inside a function of `path`."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    inside = {}  # an import in a nested function is found once
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update({n.lineno: n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))})
    out = []
    for node in sorted(inside.values(), key=lambda n: n.lineno):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        # The comment sits on the import, or on the line above the block of imports it opens.
        first = node.lineno
        while first - 1 >= 1 and lines[first - 2].strip().startswith(("import ", "from ")):
            first -= 1
        block = lines[max(first - 2, 0): node.end_lineno]
        commented = any("#" in line for line in block)
        out += [(node.lineno, name, commented) for name in names]
    return out


def test_imports_inside_functions_only_defer_heavy_dependencies():
    found = set()
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for line, name, commented in _function_imports(path):
            found.add((rel, name))
            if (rel, name) in PENDING:
                continue
            if name.split(".")[0] not in HEAVY:
                problems.append(f"{rel}:{line}: {name} is imported inside a function; import it at the top")
            elif not commented:
                problems.append(f"{rel}:{line}: {name} is deferred without a comment saying why")
    assert problems == [], "\n".join(problems)
    assert PENDING <= found, f"fixed, so remove from PENDING: {sorted(PENDING - found)}"


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    import json\n", [(2, "json", False)]),
    ("def f():\n    # torch takes seconds\n    import torch\n    from vllm import LLM\n", [(3, "torch", True),
                                                                                      (4, "vllm", True)]),
    ("import json\n\n\ndef f():\n    return json\n", []),
])
def test_function_imports_are_found(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source, encoding="utf-8")
    assert _function_imports(path) == expected
