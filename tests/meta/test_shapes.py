"""Function shapes a reader can hold in their head: no function of ``core`` takes more than
six parameters or returns a tuple of more than three (a frozen dataclass names the parts).

Constructors are left out: a class built from many keyword settings is what a dataclass is
for, and their names are read at the call site. So are the few functions whose keywords are
config keys (``CONFIG_FACING``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_PARAMETERS = 6
MAX_TUPLE = 3
CONFIG_FACING = {
    ("core/tasks/succ_digit.py", "write_dataset"): "its keywords are task.generator_kwargs keys users set",
}
"""Functions whose keyword parameters are config keys (as a constructor's are), with why."""


def _functions() -> Iterator[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for path in sorted((ROOT / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path, node


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    return [a.arg for a in every if a.arg not in ("self", "cls")]


def _tuple_size(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    returns = node.returns
    if not isinstance(returns, ast.Subscript) or ast.unparse(returns.value) not in ("tuple", "Tuple"):
        return 0
    inner = returns.slice
    if isinstance(inner, ast.Tuple):
        if any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in inner.elts):
            return 1  # tuple[X, ...] is a sequence, not a record
        return len(inner.elts)
    return 1


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def test_no_function_takes_more_than_six_parameters() -> None:
    wide = [
        f"{_where(path, node)} {node.name}({', '.join(_parameters(node))})"
        for path, node in _functions()
        if node.name != "__init__"
        and (str(path.relative_to(ROOT)), node.name) not in CONFIG_FACING
        and len(_parameters(node)) > MAX_PARAMETERS
    ]
    assert not wide, "group these parameters into a dataclass:\n" + "\n".join(wide)


def test_no_function_returns_a_tuple_of_more_than_three() -> None:
    long = [
        f"{_where(path, node)} {node.name} -> {ast.unparse(node.returns) if node.returns else ''}"
        for path, node in _functions()
        if _tuple_size(node) > MAX_TUPLE
    ]
    assert not long, "return a frozen dataclass instead:\n" + "\n".join(long)


def test_the_check_counts_keyword_only_parameters() -> None:
    tree = ast.parse("def f(a, b, *, c, d, e, f, g): ...\ndef g() -> tuple[int, int, int, int]: ...")
    first, second = tree.body
    assert isinstance(first, ast.FunctionDef) and isinstance(second, ast.FunctionDef)
    assert len(_parameters(first)) == 7
    assert _tuple_size(second) == 4
