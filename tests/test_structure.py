"""The package's structure: imports go one way (no module, through its functions or not, imports one that
imports it back), so each layer can be read and tested below the ones that use it."""

import ast
import collections
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trtllm_medusa_ports"


def _modules() -> dict[str, Path]:
    return {".".join(f.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): f
            for f in ROOT.rglob("*.py")}


@functools.cache
def _parsed(f: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every test here (nothing changes the package while they run)."""
    return ast.parse(f.read_text())


def _imported(name: str, f: Path, node, mods: dict[str, Path]) -> set[str]:
    """The package's modules an import statement loads: ``import a.b``, ``from a import b`` (a module b too)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    base = node.module or ""
    if node.level:
        parts = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return ({base} if base in mods else set()) | {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods}


@functools.cache
def _graph(function_level: bool) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at module level only, or anywhere in it); built once, read only."""
    mods = _modules()
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, f in mods.items():
        tree = _parsed(f)
        nodes = ast.walk(tree) if function_level else tree.body
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _imported(name, f, node, mods) - {name}
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


def test_no_import_cycle_at_any_depth():
    """Imports inside functions count: they only defer a cycle to the first call."""
    assert _cycles(_graph(function_level=True)) == []


def test_no_module_imports_another_modules_private_names():
    bad = []
    for name, f in _modules().items():
        for node in ast.walk(_parsed(f)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trtllm_medusa_ports"):
                bad += [f"{name}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


def _package(g: dict[str, set[str]], name: str) -> set[str]:
    """What a module, or a package with every module in it, imports from outside itself."""
    inside = {m for m in g if m == name or m.startswith(name + ".")}
    return {m for m in set().union(*(g[m] for m in inside)) if m != name and not m.startswith(name + ".")}


def _reaches(g: dict[str, set[str]], user: str, target: str) -> bool:
    """Whether any module of ``user`` (a module or package) imports any module of ``target``."""
    return any(m == target or m.startswith(target + ".") for m in _package(g, user))


def test_the_layers_look_down():
    """The conversion plan below convert, quant and verify; the Hugging Face base's loading below quant and verify;
    findings below every rule module; convert and verify never import each other."""
    g = _graph(function_level=True)
    p = "trtllm_medusa_ports."
    for user in ("conversion.convert", "quant.jobs", "verify"):
        assert p + "conversion.plan" in _package(g, p + user) or p + "conversion.plan" in g[p + user], user
    assert p + "huggingface.model" in g[p + "quant.calibrate"] and p + "huggingface.model" in _package(g, p + "verify")
    for rules in ("compat", "quant.rules"):
        assert p + "findings" in _package(g, p + rules), rules
    assert not g[p + "findings"] and not {m for m in g[p + "conversion.plan"]
                                          if m.startswith((p + "conversion.convert", p + "verify", p + "quant"))}
    assert not _reaches(g, p + "conversion.convert", p + "verify") and not _reaches(g, p + "verify", p + "conversion.convert")


def test_no_module_of_a_split_package_imports_its_own_init():
    """verify's and compat's modules import each other, never the package's ``__init__`` (which re-exports them)."""
    g = _graph(function_level=True)
    for pkg in ("trtllm_medusa_ports.verify", "trtllm_medusa_ports.compat"):
        inside = [m for m in g if m.startswith(pkg + ".")]
        assert len(inside) > 3, pkg
        assert [m for m in inside if pkg in g[m]] == [], pkg


def test_the_entries_helpers_serve_their_entry_alone():
    """cli_flags/ is the command line's (only cli.py imports it), options/ the API's (only api.py imports it), and
    neither imports back into cli or api."""
    g = _graph(function_level=True)
    p = "trtllm_medusa_ports."
    for helpers, entry in (("cli_flags", "cli"), ("options", "api")):
        inside = {m for m in _modules() if m == p + helpers or m.startswith(p + helpers + ".")}
        assert len(inside) > 3, helpers
        users = {m for m in g if m not in inside and g[m] & inside}
        assert users == {p + entry}, helpers
        assert not _reaches(g, p + helpers, p + "cli") and not _reaches(g, p + helpers, p + "api"), helpers


#: the functions kept longer than 60 lines, at most three in the whole package, each with its reason
LONG_KEPT = {
    "verify.run._verify": "the verify phases in the order their memory use requires (transformers freed before the "
                          "executor loads); each phase is a named helper, what remains is their sequence and the report",
    "verify.report.render": "one line per report field, in report order",
    "conversion.plan.plan_jobs": "one walk over the weight rules with its two closures (resolve, add) sharing the job list",
}
#: the largest module, and convert.py's bound (issue 66: a house easy to change)
MODULE_LINES, CONVERT_LINES = 800, 500


