"""gmlp's packages form floors, and imports point down: a reading of every import in ``gmlp/``
(module level and inside functions), by the standard library's ``ast``. The tests follow the same
tree, and a test module imports no other test module (shared helpers live in ``tests.support``).

``python -m tests.test_layering`` prints the floors, the upward imports and the import cycles.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "gmlp"
TESTS = pathlib.Path(__file__).resolve().parent
# From the ground up: a module may import its own floor and those below.
FLOORS = ("system", "mxfp8", "fp8_blockwise", "contract", "triton_ref", "cutedsl", "dispatch", "debug", "layer",
          "integrations", "bench", "__main__", "__init__")
def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the gmlp modules it imports (``from gmlp.x import y`` counts y when y is a module)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gmlp"):
                graph[name].add(node.module)
                graph[name].update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.startswith("gmlp"))
    return graph


def floor(module: str) -> int | None:
    """The floor of a gmlp module (None for the package itself)."""
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 else None


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets
            if floor(a) is not None and floor(b) is not None and floor(b) > floor(a)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), a package's
    ``__init__`` edges to its own modules left out (importing a package runs its ``__init__``)."""
    edges = {a: {b for b in targets if b in graph and not b.startswith(a + ".")} for a, targets in graph.items()}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_floor():
    top = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top <= set(FLOORS), sorted(top - set(FLOORS))


def test_imports_point_down():
    assert upward(imports()) == set()


KERNEL_PACKAGES = ("triton_ref", "cutedsl")
BELOW_THE_KERNELS = ("system", "mxfp8", "fp8_blockwise", "contract")


def test_kernels_import_only_the_format_the_contract_and_their_own_package():
    """A kernel package reads the format and the contract, never another backend (each is a twin
    of the others, not a client) nor anything above."""
    graph = imports()
    crossing = {(a, b) for a, targets in graph.items() for b in targets
                if floor(a) is not None and FLOORS[floor(a)] in KERNEL_PACKAGES and floor(b) is not None
                and FLOORS[floor(b)] not in (*BELOW_THE_KERNELS, FLOORS[floor(a)])}
    assert crossing == set()


def test_no_import_cycle():
    assert cycles(imports()) == []


def _tests_imported_by(path: pathlib.Path) -> set[str]:
    """The ``tests.`` modules a test file imports (module level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tests"))
    return found


def test_no_test_module_imports_another():
    """Tests share code through ``tests.support`` only, so that a test file can move or go alone."""
    reaching = {str(path.relative_to(TESTS.parent)): sorted(m for m in _tests_imported_by(path)
                                                             if not m.startswith("tests.support"))
                for path in TESTS.rglob("test_*.py")}
    assert {name: modules for name, modules in reaching.items() if modules} == {}


if __name__ == "__main__":
    graph = imports()
    print("floors, from the ground up:", " -> ".join(FLOORS))
    for a, b in sorted(upward(graph)):
        print(f"upward: {a} -> {b}")
    for component in cycles(graph):
        print("cycle:", " <-> ".join(component))
    print(f"{sum(map(len, graph.values()))} imports among {len(graph)} modules")
