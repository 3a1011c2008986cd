"""Imports point down: the package's layering, read from the source with ``ast``.

- Only the collectors (``trainmon/collectors/``) and the wiring (``cli.py``,
  ``__main__.py``, ``config.py``) may import ``trainmon.collectors``; every source package
  (``node``, ``gpu``, ``training``, ``diagnosis``, ``tencent``...) stands below
  them. Imports inside functions count too.
- The training client (``trainmon/client/`` without the framework callbacks
  ``lightning.py`` and ``transformers.py``) runs inside users' training
  processes and must need nothing but the standard library: neither it nor any
  ``trainmon`` module it imports, at any depth, may import a third-party module.
- Every part of the package (a subpackage or a top-level module) sits in one
  layer of ``LAYERS`` and imports only parts of lower layers: never a part of its
  own layer, never one above. A new part must be given its layer here, so an
  upward import, or an import between siblings, fails this test.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import trainmon

PACKAGE_ROOT = Path(trainmon.__file__).resolve().parent
COLLECTORS = "trainmon.collectors"
#: Modules allowed to import the collectors besides ``trainmon.collectors.*``:
#: the CLI and the configuration it alone imports, which assembles the
#: ``collectors.<name>`` sections from the collectors' entries.
WIRING = frozenset({"trainmon.cli", "trainmon.__main__", "trainmon.config"})
CLIENT = "trainmon.client"
#: Client modules that exist to be imported with a framework installed
#: (``distributed`` needs torch; ``Reporter.instrument()`` imports it when called).
FRAMEWORK_CALLBACKS = frozenset({
    "trainmon.client.lightning", "trainmon.client.transformers", "trainmon.client.distributed",
    "trainmon.client.collectives", "trainmon.client.torch_profile",
})
IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})
#: The package's layers, bottom first (docs/architecture.md, "Layers"). A part is a
#: subpackage or a top-level module of ``trainmon``; ``trainmon`` is the package's
#: own ``__init__`` (its version).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("trainmon",),
    # what every layer may use: shared numbers, paths, rate-limited logs, threads,
    # outbound HTTP deadlines, the YAML section reader, text made safe for a terminal,
    # the wall clock's steps
    ("contract", "paths", "logthrottle", "background", "outbound", "section", "terminal",
     "clock"),
    # the collector contract, the registry and the route types
    ("core",),
    # the sources and the server, each on its own
    ("node", "gpu", "training", "tencent", "attribution", "http"),
    # what reads a source: the platform poller (node, Tencent metadata), the ledger,
    # the diagnosis engine (node readings), the local daemon's address (http), the
    # on-demand profiles (the training store's jobs and profile lines)
    ("platform", "ledger", "diagnosis", "local_daemon", "profiling"),
    # the training client (standard library only; the wire fields of training/)
    ("client",),
    # the ledger's commands, the report's words, the demo's simulated node and jobs
    ("runs", "report", "demo"),
    ("collectors",),
    # the commands and the wiring
    ("doctor",),
    # the live view on top of doctor's reading and report
    ("top",),
    ("config",),
    # the collectors built from a configuration; the reload that rebuilds them
    ("assembly",),
    ("reload",),
    ("cli",),
    # the entry points: the console's, and the install's bytecode compiler
    ("__main__", "bytecode"),
)


@dataclass(frozen=True)
class Import:
    """One imported module name, and where the import statement is."""

    module: str
    #: ``trainmon/node/netdev.py:12``
    where: str

    def __str__(self) -> str:
        return f"{self.where}: imports {self.module}"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    #: The path from the package's parent directory (``trainmon/node/netdev.py``).
    shown: str


def all_modules(root: Path = PACKAGE_ROOT) -> dict[str, Module]:
    """Every module of the package at ``root``, by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        parts = relative.with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = Module(name, path, relative.as_posix())
    return modules


