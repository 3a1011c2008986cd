"""``exporter/`` is the folder that holds the Python source, not a package.

The import package is ``trainmon`` (``exporter/trainmon/``): ``import trainmon``,
``from trainmon.client import Reporter``. This file only turns an accidental
``import exporter`` (from the repository root, where the folder would otherwise
import as an empty namespace package) into a clear error.
"""

raise ImportError("exporter/ is trainmon's source folder, not a package: import trainmon instead")
