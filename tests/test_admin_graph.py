"""The server-side DAG picture: layering, ordering, packing and the SVG (pure, no database)."""

from __future__ import annotations

import random
import re
import time
from itertools import combinations, pairwise

from parallel_mcp.admin import graph
from parallel_mcp.admin.graph import GraphEdge, GraphNode, layout, render_svg


def nodes(*keys: str, status: str = "queued") -> list[GraphNode]:
    return [GraphNode(id=key, label=key, status=status) for key in keys]


def edges(*pairs: str) -> list[GraphEdge]:
    return [GraphEdge(source=pair[0], target=pair[1]) for pair in pairs]


def brute_force_crossings(pairs):
    return sum(1 for (a1, b1), (a2, b2) in combinations(pairs, 2) if (a1 - a2) * (b1 - b2) < 0)


def test_longest_path_layers_and_dummy_vertices():
    lay = layout(nodes("a", "b", "c"), edges("ab", "bc", "ac"))
    assert {key: lay.vertices[key].layer for key in "abc"} == {"a": 0, "b": 1, "c": 2}
    dummies = [v for v in lay.vertices.values() if v.dummy]
    assert len(dummies) == 1 and dummies[0].layer == 1  # a -> c passes column 1
    chain = next(path for edge, path in lay.paths if (edge.source, edge.target) == ("a", "c"))
    assert chain[0] == "a" and chain[-1] == "c" and len(chain) == 3


def test_independent_tasks_share_the_first_column():
    lay = layout(nodes("x", "y", "z"), [])
    assert [len(column) for column in lay.layers] == [3]
    assert lay.crossings == 0


def test_barycenter_ordering_removes_avoidable_crossings():
    # a1 -> b2, a2 -> b1 cross in input order; the ordering uncrosses them.
    lay = layout(nodes("a1", "a2", "b1", "b2"), edges(("a1", "b2"), ("a2", "b1")))
    assert lay.crossings == 0
    # a complete bipartite K(2,2) always has exactly one crossing
    lay = layout(
        nodes("a1", "a2", "b1", "b2"),
        edges(("a1", "b1"), ("a1", "b2"), ("a2", "b1"), ("a2", "b2")),
    )
    assert lay.crossings == 1


def test_crossing_count_matches_brute_force():
    rng = random.Random(7)
    for _ in range(200):
        pairs = [(rng.randrange(8), rng.randrange(8)) for _ in range(rng.randrange(12))]
        assert graph._count_crossings(list(pairs)) == brute_force_crossings(pairs)


def test_isotonic_regression():
    assert graph._isotonic([1, 3, 2, 4], [1, 1, 1, 1]) == [1, 2.5, 2.5, 4]
    values = graph._isotonic([5, 4, 3], [1, 1, 1])
    assert values == [4, 4, 4]


def test_boxes_in_a_column_never_overlap():
    rng = random.Random(3)
    keys = [f"t{i}" for i in range(120)]
    pairs = []
    for index in range(1, len(keys)):
        for _ in range(rng.randint(1, 3)):
            pairs.append(GraphEdge(keys[rng.randrange(max(0, index - 15), index)], keys[index]))
    lay = layout(nodes(*keys), pairs)
    for column in lay.layers:
        vertices = [lay.vertices[key] for key in column]
        for above, below in pairwise(vertices):
            gap = (above.height + below.height) / 2 + graph.ROW_GAP
            assert below.y - above.y >= gap - 1e-6
    # every dependency sits in a column left of its dependent
    for edge, _ in lay.paths:
        assert lay.vertices[edge.source].layer < lay.vertices[edge.target].layer


def test_a_cycle_does_not_break_the_layout():
    lay = layout(nodes("a", "b", "c"), edges("ab", "bc", "ca"))
    assert set(lay.vertices) >= {"a", "b", "c"}


def test_unknown_duplicate_and_self_edges_are_ignored():
    lay = layout(nodes("a", "b"), edges("ab", "ab", "aa", "az"))
    assert len(lay.paths) == 1


def test_svg_marks_status_optional_edges_stuck_and_dead_and_escapes_text():
    svg = render_svg(
        [
            GraphNode("p", "parse", "completed", href="/t/p?x=1&y=2"),
            GraphNode("f", "<script>alert(1)</script>", "failed", dead=True, title='a "b"'),
            GraphNode("g", "aggregate", "queued", stuck=True),
        ],
        [GraphEdge("p", "f"), GraphEdge("f", "g"), GraphEdge("p", "g", required=False)],
    )
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert 'data-nodes="3"' in svg and 'data-edges="3"' in svg
    assert len(re.findall(r'<g class="pmcp-node ', svg)) == 3
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert 'href="/t/p?x=1&amp;y=2"' in svg
    assert "pmcp-node-dead" in svg and "pmcp-node-stuck" in svg
    assert svg.count('stroke-dasharray="5 4"') == 1  # the optional edge
    assert 'class="pmcp-node pmcp-status-failed pmcp-node-dead"' in svg
    assert "url(#pmcp-arrow-failed)" in svg  # the edge out of the failed task
    assert "a &quot;b&quot;" in svg


def test_long_labels_are_cut():
    svg = render_svg([GraphNode("x", "k" * 60, "queued", title="full")], [])
    assert "k" * 60 not in svg and "…" in svg


def test_a_few_hundred_tasks_lay_out_quickly():
    rng = random.Random(11)
    keys = [f"t{i}" for i in range(500)]
    pairs = [
        GraphEdge(keys[rng.randrange(max(0, i - 40), i)], keys[i])
        for i in range(1, len(keys))
        for _ in range(2)
    ]
    started = time.perf_counter()
    svg = render_svg(nodes(*keys), pairs)
    assert time.perf_counter() - started < 2.0
    assert 'data-nodes="500"' in svg
