"""The package's import structure, read statically from the source (no module is imported).

- No module-level import cycle anywhere in `ddpfix`: every module can be imported first, in any order, and a layer
  never needs the one above it to load. Nor any cycle once the imports inside functions are counted too (not those
  under `if TYPE_CHECKING:`, which never run): a function-local import never hides one.
- The package never imports the repository's generators (`tools/`: the docs and the fix tasks' tags), which are not
  shipped.
- A function-local import (an `import` inside a function) is allowed only where it keeps the CLI's start fast or the
  collection's controller plugins' import light (or breaks an import cycle), and says so in a `# reason` comment on
  its line or on a comment line right above its block of imports. `test_function_local_imports_say_why` fails for
  every such import without one, in the whole package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "controller" / "ddpfix"  # the source, not the installed copy


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (`ddpfix.x.y`; a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: top level, and inside top-level if/try/with blocks (not
    `if TYPE_CHECKING:`, not inside functions or classes' methods)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _module_level(node.body)


def _targets(node: ast.Import | ast.ImportFrom, here: str, modules: dict[str, Path]) -> set[str]:
    """The ddpfix modules an import statement loads (its module, and a submodule named in `from pkg import sub`)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package of `here`, `level - 1` packages up
            pkg = here.split(".") if modules[here].name == "__init__.py" else here.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        names = [base, *(f"{base}.{a.name}" for a in node.names)]
    out = set()
    for name in names:
        while name and name not in modules:  # `import ddpfix.x.y` loads ddpfix.x.y; a name of a module's attribute
            name = name.rpartition(".")[0]   # stands for that module
        if name and not here.startswith(f"{name}."):  # a package above `here` is loaded first anyway
            out.add(name)
    return out


def _all_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level and inside functions and classes, not under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _all_imports(ast.Module(body=[child], type_ignores=[])))
        else:
            yield from _all_imports(node)


def _graph(local: bool = False) -> dict[str, set[str]]:
    """Module -> the ddpfix modules it imports when it is imported (`local`: also those its functions import)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        deps = set()
        for node in (_all_imports(tree) if local else _module_level(tree.body)):
            deps |= _targets(node, name, modules)
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_scan_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_scan_reads_module_level_imports_only() -> None:
    tree = ast.parse("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ddpfix.x\n"
                     "try:\n    import ddpfix.y\nexcept ImportError:\n    pass\ndef f():\n    import ddpfix.z\n")
    assert [getattr(n, "module", None) or n.names[0].name for n in _module_level(tree.body)] == [
        "os", "typing", "ddpfix.y"]


def test_no_module_level_import_cycle() -> None:
    graph = _graph()
    assert "ddpfix.errors" in graph and graph["ddpfix.errors"] == set()  # errors imports nothing of ddpfix
    cycles = _cycles(graph)
    assert not cycles, "module-level import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycle_with_function_local_imports() -> None:
    """The rule registry once imported the README generator inside a function, which closed a 35-module cycle
    (registry -> readme -> cli/lab -> app -> inventory -> rules); the generators now live in tools/."""
    graph = _graph(local=True)
    assert graph["ddpfix.rules.registry"] and "ddpfix.readme" not in graph
    cycles = _cycles(graph)
    assert not cycles, "import cycles, function-local imports counted: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_scan_of_local_imports_skips_type_checking_only() -> None:
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ndef f():\n    import d\n"
                     "class K:\n    def m(self):\n        from e import x\n")
    assert [getattr(n, "module", None) or n.names[0].name for n in _all_imports(tree)] == ["a", "c", "d", "e"]


def test_the_package_never_imports_the_generators() -> None:
    """tools/ (the docs' and the tags' generators) is the repository's: nothing of the package names it."""
    found = [f"{name}:{node.lineno}" for name, path in _modules().items()
             for node in _all_imports(ast.parse(path.read_text(encoding="utf-8")))
             if any(n == "tools" or n.startswith("tools.")
                    for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]))]
    assert not found, found


def test_model_imports_nothing_of_ddpfix_outside_model() -> None:
    graph = _graph()
    outside = {m: sorted(d for d in deps if not d.startswith("ddpfix.model")) for m, deps in graph.items()
               if m.startswith("ddpfix.model")}
    assert outside and not any(outside.values()), outside


def _local_imports_without_reason() -> list[tuple[str, int, str]]:
    """(module, line, the import) for each import inside a function with no comment on its line."""
    out = []
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text, str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not _says_why(lines, node.lineno - 1):
                    out.append((name, node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(out))


_DIRECTIVE = re.compile(r"#\s*(type:\s*ignore(\[[^]]*\])?|noqa(:[\sA-Z0-9,]*)?)\s*")


def _says_why(lines: list[str], i: int) -> bool:
    """Line `i` (an import) has a comment of its own (not only `# type: ignore` / `# noqa`), or it is one of a block
    of imports right below a comment line."""
    _, sep, comment = lines[i].partition("#")
    if sep and _DIRECTIVE.sub("", "#" + comment).strip():
        return True
    above = lines[i - 1].strip() if i > 0 else ""
    if above.startswith("#"):
        return True
    return above.startswith(("import ", "from ")) and _says_why(lines, i - 1)


def test_a_reason_is_a_comment_of_its_own() -> None:
    lines = ["    import a  # type: ignore[x]", "    # slow import: CLI start", "    import b", "    from c import d",
             "", "    import e  # noqa: F401", "    import f  # loads slowly"]
    assert [_says_why(lines, i) for i in (0, 2, 3, 5, 6)] == [False, True, True, False, True]


def test_function_local_imports_say_why() -> None:
    found = [f"{n}:{line}: {t}" for n, line, t in _local_imports_without_reason()]
    assert not found, "function-local imports without a '# reason' comment:\n" + "\n".join(found)


def test_the_collection_plugins_never_load_the_cli() -> None:
    """The controller plugins import ddpfix inside ansible-playbook: what they load stays clear of the CLI layer."""
    graph = _graph()
    plugins = Path(__file__).resolve().parents[2] / "plugins"
    used = {m for p in plugins.rglob("*.py") for m in re.findall(r"""ddpfix\(["'](ddpfix[\w.]*)["']\)""", p.read_text())}
    assert used, "no ddpfix(...) import found in plugins/"
    seen: set[str] = set()
    todo = [m for m in used if m in graph]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not {m for m in seen if m == "ddpfix.app" or m.startswith("ddpfix.cli")}, sorted(seen)
