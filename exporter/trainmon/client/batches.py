"""How many samples a batch holds: what ``Reporter.step()`` counts without ``samples=``.

Standard library only; tensors and arrays are recognised by their ``shape``
(torch, numpy, JAX, TensorFlow alike), never imported. The rule,
``samples_in(batch)``, is the batch's **leading dimension**:

- anything with a ``shape`` (a tensor, an array) counts ``shape[0]``; a
  0-d value counts nothing;
- a tuple or list counts as its first element (of the first
  ``SCANNED_ELEMENTS``) that has a ``shape`` or is a mapping, so ``(x, y)``
  counts ``x.shape[0]`` and ``(texts, labels)`` counts ``labels.shape[0]``;
  with no such element it is a list of samples and counts its length
  (``["a", "b"]``, ``[[1, 2], [3, 4]]``: 2);
- a mapping counts as its first value that counts (a tensor, a nested
  mapping or a list), so ``{"input_ids": ..., "labels": ...}`` counts
  ``input_ids.shape[0]``;
- anything else (``None``, a number, a string, an object without a shape)
  counts 0.

What the rule cannot tell apart, and needs an explicit ``samples=``: a batch
left uncollated (``collate_fn=lambda samples: samples``: a list of
per-sample tensors counts the first sample's leading dimension), columns
given as plain lists (``(texts, labels)`` with both lists counts 2), and
batches whose leading dimension is not the samples (a sequence-first
``(seq, batch, ...)`` tensor).

``tuple_length_mistake(batch, samples)``: whether an explicit ``samples``
is the length of a tuple, list or mapping batch rather than its samples
(``samples=len(batch)`` for ``(x, y)`` counts 2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Elements of a tuple or list (values of a mapping) looked at for a tensor.
SCANNED_ELEMENTS = 4
#: Nesting depth of tuples, lists and mappings looked into.
MAX_DEPTH = 4

_SCALARS = (int, float, complex, str, bytes, bytearray, bool)


def samples_in(batch: object) -> int:
    """The samples in ``batch``: its leading dimension (module docstring), 0 if none.

    The usual batches (a tensor, ``(x, y)``, ``[x, y]``, a dict of tensors) take
    the fast path: one ``shape`` lookup. ``Reporter.step()`` calls this, so it
    never raises: a batch whose ``shape`` or items fail to read counts 0.
    """
    try:
        kind = batch.__class__
        if kind is tuple or kind is list:
            first = batch[0] if batch else None  # type: ignore[index]
        elif kind is dict:
            first = next(iter(batch.values()), None)  # type: ignore[attr-defined]
        else:
            first = batch
        shape = getattr(first, "shape", None)
        if shape is not None:
            try:
                count = shape[0]
            except (IndexError, TypeError):  # 0-d
                count = None
            if count.__class__ is int and count >= 0:
                return count
        elif kind is list and isinstance(first, _SCALARS):
            return len(batch)  # type: ignore[arg-type]
        found = _leading(batch, MAX_DEPTH)
    except Exception as error:  # the batch's own code failed: not ours to raise
        log.debug("trainmon: cannot count the samples of a %s batch (%s)",
                  type(batch).__name__, error)
        return 0
    return 0 if found is None else found


def tuple_length_mistake(batch: object, samples: int) -> bool:
    """True when ``samples`` equals the length of the tuple, list or mapping
    ``batch`` while its leading dimension differs (``samples=len((x, y))``)."""
    if not isinstance(batch, (tuple, list, Mapping)):
        return False
    try:
        length = len(batch)
    except Exception:  # a mapping's own __len__ failed: nothing to tell
        return False
    return samples == length and samples_in(batch) not in (0, length)


def _leading(value: object, depth: int) -> int | None:
    """The leading dimension of ``value``; None when it has none."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return _first_dimension(shape)
    if depth <= 0 or isinstance(value, _SCALARS):
        return None
    if isinstance(value, (tuple, list)):
        return _of_sequence(value, depth)
    if isinstance(value, Mapping):
        return _of_mapping(value, depth)
    return None


def _of_sequence(items: tuple[object, ...] | list[object], depth: int) -> int:
    """A tuple or list: its first tensor-like or mapping element, else its length."""
    if not items or isinstance(items[0], _SCALARS):
        return len(items)
    for index in range(min(len(items), SCANNED_ELEMENTS)):
        item = items[index]
        shape = getattr(item, "shape", None)
        if shape is not None:
            found = _first_dimension(shape)
        elif isinstance(item, Mapping) and depth > 1:
            found = _of_mapping(item, depth - 1)
        else:
            continue
        if found is not None:
            return found
    return len(items)


def _of_mapping(mapping: Mapping[object, object], depth: int) -> int | None:
    """A mapping: its first value that has a leading dimension."""
    for index, value in enumerate(mapping.values()):
        if index >= SCANNED_ELEMENTS:
            break
        found = _leading(value, depth - 1)
        if found is not None:
            return found
    return None


def _first_dimension(shape: object) -> int | None:
    """``shape[0]`` as a count; None for a 0-d shape or one that is not a shape."""
    try:
        first = int(shape[0])  # type: ignore[index]
    except (TypeError, ValueError, IndexError, OverflowError):
        return None  # 0-d, or a symbolic or unknown dimension (JAX tracing, TF None)
    return first if first >= 0 else None
