"""The operator uses its libraries through their public API only: no import of Kopf's private modules
(`kopf._...`), and no patching of a library (an attribute of an imported module or class assigned or
`setattr` on it). Private internals change without notice in any release; a patched library changes
behind the back of everything else in the process."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpu_operator"


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def private_kopf(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("kopf._")]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("kopf._"):
                found.append(node.module)
            elif node.module == "kopf":
                found += [f"kopf.{a.name}" for a in node.names if a.name.startswith("_")]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "kopf"
            and node.attr.startswith("_")
        ):
            found.append(f"kopf.{node.attr}")
    return found


def imported_names(tree: ast.Module) -> set[str]:
    """Names bound to another package's module or class by an import."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not _ours(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not _ours(node.module or ""):
            names |= {a.asname or a.name for a in node.names}
    return names


def _ours(module: str) -> bool:
    return module.split(".")[0] in ("gpu_operator", "__future__")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _is_setattr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "setattr"
        and bool(node.args)
    )


def patches(tree: ast.Module) -> list[str]:
    imported = imported_names(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif _is_setattr(node):
            assert isinstance(node, ast.Call)
            patched = ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store())
            targets = [ast.copy_location(patched, node)]
        for target in targets:
            root = _root(target)
            if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in imported:
                found.append(f"line {target.lineno}: {ast.unparse(target)}")
    return found


def test_no_private_kopf_import_anywhere_in_the_package() -> None:
    found = {str(path.relative_to(PACKAGE)): hits for path, tree in sources() if (hits := private_kopf(tree))}
    assert found == {}


def test_no_library_is_patched() -> None:
    found = {str(path.relative_to(PACKAGE)): hits for path, tree in sources() if (hits := patches(tree))}
    assert found == {}


def test_the_checks_catch_what_they_are_for() -> None:
    caught = ast.parse(
        "import aiohttp\n"
        "from kopf._cogs.clients import api, watching\n"
        "import kopf\n"
        "aiohttp.ClientResponse.json = None\n"
        "watching.continuous_watch = None\n"
        "setattr(api, 'json', None)\n"
        "kopf._core\n"
    )
    assert private_kopf(caught) == ["kopf._cogs.clients", "kopf._core"]
    assert len(patches(caught)) == 3
    fine = ast.parse(
        "import logging\nfrom kubernetes import client\n"
        "configuration = client.Configuration()\nconfiguration.retries = 0\n"
        "logging.getLogger('x').propagate = False\n"
    )
    assert private_kopf(fine) == [] and patches(fine) == []
