"""Compile the fake ``libnvidia-ml.so.1`` with the system C compiler.

Used by the test fixtures and by ``bench/gpu_collection.py``; runnable as
``python -m testkit.fakenvml.build OUTDIR [--old-driver]``. The library is
named and given the soname ``libnvidia-ml.so.1`` so that pynvml's
``CDLL("libnvidia-ml.so.1")`` finds it through ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"


def compiler() -> str | None:
    """The C compiler to use ($CC, else cc or gcc), or None when there is none."""
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build(directory: Path, *, old_driver: bool = False) -> Path:
    """Compile into ``directory/libnvidia-ml.so.1`` and return that path.

    ``old_driver`` leaves out the symbols an old driver lacks (see fakenvml.c).
    """
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / LIBRARY_NAME
    command = [cc, "-O2", "-Wall", "-shared", "-fPIC", f"-Wl,-soname,{LIBRARY_NAME}"]
    if old_driver:
        command.append("-DFAKENVML_OLD_DRIVER")
    command += ["-o", str(output), str(SOURCE), "-lm", "-lpthread"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return output


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--old-driver"]):
        sys.exit("usage: build.py OUTDIR [--old-driver]")
    print(build(Path(sys.argv[1]), old_driver=sys.argv[2:] == ["--old-driver"]))
