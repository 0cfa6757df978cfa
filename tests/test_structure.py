"""The package's structure: imports go one way (no module, through its functions or not, imports one that
imports it back), so each layer can be read and tested below the ones that use it."""

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trtllm_medusa_ports"


def _graph(function_level: bool) -> dict[str, set[str]]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        name = ".".join(f.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = f
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, f in mods.items():
        tree = ast.parse(f.read_text())
        nodes = ast.walk(tree) if function_level else tree.body
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module in mods and node.module != name:
                graph[name].add(node.module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_level_import_cycle():
    assert _cycles(_graph(function_level=False)) == []


def test_tune_and_verify_share_their_measures_from_below():
    graph = _graph(function_level=True)
    assert "trtllm_medusa_ports.verify" not in graph["trtllm_medusa_ports.tune"]
    assert "trtllm_medusa_ports.tune" not in graph["trtllm_medusa_ports.verify"]
    for user in ("trtllm_medusa_ports.tune", "trtllm_medusa_ports.verify"):
        assert "trtllm_medusa_ports.acceptance" in graph[user], user
    # the base-model helpers and the prompt readers have homes of their own, which train-heads uses too
    assert "trtllm_medusa_ports.base_model" in graph["trtllm_medusa_ports.heads.train"]
    assert "trtllm_medusa_ports.files.prompts" in graph["trtllm_medusa_ports.heads.train"]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
