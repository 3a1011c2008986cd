"""Reading a whole procfs or sysfs file with the fewest system calls.

A scrape of a default node reads a dozen small kernel files (``/proc/net/dev``,
a ``speed`` per interface, ``/proc/diskstats``, ``mountstats``, the daemon's own
``/proc/self/stat`` and ``limits``). ``read_file`` makes one ``openat``,
``read``s until the end of the file and one ``close``: four calls for a
small file, where ``Path.read_bytes`` also makes two ``fstat``, an ``ioctl``
(is it a terminal?) and two ``lseek`` (nine), and ``Path.read_text`` builds a
text wrapper besides. ``decode_text`` then gives what ``read_text`` would.
"""

from __future__ import annotations

import os

#: Bytes asked of each ``read``: more than a kernel table of a big node usually holds,
#: so that the second read is the one that finds the end of the file.
READ_CHUNK_BYTES = 1 << 16


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The whole content of ``path``.

    Raises what ``Path.read_bytes`` raises (``FileNotFoundError``, other
    ``OSError``s; a directory gives ``IsADirectoryError`` from the read instead
    of the open).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    chunks = []
    try:
        while chunk := os.read(fd, READ_CHUNK_BYTES):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode_text(data: bytes, encoding: str = "ascii") -> str:
    """``data`` as ``Path.read_text(encoding=encoding, errors="replace")`` gives it:
    undecodable bytes replaced, line ends CR LF and CR read as LF (universal newlines)."""
    text = data.decode(encoding, errors="replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text