def imports(module: Module) -> Iterator[Import]:
    """Every module ``module`` imports, wherever the statement is (functions and
    ``try`` blocks included), relative imports resolved. ``from x import y``
    gives both ``x`` and ``x.y`` (``y`` may be a submodule); an
    ``importlib.import_module("...")`` with a literal name counts as an import."""
    name = module.name
    package = name if module.path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    for node in ast.walk(tree):
        where = f"{module.shown}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, where)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield Import(base, where)
            for alias in node.names:
                if alias.name != "*":
                    yield Import(f"{base}.{alias.name}", where)
        elif (
            isinstance(node, ast.Call)
            and _called_name(node.func) in IMPORT_FUNCTIONS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(node.args[0].value, where)


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def collector_imports_outside_collectors(modules: dict[str, Module]) -> list[str]:
    return [
        str(found)
        for name, module in modules.items()
        if not within(name, COLLECTORS) and name not in WIRING
        for found in imports(module)
        if within(found.module, COLLECTORS)
    ]


def client_closure(modules: dict[str, Module]) -> dict[str, Module]:
    """The stdlib-only client modules and every ``trainmon`` module they load,
    package ``__init__``s included (importing ``a.b.c`` runs ``a`` and ``a.b``)."""
    pending = [
        name for name in modules
        if within(name, CLIENT) and name not in FRAMEWORK_CALLBACKS
    ]  # fmt: skip
    closure: dict[str, Module] = {}
    while pending:
        name = pending.pop()
        if name in closure or name not in modules or name in FRAMEWORK_CALLBACKS:
            continue  # framework modules: loaded only inside a function (checked below)
        closure[name] = modules[name]
        parts = name.split(".")
        pending.extend(".".join(parts[:end]) for end in range(1, len(parts)))
        pending.extend(
            found.module for found in imports(modules[name]) if within(found.module, "trainmon")
        )
    return closure


def import_time_framework_imports(modules: dict[str, Module]) -> list[str]:
    """Framework modules that ``modules`` load at import time (outside a function body)."""
    found = []
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        nodes: list[ast.AST] = list(ast.iter_child_nodes(tree))
        while nodes:
            node = nodes.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            nodes.extend(ast.iter_child_nodes(node))
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [f"{node.module}.{alias.name}" for alias in node.names] + [node.module or ""]
                if isinstance(node, ast.ImportFrom) else []
            )
            found += [f"{module.shown}:{node.lineno}: imports {name}"  # type: ignore[attr-defined]
                      for name in names if name in FRAMEWORK_CALLBACKS]
    return found


def third_party_imports(modules: dict[str, Module]) -> list[str]:
    allowed = set(sys.stdlib_module_names) | {"__future__", "trainmon"}
    return [
        str(found)
        for module in modules.values()
        for found in imports(module)
        if found.module.partition(".")[0] not in allowed
    ]


