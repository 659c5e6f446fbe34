"""The project's import graph, read from the source (no module is imported): no circles, and an
engine (workers/rft) that knows nothing of Django.

Every import counts, at module level or inside a function: an import moved into a function to
break a circle still is one (the house rule: an import inside a function only delays a heavy
optional one, such as torch).
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("apps", "rftweb", "workers")
ENGINE = "workers.rft"
NOT_IN_THE_ENGINE = ("django", "apps", "rftweb", "workers.tasks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name the file imports, anywhere in it, relative imports resolved; for
    `from a import b`, both "a" and "a.b" (b may be a module or a name in a)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """{module: the project modules it imports}. An import of a.b.c counts as one of the project
    module it names most closely (a.b.c itself, else the package a.b)."""
    files = project_files()

    def project_module(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        targets = {project_module(name) for name in imported_names(module, path)}
        graph[module] = {target for target in targets if target and target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), as a path that ends
    where it starts."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):  # recursion depth: the longest import chain, a few dozen
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [circle_in(graph, group) for group in groups]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest circle from the group's first module back to it (breadth first)."""
    start = min(group)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in {group}")


def test_the_project_has_no_import_circles():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_engine_imports_nothing_of_django_or_the_apps():
    files = project_files()
    offending = [
        f"{module} imports {name}"
        for module, path in files.items() if module == ENGINE or module.startswith(f"{ENGINE}.")
        for name in sorted(imported_names(module, path))
        if any(name == banned or name.startswith(f"{banned}.") for banned in NOT_IN_THE_ENGINE)
    ]
    assert not offending, "\n".join(offending)


def test_the_checks_see_circles_and_relative_imports(tmp_path):
    """The walker itself: a relative import inside a function is resolved and closes a circle."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def later():\n    from .a import thing\n")
    assert imported_names("pkg.b", package / "b.py") == {"pkg.a", "pkg.a.thing"}
    assert imported_names("pkg", package / "__init__.py") == set()
    assert cycles({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg": set()}) == [["pkg.a", "pkg.b", "pkg.a"]]
