"""The layout's dependency rules (issue 12), read from the source with `ast`.

main_broker: the core modules at its top level (everything but broker.py) import no
sub-package; each sub-package imports only the core and the sub-packages below it in LAYERS,
type-only imports included, so there is no cycle between them; no module of main_broker but
broker.py itself imports main_broker.broker, not even under TYPE_CHECKING (the request
handlers see the broker as `main_broker.api.services.BrokerServices`, the other sub-packages
and the core through their own Protocols); every sub-package says in its __init__.py what it
is for and what it may import.

Top level: fleet -> main_broker, proxy_broker (and cost_report) -> the shared lower packages;
nothing imports fleet, and main_broker and proxy_broker never import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "main_broker"

# main_broker's sub-packages, lowest first: each may import the core and those before it.
LAYERS = ["security", "objects", "groups", "cluster", "txn", "api"]

LOWER = {"kafka_wire", "internal_rpc", "zone_router", "shared_wal", "s3_commit", "telemetry"}
PRODUCT = LOWER | {"main_broker", "proxy_broker", "cost_report", "fleet"}
MAY_IMPORT = {
    **{p: LOWER for p in LOWER},
    "main_broker": LOWER,
    "proxy_broker": LOWER,
    "cost_report": LOWER,
    "fleet": PRODUCT,
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported name, line, type-only) for every import in the file, nested ones included;
    `from a import b` yields `a.b` (resolved to a module by the caller)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, type_only: bool) -> Iterator[tuple[str, int, bool]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, type_only
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, type_only
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, type_only)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, type_only)

    yield from visit(ast.parse(path.read_text(), str(path)), False)


MODULES = {_module_name(p): p for p in sorted(MAIN.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The main_broker module a dotted import name refers to (its longest module prefix)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in MODULES:
            return candidate
    return None


def _layer(module: str) -> str:
    """'broker', 'core' or the sub-package of a main_broker module."""
    parts = module.split(".")
    if module == "main_broker.broker":
        return "broker"
    if len(parts) <= 2 and not (MAIN / parts[-1]).is_dir():
        return "core"
    return parts[1]


def _main_edges() -> Iterator[tuple[str, str, int, bool]]:
    """(importer, imported, line, type-only) between main_broker modules."""
    for module, path in MODULES.items():
        for name, line, type_only in _imports(path):
            target = _resolve(name)
            if target is not None and target != module:
                yield module, target, line, type_only


def test_every_subpackage_is_a_layer_with_a_docstring() -> None:
    dirs = {
        p.parent.relative_to(MAIN).parts[0]
        for p in MAIN.rglob("*.py")
        if p.parent != MAIN and "__pycache__" not in p.parts
    }
    assert dirs == set(LAYERS), "a new sub-package needs its place in LAYERS"
    for pkg in LAYERS:
        init = MAIN / pkg / "__init__.py"
        assert init.exists(), f"main_broker/{pkg} has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 10, f"main_broker/{pkg}/__init__.py: say what it is for"


def test_subpackages_import_only_downward() -> None:
    wrong = []
    for importer, imported, line, _type_only in _main_edges():
        src, dst = _layer(importer), _layer(imported)
        where = f"{importer}:{line} imports {imported}"
        if src in ("core", "broker") or dst == "broker":
            continue  # the broker's own imports; importing it: test_nothing_imports_the_broker
        if dst != "core" and LAYERS.index(dst) > LAYERS.index(src):
            wrong.append(f"{where}: {dst} is above {src} in LAYERS")
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_the_broker() -> None:
    """broker.py imports the handlers and every sub-package, so any import of it from
    main_broker, even type-only, is a cycle: the others see the broker through Protocols
    (mypy checks that `MainBroker` satisfies them where broker.py passes `self`)."""
    wrong = [
        f"{importer}:{line} imports {imported}" + (" (type-only)" if type_only else "")
        for importer, imported, line, type_only in _main_edges()
        if _layer(imported) == "broker"
    ]
    assert not wrong, "only broker.py may import main_broker.broker:\n" + "\n".join(wrong)


def test_core_imports_no_subpackage() -> None:
    wrong = [
        f"{importer}:{line} imports {imported}"
        for importer, imported, line, _type_only in _main_edges()
        if _layer(importer) == "core" and _layer(imported) in LAYERS
    ]
    assert not wrong, "the core is the bottom layer:\n" + "\n".join(wrong)


def test_no_cycles_between_subpackages() -> None:
    graph: dict[str, set[str]] = {p: set() for p in LAYERS}
    for importer, imported, _line, _type_only in _main_edges():
        src, dst = _layer(importer), _layer(imported)
        if src in graph and dst in graph and src != dst:
            graph[src].add(dst)
    cycles: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.add(" -> ".join([*path[path.index(nxt) :], nxt]))
            else:
                walk(nxt, [*path, nxt])

    for start in LAYERS:
        walk(start, [start])
    assert not cycles, "\n".join(sorted(set(cycles)))


def test_top_level_packages_keep_their_direction() -> None:
    seen: dict[str, set[str]] = {p: set() for p in PRODUCT}
    wrong = []
    for package in sorted(PRODUCT):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, line, _type_only in _imports(path):
                top = name.split(".")[0]
                if top in PRODUCT and top != package:
                    seen[package].add(top)
                    if top not in MAY_IMPORT[package]:
                        wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert seen["fleet"] >= {"main_broker", "proxy_broker"}  # the scan sees imports
    assert not any("fleet" in deps for deps in seen.values())
    assert "proxy_broker" not in seen["main_broker"]
    assert "main_broker" not in seen["proxy_broker"]
    assert not wrong, "\n".join(wrong)
