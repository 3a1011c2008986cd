"""A real filesystem that fills up or turns read-only: a small tmpfs mounted for a test.

``small_disk(folder)`` mounts a tmpfs of ``size`` bytes (mode 0755, so the ledger's
folder checks accept it) on ``folder`` and unmounts it afterwards; mounting needs root
(``CannotMount`` otherwise, for the test to skip). ``fill`` writes a file until the
kernel says ``ENOSPC``; ``remount`` turns the filesystem read-only or writable again
(the kernel refuses read-only, ``EBUSY``, while any file on it is open for writing:
``RemountRefused``).
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Longest wait for ``mount``/``umount`` (s).
MOUNT_TIMEOUT_SECONDS = 30.0
#: Bytes ``fill`` writes at a time.
CHUNK_BYTES = 4096


class CannotMount(Exception):
    """This process may not mount a tmpfs (not root, no ``CAP_SYS_ADMIN``)."""


class RemountRefused(Exception):
    """``mount -o remount`` failed (``EBUSY``: a file is open for writing)."""


@contextmanager
def small_disk(folder: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``folder`` (made when missing)."""
    folder.mkdir(mode=0o755, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(folder)], check=True, capture_output=True, text=True,
                       timeout=MOUNT_TIMEOUT_SECONDS)
    except (OSError, subprocess.CalledProcessError) as error:
        raise CannotMount(f"cannot mount a tmpfs on {folder}: {error}") from error
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True,
                       timeout=MOUNT_TIMEOUT_SECONDS)


def remount(folder: Path, *, readonly: bool) -> None:
    """Make the filesystem mounted on ``folder`` read-only (or writable again)."""
    done = subprocess.run(["mount", "-o", f"remount,{'ro' if readonly else 'rw'}",
                           str(folder)], capture_output=True, text=True,
                          timeout=MOUNT_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise RemountRefused(done.stderr.strip())


def fill(directory: Path, size: int) -> Path:
    """A file that takes every free block of ``directory``'s filesystem, of ``size``
    bytes at most (the filesystem's size: the loop is bounded by it)."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as file:  # unbuffered: nothing left for close()
        for _ in range(size // CHUNK_BYTES + 16):
            try:
                file.write(b"\0" * CHUNK_BYTES)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                return filler
    raise AssertionError(f"{directory} never filled up")
