"""Compile the bytecode the node daemon loads as deployed: ``python -m trainmon.bytecode``.

The systemd units and the container run ``trainmon serve`` with
``PYTHONOPTIMIZE=2`` (``-OO``: docstrings and ``assert`` statements left out of
the loaded code, 1 MiB less resident memory; docs/benchmarks.md, "Resident
memory of the node daemon"). Python then reads ``*.opt-2.pyc`` files, which
``pip install`` does not write, and the deployed daemon cannot write them
either (``ProtectSystem=strict``, a read-only image, ``PYTHONDONTWRITEBYTECODE``):
without them every start compiles every module from source, which costs
seconds and leaves more memory behind than the docstrings saved. This command
writes them once, at install time, for the standard library and the
environment's packages (trainmon among them). It is quiet and idempotent: an
up-to-date file is skipped. Exit status 1 if a module failed to compile (a
folder that cannot be written is reported and skipped).
"""

from __future__ import annotations

import compileall
import os
import re
import sys
import sysconfig
from pathlib import Path

#: The optimization level the deployed daemon runs at (``PYTHONOPTIMIZE``), which
#: deploy/systemd/*.service and the Containerfile set (tests/deploy checks they agree).
DEPLOYED_OPTIMIZATION = 2

#: What CPython's own install leaves out (test data written not to compile), and the
#: install's tools in the environment, which the daemon never imports.
_SKIPPED = re.compile(r"bad_coding|badsyntax|lib2to3/tests/data|/test/|/tests/|/idle_test/"
                      r"|/site-packages/(pip|setuptools|pkg_resources|_distutils_hack|wheel)/")
#: Within the standard library's folder: the interpreter's own site-packages, compiled
#: (as ``purelib``) only when it is this environment's.
_STDLIB_SKIPPED = re.compile(_SKIPPED.pattern + r"|/site-packages/")


def folders() -> list[str]:
    """The standard library, this environment's package folders and trainmon's own
    (outside them in an editable install), each once."""
    paths = sysconfig.get_paths()
    package = str(Path(__file__).resolve().parent)
    return list(dict.fromkeys([*(paths[key] for key in ("stdlib", "purelib", "platlib")),
                               package]))


def compile_deployed_bytecode() -> bool:
    """Write the ``-OO`` bytecode of every module in ``folders()``; False if one failed."""
    ok = True
    stdlib = sysconfig.get_paths()["stdlib"]
    for folder in folders():
        if not os.access(folder, os.W_OK):  # a system Python's, for a user's virtualenv
            print(f"{folder}: not writable, left as it is", file=sys.stderr)
            continue
        skipped = _STDLIB_SKIPPED if folder == stdlib else _SKIPPED
        ok = compileall.compile_dir(folder, quiet=1, rx=skipped,
                                    optimize=DEPLOYED_OPTIMIZATION, workers=0) and ok
    return ok


if __name__ == "__main__":
    sys.exit(0 if compile_deployed_bytecode() else 1)