def _long_functions() -> dict[str, int]:
    long = {}
    for f in ROOT.rglob("*.py"):
        mod = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(_parsed(f)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long[f"{mod}.{node.name}"] = node.end_lineno - node.lineno + 1
    return long


def test_no_long_functions_in_the_package():
    """Issue 66, 4: at most three functions over 60 lines in the whole package, each named with its reason."""
    assert len(LONG_KEPT) <= 3
    long = _long_functions()
    assert set(long) <= set(LONG_KEPT), {k: v for k, v in long.items() if k not in LONG_KEPT}
    assert set(LONG_KEPT) <= set(long), "a kept function is no longer long: drop it from LONG_KEPT"


def test_no_module_is_too_long_to_read():
    """Issue 66, 4: no module over 800 lines, and conversion/convert.py (the orchestration) under 500."""
    sizes = {str(f.relative_to(ROOT)): len(f.read_text().splitlines()) for f in ROOT.rglob("*.py")}
    assert not {k: v for k, v in sizes.items() if v > MODULE_LINES}
    assert sizes["conversion/convert.py"] < CONVERT_LINES, sizes["conversion/convert.py"]


def test_tune_and_verify_share_their_measures_from_below():
    graph = _graph(function_level=True)
    assert not _reaches(graph, "trtllm_medusa_ports.trees.tune", "trtllm_medusa_ports.verify")
    assert not _reaches(graph, "trtllm_medusa_ports.verify", "trtllm_medusa_ports.trees.tune")
    for user in ("trtllm_medusa_ports.trees.tune", "trtllm_medusa_ports.verify"):
        assert "trtllm_medusa_ports.trees.acceptance" in _package(graph, user), user
    # the base-model helpers and the prompt readers have homes of their own, which train-heads uses too
    assert "trtllm_medusa_ports.huggingface.model" in graph["trtllm_medusa_ports.heads.train"]
    assert "trtllm_medusa_ports.files.prompts" in graph["trtllm_medusa_ports.heads.train"]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: the modules outside archs/ that may name a registered family, each with its reason: a family is its module
#: (docs/porting-guide.md), so nothing else keys on its name
FAMILY_NAMES_KEPT = {
    "deploy/routes.py": "upstream's MODEL_MAP keys, every one (tensorrt_llm/models/__init__.py), not this project's",
    "engine/build.py": "trtllm-build's own checks that name architectures (tensorrt_llm/commands/build.py, "
                       "tensorrt_llm/builder.py), modelled as upstream writes them",
    "demo.py": "the demo's default tiny base",
    "declared.py": "the demo command's --architecture default",
}


def _family_names() -> set[str]:
    from trtllm_medusa_ports.archs import registry

    names: set[str] = set()
    for cls in set(registry().values()):
        names |= set(cls.hf_architectures) | {cls.family} | set(cls.model_types)
    return names - {""}


def _named_families(path: Path, names: set[str]) -> set[str]:
    """The family names a module's code spells as string constants (docstrings aside)."""
    tree = _parsed(path)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and node.value in names}


def test_no_module_outside_archs_names_a_family(tmp_path):
    """Issue 66, 2: the guide's promise, that a family is its module and its stand-in folder, holds only while no
    other module keys on a family's name; the few that name one for upstream's sake are listed with the reason."""
    names = _family_names()
    assert {"DbrxForCausalLM", "MixtralForCausalLM", "qwen2"} <= names
    named = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        if rel.parts[0] != "archs" and (found := _named_families(f, names)):
            named[str(rel)] = found
    assert set(named) <= set(FAMILY_NAMES_KEPT), {k: sorted(v) for k, v in named.items() if k not in FAMILY_NAMES_KEPT}
    # the scan finds a family spelt in code (and not in a docstring)
    probe = tmp_path / "probe.py"
    probe.write_text('"""About MixtralForCausalLM."""\nX = 1\nif X:\n    Y = "MixtralForCausalLM"\n')
    assert _named_families(probe, names) == {"MixtralForCausalLM"}


def _layer_picture() -> list[list[str]]:
    """docs/layers.md's picture: its rows, each a list of module or package names (a row continued on the next
    line when that line's label is blank)."""
    import re

    doc = (ROOT.parent / "docs" / "layers.md").read_text()
    picture = re.search(r"<!-- layers:begin -->\n```\n(.*?)```\n<!-- layers:end -->", doc, re.S).group(1)
    rows: list[list[str]] = []
    for line in picture.splitlines():
        names = line[15:].split()
        if line[:15].strip() or not rows:
            rows.append(names)
        else:
            rows[-1] += names
    return rows


def test_the_layer_picture_names_every_module_and_holds():
    """docs/layers.md's picture of the layers (issue 66, 4): every module and package placed once, and no import
    (anywhere in a module) reaches a row above the importer's."""
    rows = _layer_picture()
    named = [n for row in rows for n in row]
    assert sorted(named) == sorted(set(named)), "a module placed twice"
    present = {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert {n.split(".")[0] for n in named} == present, {n.split(".")[0] for n in named} ^ present
    row_of = {n: i for i, row in enumerate(rows) for n in row}
    p = "trtllm_medusa_ports."

    def row(module: str) -> int:
        parts = module[len(p):].split(".")
        for k in range(len(parts), 0, -1):  # the most specific name placed
            if ".".join(parts[:k]) in row_of:
                return row_of[".".join(parts[:k])]
        raise AssertionError(f"{module} is not placed in docs/layers.md's picture")

    graph = {m: {d for d in deps if d != p[:-1]} for m, deps in _graph(function_level=True).items()
             if m != p[:-1]}  # the package's face (its version) is below everything and reads nothing
    upward = sorted((m, d) for m, deps in graph.items() for d in deps if row(d) < row(m))
    assert not upward, upward[:10]


def test_every_package_says_what_it_is_for_and_what_it_may_import():
    """Issue 79, 3: the top level shows the pipeline only while each package says what it holds and where it sits;
    docs/layers.md's picture is checked against the imports above, and each package's docstring names its own."""
    missing = []
    for init in sorted(ROOT.glob("*/__init__.py")):
        doc = ast.get_docstring(_parsed(init)) or ""
        if len(doc.split()) < 8 or "May import" not in doc:
            missing.append(init.parent.name)
    assert not missing, f"packages whose __init__ docstring does not say what they are for and may import: {missing}"
