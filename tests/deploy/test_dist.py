"""``make dist``: a wheel and an sdist with the LICENSE, and a client that works without the
daemon's dependencies (README.md, "Putting the client into training images").

``make dist`` runs on a copy of the files a build reads (pyproject.toml, README.md,
LICENSE, the Makefile, exporter/), with the suite's own virtualenv as ``VENV`` and its
``bin/trainmon`` taken as up to date (``make -o``), so the checkout's dist/ and
virtualenv are left as they are. The client check installs the wheel with
``--no-deps`` into a fresh virtualenv that holds nothing else.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.deploy.deploy_support.common import REPO, run, tool
from trainmon import __version__

pytestmark = pytest.mark.integration

#: SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the text SPDX
#: ``Apache-2.0`` names (also Debian's /usr/share/common-licenses/Apache-2.0).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "Makefile", "exporter")
WHEEL = f"trainmon-{__version__}-py3-none-any.whl"
SDIST = f"trainmon-{__version__}.tar.gz"
#: What ``trainmon.client`` needs: the client and the two modules it imports.
CLIENT_FILES = ("trainmon/client/__init__.py", "trainmon/client/reporter.py",
                "trainmon/client/transport.py", "trainmon/training/protocol.py",
                "trainmon/logthrottle.py")


def test_the_license_file_is_the_license_pyproject_names() -> None:
    # one `license = "<SPDX expression>"` line (tomllib is Python 3.11+, the suite 3.10+)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r'^license = "(.*)"$', pyproject, re.MULTILINE) == ["Apache-2.0"]
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert b'org.opencontainers.image.licenses="Apache-2.0"' in (
        REPO / "Containerfile").read_bytes()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(REPO / name, source / name)
    venv = Path(sys.prefix)
    completed = run([tool("make"), "-C", str(source), "dist", f"VENV={venv}",
                     "-o", f"{venv}/bin/trainmon"], timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return source / "dist"


def test_make_dist_builds_a_wheel_and_an_sdist_with_the_client_and_the_license(
    dist: Path,
) -> None:
    assert sorted(path.name for path in dist.iterdir()) == sorted([WHEEL, SDIST])
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"trainmon-{__version__}.dist-info/METADATA").decode()
    assert set(CLIENT_FILES) <= names
    assert f"trainmon-{__version__}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    with tarfile.open(dist / SDIST) as sdist:
        members = set(sdist.getnames())
    root = f"trainmon-{__version__}"
    assert {f"{root}/LICENSE", f"{root}/pyproject.toml"} <= members
    assert {f"{root}/exporter/{name}" for name in CLIENT_FILES} <= members


#: Run in the fresh virtualenv: the daemon's dependencies are absent, the client imports
#: and reports without them, and loads nothing outside the standard library.
CLIENT_ALONE = """
import importlib.util, json, sys
absent = [name for name in ("prometheus_client", "pynvml", "requests", "yaml", "bcrypt")
          if importlib.util.find_spec(name) is not None]
from trainmon.client import Reporter
reporter = Reporter(job="resnet50", rank=0, world_size=1)
for _ in reporter.track(range(3)):
    reporter.step(samples=32)
reporter.close()
loaded = sorted({name.partition(".")[0] for name in sys.modules}
                - set(sys.stdlib_module_names) - {"trainmon", "__main__"})
print(json.dumps({"present": absent, "loaded": loaded}))
"""


def test_the_client_runs_from_the_wheel_without_the_daemon_dependencies(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)]).returncode == 0
    python = venv / "bin" / "python"
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install",
                     "--quiet", "--no-deps", "--no-index", str(dist / WHEEL)], timeout=120)
    assert installed.returncode == 0, installed.stderr
    completed = run([str(python), "-I", "-c", CLIENT_ALONE], cwd=tmp_path,
                    env={"TRAINMON_ENDPOINT": f"unix://{tmp_path}/no-daemon.sock"})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == '{"present": [], "loaded": []}', completed.stdout
