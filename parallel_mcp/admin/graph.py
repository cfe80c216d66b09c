"""A run's task DAG as an SVG picture, laid out in Python (no JavaScript, no network).

The layout is the classic layered (Sugiyama-style) one, left to right:

1. **Layers** by longest path: a task with no dependencies is in column 0, any other task one
   column right of its furthest dependency.
2. **Dummy nodes** split every edge that spans more than one column, so long edges are routed
   between the boxes instead of through them.
3. **Ordering** within each column by the barycenter heuristic: alternate sweeps left to right
   and right to left, each node sorted by the mean position of its neighbours in the column just
   visited; the ordering with the fewest edge crossings (counted exactly, by inversions) wins.
4. **Coordinates**: each column is packed top to bottom; nodes are pulled toward the mean height
   of their neighbours with the smallest total displacement that keeps boxes from overlapping
   (isotonic regression, pool-adjacent-violators), a few rounds in both directions.

Nodes are coloured by status, stuck tasks get a dashed red outline and dead-lettered ones a
thick one; edges point from a dependency to its dependent, dashed for optional dependencies.
Each node links to the task's admin page and has a tooltip. Everything is pure: callers pass
plain ``GraphNode``/``GraphEdge`` values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from django.utils.html import escape

# Node box and spacing, in SVG user units (pixels at 100 %).
NODE_WIDTH = 172
NODE_HEIGHT = 28
DUMMY_HEIGHT = 6
COLUMN_GAP = 76
ROW_GAP = 10
MARGIN = 16
LABEL_CHARS = 23  # characters that fit in a node at 12px
SWEEPS = 8
PACK_ROUNDS = 4
# Past this many dummy nodes long edges are drawn straight, without routing.
MAX_DUMMIES = 20_000

# status -> (fill, stroke, text)
STATUS_STYLE = {
    "queued": ("#f1f3f5", "#868e96", "#212529"),
    "leased": ("#d0ebff", "#1c7ed6", "#0b3d6e"),
    "running": ("#a5d8ff", "#1971c2", "#0b3d6e"),
    "blocked": ("#e5dbff", "#7048e8", "#2b1a66"),
    "waiting_input": ("#f3d9fa", "#ae3ec9", "#4a1257"),
    "completed": ("#d3f9d8", "#2f9e44", "#123d1c"),
    "failed": ("#ffe3e3", "#e03131", "#5c0f0f"),
    "cancelled": ("#fff3bf", "#f08c00", "#5c3800"),
}
DEFAULT_STYLE = ("#ffffff", "#868e96", "#212529")
EDGE_COLOUR = "#9aa3ad"
EDGE_FAILED_COLOUR = "#e03131"


@dataclass(frozen=True)
class GraphNode:
    id: str
    label: str
    status: str
    title: str = ""
    href: str | None = None
    stuck: bool = False  # queued behind a failed required dependency: can never run
    dead: bool = False  # dead-lettered


@dataclass(frozen=True)
class GraphEdge:
    source: str  # the dependency
    target: str  # the task that depends on it
    required: bool = True


@dataclass
class _Vertex:
    key: str
    layer: int
    dummy: bool = False
    height: float = NODE_HEIGHT
    y: float = 0.0
    order: int = 0


@dataclass
class Layout:
    """Positions computed by :func:`layout` (for the renderer and for tests)."""

    vertices: dict[str, _Vertex]
    layers: list[list[str]]
    # Every edge as the chain of vertex keys it passes: [source, dummies..., target].
    paths: list[tuple[GraphEdge, list[str]]]
    crossings: int
    width: float
    height: float
    routed: bool = True
    node_keys: list[str] = field(default_factory=list)

    def x(self, key: str) -> float:
        return MARGIN + self.vertices[key].layer * (NODE_WIDTH + COLUMN_GAP)


def _longest_path_layers(
    keys: Sequence[str], preds: dict[str, list[str]], succs: dict[str, list[str]]
) -> dict[str, int]:
    indegree = {key: len(preds[key]) for key in keys}
    layer = dict.fromkeys(keys, 0)
    ready = [key for key in keys if indegree[key] == 0]
    done: set[str] = set()
    while ready:
        next_ready: list[str] = []
        for key in ready:
            done.add(key)
            for child in succs[key]:
                layer[child] = max(layer[child], layer[key] + 1)
                indegree[child] -= 1
                if indegree[child] == 0:
                    next_ready.append(child)
        ready = next_ready
    if len(done) < len(keys):  # a cycle (the core forbids them): park it in a last column
        last = max((layer[key] for key in done), default=-1) + 1
        for key in keys:
            if key not in done:
                layer[key] = last
    return layer


def _count_crossings(pairs: list[tuple[int, int]]) -> int:
    """Crossings among segments between two adjacent columns, given as (upper, lower)
    positions: the inversions of the lower positions once sorted by (upper, lower)."""
    if len(pairs) < 2:
        return 0
    pairs.sort()
    values = [lower for _, lower in pairs]
    size = max(values) + 2
    tree = [0] * (size + 1)
    inversions = 0
    for seen, value in enumerate(values):
        # segments already seen whose lower end is strictly below (greater than) this one
        index, not_greater = value + 1, 0
        while index > 0:
            not_greater += tree[index]
            index -= index & -index
        inversions += seen - not_greater
        index = value + 1
        while index <= size:
            tree[index] += 1
            index += index & -index
    return inversions


def _total_crossings(
    layers: list[list[str]], down: dict[str, list[str]], position: dict[str, int]
) -> int:
    total = 0
    for column in layers[:-1]:
        pairs = [(position[key], position[child]) for key in column for child in down[key]]
        total += _count_crossings(pairs)
    return total


def _isotonic(targets: list[float], weights: list[float]) -> list[float]:
    """Non-decreasing values closest (weighted least squares) to ``targets``: pool adjacent
    violators."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for target, weight in zip(targets, weights, strict=True):
        blocks.append([target, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean2, weight2, count2 = blocks.pop()
            mean1, weight1, count1 = blocks.pop()
            total = weight1 + weight2
            blocks.append([(mean1 * weight1 + mean2 * weight2) / total, total, count1 + count2])
    values: list[float] = []
    for mean, _, count in blocks:
        values.extend([mean] * int(count))
    return values


def _pack(column: list[_Vertex], desired: list[float]) -> None:
    """Place a column's vertices (in order) as close to ``desired`` as possible without
    overlapping: y[i] >= y[i-1] + (h[i-1] + h[i]) / 2 + ROW_GAP."""
    if not column:
        return
    offsets = [0.0]
    for above, below in pairwise(column):
        offsets.append(offsets[-1] + (above.height + below.height) / 2 + ROW_GAP)
    weights = [1.0 if not vertex.dummy else 0.3 for vertex in column]
    shifted = _isotonic(
        [want - offset for want, offset in zip(desired, offsets, strict=True)], weights
    )
    for vertex, base, offset in zip(column, shifted, offsets, strict=True):
        vertex.y = base + offset


def layout(nodes: Sequence[GraphNode], edges: Iterable[GraphEdge]) -> Layout:
    keys = [node.id for node in nodes]
    known = set(keys)
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    kept: list[GraphEdge] = []
    seen_edges: set[tuple[str, str]] = set()
    for edge in edges:
        pair = (edge.source, edge.target)
        if edge.source == edge.target or pair in seen_edges:
            continue
        if edge.source not in known or edge.target not in known:
            continue
        seen_edges.add(pair)
        preds[edge.target].append(edge.source)
        succs[edge.source].append(edge.target)
        kept.append(edge)
    layer_of = _longest_path_layers(keys, preds, succs)
    vertices = {key: _Vertex(key, layer_of[key]) for key in keys}

    # Split long edges with dummy vertices (one per column crossed).
    long_span = sum(max(0, abs(layer_of[edge.target] - layer_of[edge.source]) - 1) for edge in kept)
    routed = long_span <= MAX_DUMMIES
    down: dict[str, list[str]] = defaultdict(list)
    up: dict[str, list[str]] = defaultdict(list)
    paths: list[tuple[GraphEdge, list[str]]] = []
    for index, edge in enumerate(kept):
        start, end = layer_of[edge.source], layer_of[edge.target]
        chain = [edge.source]
        if routed and end > start + 1:
            for layer in range(start + 1, end):
                key = f"~{index}:{layer}"
                vertices[key] = _Vertex(key, layer, dummy=True, height=DUMMY_HEIGHT)
                chain.append(key)
        chain.append(edge.target)
        for upper, lower in pairwise(chain):
            if vertices[lower].layer == vertices[upper].layer + 1:
                down[upper].append(lower)
                up[lower].append(upper)
        paths.append((edge, chain))

    depth = max((vertex.layer for vertex in vertices.values()), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    # Initial order: a depth-first walk from the roots keeps families together.
    placed: set[str] = set()

    def visit(key: str) -> None:
        stack = [key]
        while stack:
            current = stack.pop()
            if current in placed:
                continue
            placed.add(current)
            layers[vertices[current].layer].append(current)
            stack.extend(reversed(down[current]))

    for key in keys:
        if not up[key]:
            visit(key)
    for key in vertices:  # anything left (cycles)
        visit(key)

    position = {key: index for column in layers for index, key in enumerate(column)}
    best = [list(column) for column in layers]
    best_crossings = _total_crossings(layers, down, position)
    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        order = range(1, depth) if forward else range(depth - 2, -1, -1)
        neighbours = up if forward else down
        for layer in order:
            column = layers[layer]

            def barycenter(key: str, neighbours=neighbours) -> float:
                around = neighbours[key]
                if not around:
                    return float(position[key])
                return sum(position[other] for other in around) / len(around)

            column.sort(key=barycenter)
            for index, key in enumerate(column):
                position[key] = index
        crossings = _total_crossings(layers, down, position)
        if crossings < best_crossings:
            best, best_crossings = [list(column) for column in layers], crossings
        if best_crossings == 0:
            break
    layers = best
    for column in layers:
        for index, key in enumerate(column):
            vertices[key].order = index

    # Coordinates: start with every column packed and centred, then pull toward neighbours.
    heights = []
    for column in layers:
        members = [vertices[key] for key in column]
        _pack(members, [0.0] * len(members))
        heights.append(members[-1].y + members[-1].height / 2 if members else 0.0)
    tallest = max(heights, default=0.0)
    for column, height in zip(layers, heights, strict=True):
        for key in column:
            vertices[key].y += (tallest - height) / 2
    for _ in range(PACK_ROUNDS):
        for direction in (up, down):
            for column in layers if direction is up else list(reversed(layers)):
                members = [vertices[key] for key in column]
                desired = []
                for vertex in members:
                    around = direction[vertex.key]
                    if around:
                        desired.append(sum(vertices[k].y for k in around) / len(around))
                    else:
                        desired.append(vertex.y)
                _pack(members, desired)
    top = min((v.y - v.height / 2 for v in vertices.values()), default=0.0)
    for vertex in vertices.values():
        vertex.y += MARGIN - top
    bottom = max((v.y + v.height / 2 for v in vertices.values()), default=0.0)
    width = 2 * MARGIN + max(depth, 1) * NODE_WIDTH + max(depth - 1, 0) * COLUMN_GAP
    return Layout(
        vertices=vertices,
        layers=layers,
        paths=paths,
        crossings=best_crossings,
        width=width,
        height=bottom + MARGIN,
        routed=routed,
        node_keys=keys,
    )


def _label(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _edge_path(lay: Layout, chain: list[str]) -> str:
    """A smooth path from the right side of the source to the left side of the target,
    passing each dummy straight across its column."""
    source = lay.vertices[chain[0]]
    x = lay.x(chain[0]) + NODE_WIDTH
    y = source.y
    parts = [f"M{_fmt(x)},{_fmt(y)}"]
    for key in chain[1:]:
        vertex = lay.vertices[key]
        nx, ny = lay.x(key), vertex.y
        bend = max(24.0, (nx - x) / 2)
        parts.append(
            f"C{_fmt(x + bend)},{_fmt(y)} {_fmt(nx - bend)},{_fmt(ny)} {_fmt(nx)},{_fmt(ny)}"
        )
        x, y = nx, ny
        if vertex.dummy:
            x = nx + NODE_WIDTH
            parts.append(f"L{_fmt(x)},{_fmt(y)}")
    return " ".join(parts)


def render_svg(nodes: Sequence[GraphNode], edges: Iterable[GraphEdge]) -> str:
    """The graph as a standalone ``<svg>`` element (a string of trusted markup)."""
    lay = layout(nodes, edges)
    by_id = {node.id: node for node in nodes}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pmcp-graph" role="img" '
        f'width="{_fmt(lay.width)}" height="{_fmt(lay.height)}" '
        f'viewBox="0 0 {_fmt(lay.width)} {_fmt(lay.height)}" '
        f'data-nodes="{len(nodes)}" data-edges="{len(lay.paths)}" '
        f'data-crossings="{lay.crossings}" '
        'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" '
        'font-size="12">',
        "<title>Task dependency graph</title>",
        "<defs>"
        f'<marker id="pmcp-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        f'fill="{EDGE_COLOUR}"/></marker>'
        f'<marker id="pmcp-arrow-failed" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        f'fill="{EDGE_FAILED_COLOUR}"/></marker>'
        "</defs>",
        '<g class="pmcp-edges" fill="none" stroke-width="1.3">',
    ]
    for edge, chain in lay.paths:
        source_status = by_id[edge.source].status
        broken = edge.required and source_status in ("failed", "cancelled")
        colour = EDGE_FAILED_COLOUR if broken else EDGE_COLOUR
        marker = "pmcp-arrow-failed" if broken else "pmcp-arrow"
        dash = "" if edge.required else ' stroke-dasharray="5 4"'
        css = "pmcp-edge" + ("" if edge.required else " pmcp-edge-optional")
        out.append(
            f'<path class="{css}" d="{_edge_path(lay, chain)}" stroke="{colour}"{dash} '
            f'marker-end="url(#{marker})" data-source="{escape(edge.source)}" '
            f'data-target="{escape(edge.target)}"/>'
        )
    out.append("</g>")
    out.append('<g class="pmcp-nodes">')
    for node in nodes:
        vertex = lay.vertices[node.id]
        fill, stroke, text = STATUS_STYLE.get(node.status, DEFAULT_STYLE)
        x, y = lay.x(node.id), vertex.y - NODE_HEIGHT / 2
        extra = ""
        width = 1.5
        if node.stuck:
            stroke, extra = "#e03131", ' stroke-dasharray="4 3"'
        if node.dead:
            width = 3.5
        classes = f"pmcp-node pmcp-status-{escape(node.status)}"
        classes += " pmcp-node-stuck" if node.stuck else ""
        classes += " pmcp-node-dead" if node.dead else ""
        title = escape(node.title or node.label)
        shape = (
            f'<g class="{classes}" data-task-id="{escape(node.id)}" '
            f'data-status="{escape(node.status)}"><title>{title}</title>'
            f'<rect x="{_fmt(x)}" y="{_fmt(y)}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" '
            f'rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{width}"{extra}/>'
            f'<text x="{_fmt(x + 9)}" y="{_fmt(vertex.y + 4)}" fill="{text}">'
            f"{escape(_label(node.label))}</text></g>"
        )
        if node.href:
            shape = f'<a href="{escape(node.href)}">{shape}</a>'
        out.append(shape)
    out.append("</g></svg>")
    return "".join(out)
