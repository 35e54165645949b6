"""No import circles in the meshd package: no two of python/meshd/*.py import each other through any path.

Every import counts, wherever it is written (at the top, inside a function, under ``if
TYPE_CHECKING:``): ``from .x import y``, ``from . import x``, ``import meshd.x`` and ``from meshd import
x``. Reading the sources needs no built extension.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def package_dir() -> Path:
    """The package's sources: the repository's, else (a bundle, a wheel installed alone) those of
    the installed package, which are the same files."""
    here = Path(__file__).resolve().parents[1] / "python" / "meshd"
    if here.is_dir():
        return here
    spec = importlib.util.find_spec("meshd")
    assert spec is not None and spec.origin is not None, "meshd is neither beside these tests nor installed"
    return Path(spec.origin).parent


PACKAGE = package_dir()


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules (names of ``modules``) that the file at ``path`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            within = node.level == 1 or (node.level == 0 and (node.module or "").split(".")[0] == "meshd")
            if not within:
                continue
            parts = (node.module or "").split(".")
            sub = parts[0] if node.level == 1 else (parts[1] if len(parts) > 1 else "")
            if sub:
                names.append(sub)
            else:
                # `from . import x` / `from meshd import x`: each name may be a module.
                names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(a.name.split(".")[1] for a in node.names if a.name.startswith("meshd."))
        found.update(n for n in names if n in modules)
    found.discard(path.stem)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` (a directory of .py files) and the package modules it imports."""
    modules = {p.stem for p in package.glob("*.py")}
    return {p.stem: imports_of(p, modules) for p in sorted(package.glob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop per group of modules that import each other, each ending where it began."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        # Breadth first from `start`: the shortest way back to it, if there is one.
        parent: dict[str, str] = {}
        queue = [start]
        while queue:
            at = queue.pop(0)
            for nxt in sorted(graph[at]):
                if nxt not in parent:
                    parent[nxt] = at
                    queue.append(nxt)
        if start not in parent:
            continue
        loop = [start]
        at = parent[start]
        while at != start:
            loop.append(at)
            at = parent[at]
        loop.append(start)
        loop.reverse()
        found.append(loop)
        seen.update(loop)
    return found


def test_no_module_of_the_package_imports_itself_through_another() -> None:
    graph = import_graph(PACKAGE)
    assert {"control", "service", "__init__"} <= set(graph), f"not the package's sources: {sorted(graph)}"
    assert "control" in graph["service"], "service.py builds on control.py"
    loops = cycles(graph)
    assert not loops, "import circles in meshd: " + "; ".join(" -> ".join(loop) for loop in loops)


def test_the_finder_sees_a_planted_circle_in_any_form_of_import(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("from .a import A\n")
    (tmp_path / "a.py").write_text("A = 1\n\ndef f():\n    import meshd.b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from meshd import c\n")
    (tmp_path / "c.py").write_text("'''from . import a'''\nimport json\n")
    graph = import_graph(tmp_path)
    assert graph == {"__init__": {"a"}, "a": {"b"}, "b": {"c"}, "c": set()}, graph
    assert cycles(graph) == []
    (tmp_path / "c.py").write_text("from . import a, json\n")
    assert cycles(import_graph(tmp_path)) == [["a", "b", "c", "a"]]
