"""The package's layering, checked from its source: what imports what, and function size.

ops (gpu_sampler/*.py) <- hf (gpu_sampler/hf/); params.py and rng.py are leaves; no module uses
another's `_`-names; no cycle; `import gpu_sampler` does not load transformers.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gpu_sampler"
MODULES = sorted(p for p in PKG.rglob("*.py"))
KERNEL_MODULES = sorted((PKG.parent / "kernels").glob("*.py"))
MAX_LINES = 80


def _name(path):
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module, node):
    """Absolute module names an import node refers to (``from . import x`` gives pkg.x)."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    pkg = module.split(".") if _is_pkg(module) else module.split(".")[:-1]
    base = pkg[:len(pkg) - node.level + 1] if node.level else []
    target = ".".join(base + ([node.module] if node.module else []))
    out = []
    for a in node.names:
        sub = f"{target}.{a.name}"
        out.append((sub, None) if _known(sub) else (target, a.name))
    return out


def _is_pkg(module):
    return (PKG.parent / module.replace(".", "/") / "__init__.py").is_file()


def _known(module):
    return module in {_name(p) for p in MODULES}


def _imports():
    """{module: [(imported module, imported name or None)]} inside gpu_sampler."""
    graph = {}
    for path in MODULES:
        module = _name(path)
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [(m, n) for m, n in _resolve(module, node)
                          if m.startswith("gpu_sampler") and not m.startswith(
                              "gpu_sampler.kernels")]
        graph[module] = edges
    return graph


def test_no_import_cycle():
    graph = {m: {t for t, _ in e if t != m and _known(t)} for m, e in _imports().items()}
    state = {}

    def visit(m, trail):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(trail + [m])}"
        state[m] = "open"
        for t in graph.get(m, ()):
            # A package's __init__ is imported with its modules: skip edges into a parent.
            if not m.startswith(t + "."):
                visit(t, trail + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])


def test_layers_point_one_way():
    for module, edges in _imports().items():
        for target, _ in edges:
            if not module.startswith("gpu_sampler.hf") and module not in (
                    "gpu_sampler", "gpu_sampler.demo", "gpu_sampler.cli"):
                assert not target.startswith("gpu_sampler.hf"), (module, target)
        if module in ("gpu_sampler.params", "gpu_sampler.rng"):
            assert not edges, f"{module} is a leaf, imports {edges}"


def test_no_private_names_across_modules():
    for module, edges in _imports().items():
        for target, name in edges:
            if name is not None and target != module:
                assert not name.startswith("_"), f"{module} imports {target}.{name}"
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)):
                owner = node.value.id
                assert owner not in {"params", "reference", "sampler", "contrastive", "beam",
                                     "rng", "distributed", "compat", "common", "cache",
                                     "generation"}, f"{_name(path)} uses {owner}.{node.attr}"


def _code_lines(fn, source_lines):
    """Lines of a function that are code: not blank, not comments, not its docstring."""
    doc = set()
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for i in range(fn.lineno, fn.end_lineno + 1)
               if i not in doc and source_lines[i - 1].strip()
               and not source_lines[i - 1].strip().startswith("#"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_functions_fit_one_screen(path):
    source = path.read_text()
    lines = source.splitlines()
    long = [(fn.name, _code_lines(fn, lines)) for fn in ast.walk(ast.parse(source))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _code_lines(fn, lines) > MAX_LINES]
    assert not long, f"functions over {MAX_LINES} lines of code: {long}"


def _jit(fn):
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


@pytest.mark.parametrize("path", KERNEL_MODULES, ids=lambda p: p.name)
def test_launchers_fit_one_screen(path):
    # Host code (launchers, plans, compile drivers); @triton.jit bodies are one program each.
    source = path.read_text()
    lines = source.splitlines()
    long = [(fn.name, _code_lines(fn, lines)) for fn in ast.walk(ast.parse(source))
            if isinstance(fn, ast.FunctionDef) and not _jit(fn)
            and _code_lines(fn, lines) > MAX_LINES]
    assert not long, f"host functions over {MAX_LINES} lines of code: {long}"


def test_import_does_not_load_transformers():
    code = ("import sys, gpu_sampler, torch; gpu_sampler.sample(torch.randn(2, 9), seed=1); "
            "assert 'transformers' not in sys.modules, 'transformers loaded'; "
            "gpu_sampler.generate; assert 'transformers' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_state_is_declared(path):
    # State that crosses functions is a declared type, not a namespace that grows attributes.
    assert "SimpleNamespace" not in path.read_text(), f"{path.name} uses a SimpleNamespace"