def part_of(module: str) -> str:
    """The part of the package ``module`` belongs to (``trainmon.node.netdev``: ``node``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(part: str) -> int | None:
    return next((index for index, layer in enumerate(LAYERS) if part in layer), None)


def imports_against_the_layers(modules: dict[str, Module]) -> list[str]:
    """Imports of a part of the same or a higher layer, and parts without a layer."""
    found = []
    for name, module in modules.items():
        part = part_of(name)
        layer = layer_of(part)
        if layer is None:
            found.append(f"{module.shown}: {part} has no layer in LAYERS")
            continue
        for imported in imports(module):
            if not within(imported.module, "trainmon"):
                continue
            target = part_of(imported.module)
            if target == part or imported.module == "trainmon":
                continue
            target_layer = layer_of(target)
            if target_layer is None and "." not in imported.module.removeprefix("trainmon."):
                # ``from trainmon import __version__`` names a value, not a part
                target_layer = 0 if hasattr(trainmon, target) else None
            if target_layer is None or target_layer >= layer:
                found.append(f"{imported} ({part}, layer {layer}, imports "
                             f"{target}, layer {target_layer})")
    return found


def test_every_part_imports_only_lower_layers() -> None:
    modules = all_modules()
    parts = {part_of(name) for name in modules}
    assert {"node", "collectors", "cli", "client", "report"} <= parts

    assert imports_against_the_layers(modules) == []


@pytest.mark.parametrize(("module", "source"), [
    ("diagnosis/rules.py", "from trainmon.runs import regression\n"),  # up
    ("node/netdev.py", "def later():\n    from trainmon import gpu\n"),  # sibling
    ("core/registry.py", "import trainmon.http.server\n"),  # up, from the core
])
def test_an_upward_or_sibling_import_is_caught(tmp_path: Path, module: str,
                                                source: str) -> None:
    root = _package_copy(tmp_path)
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + source, encoding="utf-8")

    found = imports_against_the_layers(all_modules(root))

    assert len(found) >= 1
    assert all(entry.startswith(f"trainmon/{module}:") for entry in found), found


def test_a_part_without_a_layer_is_caught(tmp_path: Path) -> None:
    root = _package_copy(tmp_path)
    (root / "newpart.py").write_text("X = 1\n", encoding="utf-8")

    assert imports_against_the_layers(all_modules(root)) == [
        "trainmon/newpart.py: newpart has no layer in LAYERS"]


def test_only_collectors_and_wiring_import_the_collectors() -> None:
    modules = all_modules()
    assert "trainmon.node.netdev" in modules, "the walk missed the source packages"

    assert collector_imports_outside_collectors(modules) == []


def test_the_client_needs_only_the_standard_library() -> None:
    closure = client_closure(all_modules())
    assert {"trainmon.client.reporter", "trainmon.training.protocol", "trainmon"} <= set(closure)
    assert not FRAMEWORK_CALLBACKS & set(closure)

    assert third_party_imports(closure) == []
    assert import_time_framework_imports(closure) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from trainmon.collectors.network import parse_net_dev\n", "trainmon.collectors.network"),
        ("import trainmon.collectors.disk\n", "trainmon.collectors.disk"),
        ("from trainmon import collectors\n", "trainmon.collectors"),
        ("from ..collectors import gpu\n", "trainmon.collectors"),
        ("def later():\n    from trainmon.collectors import gpu\n", "trainmon.collectors.gpu"),
        ("import importlib\nimportlib.import_module('trainmon.collectors.gpu')\n",
         "trainmon.collectors.gpu"),
    ],
)
def test_every_spelling_of_a_collector_import_is_caught(
    tmp_path: Path, source: str, expected: str
) -> None:
    """The check runs on a copy of the package with one import added to a source module."""
    root = _package_copy(tmp_path)
    module = root / "node" / "netdev.py"
    module.write_text(module.read_text(encoding="utf-8") + "\n" + source, encoding="utf-8")

    found = collector_imports_outside_collectors(all_modules(root))

    assert len(found) >= 1
    assert all(entry.startswith("trainmon/node/netdev.py:") for entry in found)
    assert any(entry.endswith(f"imports {expected}") for entry in found)


def test_a_third_party_import_deep_in_the_client_is_caught(tmp_path: Path) -> None:
    """``training/protocol.py`` is not in ``client/`` but the client imports it."""
    root = _package_copy(tmp_path)
    protocol = root / "training" / "protocol.py"
    protocol.write_text(
        protocol.read_text(encoding="utf-8") + "\ndef later():\n    import requests\n",
        encoding="utf-8",
    )

    found = third_party_imports(client_closure(all_modules(root)))

    assert [entry.rpartition(": ")[2] for entry in found] == ["imports requests"]
    assert found[0].startswith("trainmon/training/protocol.py:")


def _package_copy(tmp_path: Path) -> Path:
    """A copy of the package's Python sources, to add an import to."""
    copy = tmp_path / "trainmon"
    for path in PACKAGE_ROOT.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return copy
