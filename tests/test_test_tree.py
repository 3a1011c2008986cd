"""The test tree's own shape: ``tests/`` mirrors the package, helpers have one name.

- A test module imports no other test module: what two test modules share lives
  in their folder's support module (``<folder>_support.py``, or a
  ``<folder>_support/`` package where a folder has several helper modules),
  in tests/conftest.py (a fixture of several folders), or in ``testkit``
  (what ``bench/`` needs too). Importing a ``test_*`` module runs its
  module-level code again under another name and ties the two files' tests.
- Each folder of ``tests/`` tests one part of ``trainmon`` and is named after it
  (``tests/http`` → ``trainmon/http``), except the folders of ``BUNDLE_FOLDERS``,
  which test the shipped bundle rather than a module. The tests of the package's
  top-level modules sit at the top of ``tests/`` (``tests/test_cli.py`` →
  ``trainmon/cli.py``), beside those of ``WHOLE_PACKAGE``.
- A folder holds test modules, its ``conftest.py``, its support module or
  package, job scripts the tests run as processes (``*_job.py``) and data
  folders without Python; nothing else.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import trainmon

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = Path(trainmon.__file__).resolve().parent
#: Test folders without a package part of that name: they test the bundle the
#: repository ships (rules, dashboards, deployments) or the daemon as a whole.
BUNDLE_FOLDERS: dict[str, str] = {
    "alerts": "the alerting and recording rules of alerts/ in promtool, Prometheus, vmalert",
    "dashboards": "the Grafana dashboards of dashboards/ against real engines",
    "deploy": "the deployment files of deploy/ (Compose, Kubernetes, systemd, the wheel)",
    "scale": "the fleet-scale deployment (deploy/scale) with bench's simulated fleet",
    "security": "the daemon against hostile local users, clients and inputs",
}
#: Top-level test modules that name no top-level module of the package.
WHOLE_PACKAGE: dict[str, str] = {
    "test_footprint.py": "the resident memory of `trainmon serve`, all default collectors",
    "test_layering.py": "the imports of every part of the package",
    "test_promtool_lint.py": "the exposition of the whole daemon, plain and --demo",
    "test_real_gpu_doctor.py": "trainmon/doctor.py on a real NVIDIA node",
    "test_test_tree.py": "this tree",
}
TOP_LEVEL_FILES = frozenset({"__init__.py", "conftest.py"})
FOLDER_FILES = frozenset({"__init__.py", "conftest.py"})


def python_files() -> Iterator[Path]:
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path


def imported_test_modules(path: Path) -> list[str]:
    """The ``test_*`` modules ``path`` imports, anywhere in it (inside functions too); a
    ``test_*`` name imported from a module counts too (a test function would run twice)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            modules = [base] if is_test_module(base) else [
                f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
              in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            modules = [node.args[0].value]
        found += [module for module in modules if is_test_module(module)]
    return found


def is_test_module(module: str) -> bool:
    return any(part.startswith("test_") for part in module.split("."))


def test_the_check_sees_test_module_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import tests.a.test_b\n"
        "from tests.a.test_c import helper\n"
        "from tests.a import test_d\n"
        "from .test_e import x\n"
        "def f():\n"
        "    from tests.a.test_f import y\n"
        "    importlib.import_module('tests.a.test_g')\n"
        "from tests.a.a_support import helper, contest_entry\n"
        "import testkit.daemon\n"
    )
    assert imported_test_modules(sample) == [
        "tests.a.test_b", "tests.a.test_c", "tests.a.test_d", ".test_e", "tests.a.test_f",
        "tests.a.test_g"]


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    offenders = {str(path.relative_to(TESTS)): imported
                 for path in python_files() if (imported := imported_test_modules(path))}
    assert offenders == {}, (
        "these import a test module; move what they share into the folder's support "
        "module (or tests/conftest.py, or testkit)")


def test_every_test_folder_is_a_part_of_the_package_or_of_the_bundle() -> None:
    parts = {p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not parts & set(BUNDLE_FOLDERS), "a bundle folder is named like a package part"
    assert set(BUNDLE_FOLDERS) <= folders, "a bundle folder listed here is gone"
    strays = sorted(folders - parts - set(BUNDLE_FOLDERS))
    assert strays == [], f"test folders that match no part of trainmon: {strays}"
    for folder in folders:
        assert (TESTS / folder / "__init__.py").exists(), f"tests/{folder} is not a package"


def test_top_level_test_modules_name_a_top_level_module() -> None:
    modules = {p.stem for p in PACKAGE_ROOT.glob("*.py")} - {"__init__", "__main__"}
    for path in sorted(TESTS.glob("*.py")):
        if path.name in TOP_LEVEL_FILES or path.name in WHOLE_PACKAGE:
            continue
        assert path.name.startswith("test_"), f"tests/{path.name}: a helper at the top"
        assert path.stem.removeprefix("test_") in modules, (
            f"tests/{path.name} names no top-level module of trainmon: it belongs in the "
            "folder of the part it tests")
    assert set(WHOLE_PACKAGE) <= {p.name for p in TESTS.glob("*.py")}


def test_helpers_are_named_for_their_folder() -> None:
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        support = f"{folder.name}_support"
        for path in sorted(folder.iterdir()):
            if path.name == "__pycache__":
                continue
            if path.is_dir():
                has_python = any(path.rglob("*.py"))
                assert not has_python or path.name == support, (
                    f"tests/{folder.name}/{path.name}/: a helper package is named {support}/")
                if path.name == support:
                    assert (path / "__init__.py").exists()
            elif path.suffix == ".py":
                assert (path.name in FOLDER_FILES or path.name.startswith("test_")
                        or path.stem == support or path.stem.endswith("_job")), (
                    f"tests/{folder.name}/{path.name}: helpers of tests/{folder.name} live "
                    f"in {support}.py (or a {support}/ package); scripts the tests run are "
                    "*_job.py")


def test_every_file_of_a_cpu_lane_exists_and_is_in_one_lane() -> None:
    """tests/conftest.py's ``CPU_LANES``: a renamed file would silently leave its lane."""
    from tests.conftest import CPU_LANES

    paths = [path for lane in CPU_LANES.values() for path in lane]
    assert len(paths) == len(set(paths))
    for path in paths:
        assert (TESTS.parent / path).is_file(), path
