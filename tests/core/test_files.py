"""``trainmon.core.files``: whole files in few system calls, as pathlib reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainmon.core.files import READ_CHUNK_BYTES, decode_text, read_file


@pytest.mark.parametrize("size", [0, 1, READ_CHUNK_BYTES - 1, READ_CHUNK_BYTES,
                                  3 * READ_CHUNK_BYTES + 7])
def test_the_whole_file_whatever_its_size(tmp_path: Path, size: int) -> None:
    path = tmp_path / "table"
    path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    assert read_file(path) == path.read_bytes()
    assert read_file(str(path)) == path.read_bytes()


def test_a_procfs_file_that_reports_no_size() -> None:
    assert read_file("/proc/self/stat").startswith(f"{os.getpid()} (".encode())


def test_errors_are_those_of_pathlib(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "missing")
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_text("x")
        read_file(tmp_path / "file" / "below")
    with pytest.raises(IsADirectoryError):
        read_file(tmp_path)


@pytest.mark.parametrize("data", [b"a\nb\n", b"a\r\nb\rc\n", b"caf\xc3\xa9 \xff\xfe\n", b"",
                                  b"\r", b"x\r\n\r\n"])
@pytest.mark.parametrize("encoding", ["ascii", "utf-8"])
def test_text_as_read_text_gives_it(tmp_path: Path, data: bytes, encoding: str) -> None:
    path = tmp_path / "text"
    path.write_bytes(data)
    expected = path.read_text(encoding=encoding, errors="replace")
    assert decode_text(read_file(path), encoding) == expected
