"""The image's build steps, run outside a container: the wheel installs and works alone.

No container engine runs here, so ``deploy_support.containerfile`` executes the
Containerfile's own RUN lines (unchanged) against folders standing for each
stage's file system. The result is started the way the image's ENTRYPOINT
starts it, from an empty working directory, so nothing from the checkout can
leak in: what runs is what the wheel contains.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testkit.daemon import free_port
from testkit.footprint import unit_environment
from tests.deploy.deploy_support import containerfile
from tests.deploy.deploy_support.common import REPO, run, shipped_trainmon_configs
from trainmon import __version__

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> containerfile.Stage:
    workspace = tmp_path_factory.mktemp("image")
    return containerfile.build(REPO / "Containerfile", REPO, workspace, sys.executable)


def isolated(tmp_path: Path) -> dict[str, str]:
    """An environment that cannot see the checkout (no PYTHONPATH, no virtualenv)."""
    return {"PYTHONPATH": "", "VIRTUAL_ENV": "", "PYTHONSAFEPATH": "1", "HOME": str(tmp_path)}


def test_the_image_runs_the_daemon_as_the_systemd_unit_does(image: containerfile.Stage) -> None:
    """The unit's Environment= (-OO, one malloc arena) is the image's, and the -OO bytecode
    of the standard library and the installed packages was compiled at build."""
    environment = unit_environment()
    assert environment["PYTHONOPTIMIZE"] == "2"
    assert {key: image.env.get(key) for key in environment} == environment
    site_packages = next(image.host_path("/opt/trainmon/lib").glob("python3*/site-packages"))
    compiled = site_packages / "trainmon" / "__pycache__"
    assert sorted(compiled.glob("cli.*.opt-2.pyc")), sorted(compiled.iterdir())


def test_image_runs_as_a_numeric_non_root_user(image: containerfile.Stage) -> None:
    assert image.user == "19400:19400"
    assert image.entrypoint == ["/opt/trainmon/bin/trainmon"]
    assert image.cmd == ["serve"]
    # Pure Python: no RUN installs a compiler or any system package.
    assert all("gcc" not in command and "apt-get" not in command for command in image.runs)


def test_installed_trainmon_comes_from_the_wheel(image: containerfile.Stage, tmp_path: Path) -> None:
    python = image.host_path("/opt/trainmon/bin/python")
    completed = run(
        [str(python), "-c", "import trainmon, sys; print(trainmon.__file__)"],
        cwd=tmp_path,
        env=isolated(tmp_path),
    )
    assert completed.returncode == 0, completed.stderr
    location = Path(completed.stdout.strip())
    assert location.is_relative_to(image.host_path("/opt/trainmon/lib"))
    assert "site-packages" in location.parts
    old_name = run([str(python), "-c", "import exporter"], cwd=tmp_path, env=isolated(tmp_path))
    assert old_name.returncode != 0, "nothing named exporter may be importable"


def test_version(image: containerfile.Stage, tmp_path: Path) -> None:
    completed = run(
        [*containerfile.entrypoint_command(image), "version"], cwd=tmp_path, env=isolated(tmp_path)
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"trainmon {__version__} (python ")


@pytest.mark.parametrize(
    "config", shipped_trainmon_configs(), ids=lambda path: str(path.relative_to(REPO))
)
def test_check_config_accepts_every_shipped_config(
    image: containerfile.Stage, tmp_path: Path, config: Path
) -> None:
    environment = {
        **isolated(tmp_path),
        # What systemd's EnvironmentFile= / LoadCredential= and the Kubernetes
        # Secret provide at run time.
        "TENCENTCLOUD_SECRET_ID": "AKIDexample",
        "CREDENTIALS_DIRECTORY": str(tmp_path),
    }
    completed = run(
        [*containerfile.entrypoint_command(image), "check-config", str(config)],
        cwd=tmp_path,
        env=environment,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"{config}: OK" in completed.stdout


def test_check_config_rejects_a_broken_config(image: containerfile.Stage, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text('collectors:\n  training:\n    socket_mode: "0999"\n')
    completed = run(
        [*containerfile.entrypoint_command(image), "check-config", str(broken)],
        cwd=tmp_path,
        env=isolated(tmp_path),
    )
    assert completed.returncode == 2
    assert "collectors.training.socket_mode" in completed.stderr


def test_installed_demo_serves_metrics(image: containerfile.Stage, tmp_path: Path) -> None:
    """The image's compose service: `serve --demo`, straight from the installed wheel."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                *containerfile.entrypoint_command(image),
                *("serve", "--demo", "--listen", f"127.0.0.1:{port}"),
            ],
            cwd=tmp_path,
            env={**os.environ, **unit_environment(), **isolated(tmp_path),
                 "PYTHONDONTWRITEBYTECODE": "1"},  # the image's: -OO, its bytecode read-only
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "trainmon_gpu_up" not in body:
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                    body = reply.read().decode()
            except OSError:
                time.sleep(0.2)
        assert f'trainmon_build_info{{mode="demo",version="{__version__}"}} 1.0' in body
        assert "trainmon_gpu_up" in body, log.read_text()
    finally:
        process.terminate()
        assert process.wait(20) == 0, log.read_text()


def test_the_image_has_the_kubernetes_extra(image: containerfile.Stage, tmp_path: Path) -> None:
    """grpcio (the kubelet's pod-resources API) is in the image, so the DaemonSet has it."""
    python = image.host_path("/opt/trainmon/bin/python")
    completed = run([str(python), "-c", "import grpc; print(grpc.__version__)"],
                    cwd=tmp_path, env=isolated(tmp_path))
    assert completed.returncode == 0, completed.stderr
