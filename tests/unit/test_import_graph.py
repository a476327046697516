"""No import cycles among the product modules (docs/import-graph.md).

The graph is grimp's (the one lint-imports checks its contracts on) over all five product packages
at once, so a cycle across packages counts as well as one inside a package. It holds every
import: at the top of a module, inside a function (a lazy import is still a dependency), and
under `if TYPE_CHECKING:`. A cycle through a type-only import cannot fail at import time, but it
is still a design cycle: neither module can be read, typed or moved without the other. Such a
cycle is broken the same way as any other (a Protocol the lower module owns, a shared type moved
down, a module split), not by hiding the import.

A cycle is a strongly connected component of more than one module: every module in it reaches
every other. The test names each one with the imports that hold it together (file and line).
"""

from __future__ import annotations

from collections.abc import Iterator

import grimp
import pytest

PACKAGES = (
    "tidalmq_core",
    "tidalmq_broker",
    "tidalmq_controller",
    "tidalmq_operator",
    "tidalmq_planner",
)

# The cycles not broken yet, each exactly as it stands (its set of modules). The list may only
# shrink: a cycle not listed fails the test, and so does a listed one that changed or is gone
# (remove it from here when you break it). Each is held only by imports under TYPE_CHECKING (the
# runtime graph has no cycle at all: test_no_cycle_at_import_time).
ALLOWED_CYCLES: tuple[frozenset[str], ...] = (
    # None left. The last one (the storage engine, its partitions and the log cleaner) was broken
    # by PartitionHost and CleanerHost: Protocols of what each uses of its engine, in their own
    # modules, as the WAL writer's WalSource. A new cycle is a design change to make on purpose.
)


def _graph(*, type_checking: bool) -> grimp.ImportGraph:
    return grimp.build_graph(
        *PACKAGES,
        include_external_packages=False,
        exclude_type_checking_imports=not type_checking,
        cache_dir=None,
    )


def _cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in modules:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _describe(graph: grimp.ImportGraph, cycle: frozenset[str]) -> str:
    """The cycle's modules and every import between two of them, with file line."""
    lines = [f"cycle of {len(cycle)} modules:"]
    for importer in sorted(cycle):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & cycle):
            details = graph.get_import_details(importer=importer, imported=imported)
            where = "; ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
            lines.append(f"  {importer} -> {imported} ({where})")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return _graph(type_checking=True)


def test_the_graph_covers_every_product_package(graph: grimp.ImportGraph) -> None:
    roots = {m.split(".")[0] for m in graph.modules}
    assert roots == set(PACKAGES)
    # an import inside a function is in the graph: cli.main imports tuning only for a broker
    assert "tidalmq_broker.tuning" in graph.find_modules_directly_imported_by("tidalmq_broker.cli")
    # and so is one under TYPE_CHECKING (this graph; the import-time one leaves it out)
    # (apis/fetch.py names the Broker only for its handler's annotation)
    assert "tidalmq_broker.broker" in graph.find_modules_directly_imported_by(
        "tidalmq_broker.apis.fetch"
    )


def test_no_import_cycle_but_the_listed_ones(graph: grimp.ImportGraph) -> None:
    cycles = _cycles(graph)
    new = [c for c in cycles if c not in ALLOWED_CYCLES]
    gone = [c for c in ALLOWED_CYCLES if c not in cycles]
    problems = [_describe(graph, c) for c in new]
    problems += [
        "listed in ALLOWED_CYCLES but not a cycle (any more, or not exactly): remove or update it: "
        + ", ".join(sorted(c))
        for c in gone
    ]
    assert not problems, "\n\n".join(problems)


def test_no_cycle_at_import_time() -> None:
    """Without the type-only imports there is no cycle at all, listed or not: a module's import
    never depends on the order in which its package's modules happen to be imported."""
    graph = _graph(type_checking=False)
    problems = [_describe(graph, c) for c in _cycles(graph)]
    assert not problems, "\n\n".join(problems)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check can fail: a two-module loop and a three-module loop, with a module outside."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e", "pkg.f"):
        graph.add_module(module)
    for importer, imported in (
        ("pkg.a", "pkg.b"),
        ("pkg.b", "pkg.a"),
        ("pkg.c", "pkg.d"),
        ("pkg.d", "pkg.e"),
        ("pkg.e", "pkg.c"),
        ("pkg.f", "pkg.a"),
    ):
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="x")
    assert sorted(map(sorted, _cycles(graph))) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d", "pkg.e"]]
    assert "pkg.a -> pkg.b (line 1: x)" in _describe(graph, frozenset({"pkg.a", "pkg.b"}))
