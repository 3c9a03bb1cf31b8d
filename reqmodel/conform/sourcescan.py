"""Facts read from a released wheel's source rather than by importing it:
the conformance worker uses them for code whose transport library is not
installed.  Standard library only (it runs in the worker and in the tests)."""
from __future__ import annotations

import ast
import pathlib
from typing import List


def host_destination_classes(pkg: pathlib.Path) -> List[str]:
    """Every class in the wheel's ``disaggregation`` package that declares
    ``supports_host_destination`` as anything but ``False`` (an attribute, or
    a property whose body is not ``return False``), as ``path:Class``.  Read
    from the source, so a backend whose transport library is not installed
    (mooncake, nixl, mori, ascend) is still seen."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if _declares_host_destination(node):
                    found.append(f"{path.relative_to(pkg)}:{cls.name}")
    return found


def _declares_host_destination(node: ast.AST) -> bool:
    false = lambda v: isinstance(v, ast.Constant) and v.value is False  # noqa: E731
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id == "supports_host_destination" and not false(node.value)
    if isinstance(node, ast.Assign):
        return (any(isinstance(t, ast.Name) and t.id == "supports_host_destination"
                    for t in node.targets) and not false(node.value))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.name != "supports_host_destination":
            return False
        body = [n for n in node.body
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        return not (len(body) == 1 and isinstance(body[0], ast.Return) and false(body[0].value))
    return False


def force_armed_failure_calls(decode_py: pathlib.Path) -> List[str]:
    """Where decode's ``decode.py`` calls ``ensure_abort_notified`` with
    ``force_arm=True`` (as ``function:line``): 0.5.21's transfer queue does it
    for a failed transfer decode did not initiate, then holds its pages until
    the drain ack instead of releasing them at once (dc 21:2681-2707), which
    the release record calls ``hold_unnotified``.  Read from the source: the
    branch needs a real receiver, KV manager and deferred-release queue."""
    tree = ast.parse(decode_py.read_text(encoding="utf-8"))
    found = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            name = getattr(call.func, "attr", getattr(call.func, "id", None))
            if name == "ensure_abort_notified" and any(
                    k.arg == "force_arm" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in call.keywords):
                found.append(f"{fn.name}:{call.lineno}")
    return sorted(set(found))
