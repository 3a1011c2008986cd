"""Fixtures of the deployment tests (helpers live in the ``deploy_support`` package here)."""

from __future__ import annotations

import pytest

from tests.deploy.deploy_support import kustomize
from tests.deploy.deploy_support.common import KUBERNETES, VARIANTS


@pytest.fixture(scope="session")
def overlays() -> dict[str, list[kustomize.Manifest]]:
    """The objects each Kubernetes overlay produces, assembled as kustomize would."""
    return {variant: kustomize.build(KUBERNETES / "overlays" / variant) for variant in VARIANTS}
