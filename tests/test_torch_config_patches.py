"""No test changes a torch config module with `monkeypatch`.

torch's config modules (`torch._dynamo.config`, `torch._inductor.config`, ...) serve their options
through `__getattr__`, so an option is not in the module's `__dict__`. pytest 9.2's
`monkeypatch.setattr` then records "not set" as the old value and, at the test's end, deletes the
option; torch answers by hiding it, and every later read in that worker raises AttributeError. A
test changes torch's options through torch's own API instead: `torch._dynamo.config.patch(...)`
(the `eager` fixture in conftest.py), or an environment variable in a child process.
"""

import ast
import importlib
from pathlib import Path

import torch.utils._config_module as config_module

TESTS = Path(__file__).resolve().parent


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted module or object it is bound to by an import."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _is_torch_config(dotted: str) -> bool:
    """Whether `dotted` names one of torch's config modules (a ConfigModule)."""
    if not dotted.startswith("torch."):
        return False
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return isinstance(obj, config_module.ConfigModule)
    return False


def config_patches(source: str) -> list[str]:
    """`line: call` for each monkeypatch.setattr/delattr in `source` aimed at a torch config
    module, by object (aliases followed) or by its dotted string."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setattr", "delattr")
            and isinstance(node.func.value, ast.Name)
            and "monkeypatch" in node.func.value.id
            and node.args
        ):
            continue
        target = node.args[0]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            owner = target.value.rsplit(".", 1)[0]
        else:
            owner = _dotted(target, aliases)
        if owner and _is_torch_config(owner):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_rule_finds_every_spelling():
    src = """
import torch
import torch._dynamo.config as dc
from torch._inductor import config as ic
def test(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    monkeypatch.setattr(dc, "disable", True)
    monkeypatch.setattr(ic, "max_autotune", True)
    monkeypatch.setattr("torch._dynamo.config.suppress_errors", True)
    monkeypatch.delattr(dc, "disable")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a plain module: fine
    monkeypatch.setattr("torch.version.hip", "6.2")
"""
    assert [f.split(":")[0] for f in config_patches(src)] == ["6", "7", "8", "9", "10"]


def test_no_test_monkeypatches_a_torch_config_module():
    bad = {
        p.name: hits for p in sorted(TESTS.rglob("*.py")) if (hits := config_patches(p.read_text()))
    }
    assert not bad, f"use torch's config.patch(...) (conftest's `eager`) instead: {bad}"
