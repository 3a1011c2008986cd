"""A minimal kustomize: builds the subset of kustomization features trainmon uses.

The kustomize binary is not packaged for Debian and cannot be downloaded in
the test environment, so the tests assemble ``deploy/kubernetes`` with this
instead. It implements exactly these fields and refuses every other one, so a
new feature in a kustomization fails loudly here rather than being ignored:

- ``resources``: YAML files (several documents each) and folders holding a
  ``kustomization.yaml``, built recursively first;
- ``configMapGenerator`` with ``name`` and ``files`` (the key is the file name),
  with ``generatorOptions.disableNameSuffixHash: true`` (the hash is not
  implemented);
- ``namespace``: set on every namespaced object;
- ``labels`` with ``pairs`` (``includeSelectors``/``includeTemplates`` false):
  added to every object's ``metadata.labels``;
- ``images`` with ``name``, ``newName``, ``newTag``: container and init
  container images of pod templates;
- ``patches`` with an inline ``patch`` that is ``$patch: delete`` of one object
  (``apiVersion``, ``kind``, ``metadata.name``, optionally ``metadata.namespace``),
  which must match exactly one object, as kustomize requires.

Semantics follow kustomize v5: a level's transformers apply to everything it
builds, including what its ``resources`` produced; its patches come first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "resources",
    "configMapGenerator",
    "generatorOptions",
    "images",
    "patches",
}
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "RuntimeClass",
}


class KustomizeError(ValueError):
    """The kustomization uses something this assembler does not implement."""


def build(folder: Path) -> list[Manifest]:
    """Every object the kustomization in ``folder`` produces."""
    path = folder / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text(encoding="utf-8"))
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError(f"{path}: unsupported fields {sorted(unknown)}")
    if kustomization.get("kind") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")

    objects: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        target = (folder / entry).resolve()
        if target.is_dir():
            objects.extend(build(target))
        else:
            objects.extend(_documents(target))
    objects.extend(_config_maps(folder, kustomization, path))
    for entry in kustomization.get("patches", []):
        _delete(objects, entry, path)

    namespace = kustomization.get("namespace")
    for manifest in objects:
        if namespace and manifest["kind"] not in CLUSTER_SCOPED_KINDS:
            manifest["metadata"]["namespace"] = namespace
        for label_set in kustomization.get("labels", []):
            _add_labels(manifest, label_set, path)
        for image in kustomization.get("images", []):
            _set_image(manifest, image, path)
    _check_unique(objects, path)
    return objects


def _documents(path: Path) -> Iterator[Manifest]:
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise KustomizeError(f"{path}: every document must be a Kubernetes object")
        yield document


def _config_maps(folder: Path, kustomization: Manifest, path: Path) -> Iterator[Manifest]:
    generators = kustomization.get("configMapGenerator", [])
    options = kustomization.get("generatorOptions", {})
    if generators and options != {"disableNameSuffixHash": True}:
        raise KustomizeError(f"{path}: only generatorOptions.disableNameSuffixHash: true")
    for generator in generators:
        if set(generator) != {"name", "files"}:
            raise KustomizeError(f"{path}: configMapGenerator supports name and files only")
        data = {}
        for name in generator["files"]:
            if "=" in name or Path(name).is_absolute() or ".." in Path(name).parts:
                raise KustomizeError(f"{path}: files must be plain names below the folder")
            data[Path(name).name] = (folder / name).read_text(encoding="utf-8")
        yield {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generator["name"]},
            "data": data,
        }


def _delete(objects: list[Manifest], entry: Manifest, path: Path) -> None:
    """Apply a ``$patch: delete`` patch: remove the one object it names."""
    patch = yaml.safe_load(entry["patch"]) if set(entry) == {"patch"} else None
    if (not isinstance(patch, dict) or patch.get("$patch") != "delete"
            or set(patch) != {"$patch", "apiVersion", "kind", "metadata"}
            or set(patch["metadata"]) - {"name", "namespace"}):
        raise KustomizeError(f"{path}: patches supports inline `$patch: delete` patches only")
    metadata = patch["metadata"]
    matches = [
        manifest for manifest in objects
        if (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"])
        == (patch["apiVersion"], patch["kind"], metadata["name"])
        and metadata.get("namespace", manifest["metadata"].get("namespace"))
        == manifest["metadata"].get("namespace")
    ]
    if len(matches) != 1:
        raise KustomizeError(f"{path}: a patch matches {len(matches)} objects, not one: {metadata}")
    objects.remove(matches[0])


def _add_labels(manifest: Manifest, label_set: Manifest, path: Path) -> None:
    if set(label_set) - {"pairs", "includeSelectors", "includeTemplates"} or (
        label_set.get("includeSelectors") or label_set.get("includeTemplates")
    ):
        raise KustomizeError(f"{path}: labels supports pairs only (no selectors, templates)")
    labels = manifest["metadata"].setdefault("labels", {})
    labels.update(label_set["pairs"])


def _set_image(manifest: Manifest, image: Manifest, path: Path) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise KustomizeError(f"{path}: images supports name, newName and newTag only")
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name, _, tag = container["image"].partition(":")
        if name != image["name"]:
            continue
        name = image.get("newName", name)
        tag = image.get("newTag", tag)
        container["image"] = f"{name}:{tag}" if tag else name


def _check_unique(objects: list[Manifest], path: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for manifest in objects:
        key = (
            manifest["kind"],
            manifest["metadata"].get("namespace", ""),
            manifest["metadata"]["name"],
        )
        if key in seen:
            raise KustomizeError(f"{path}: {key} is defined twice")
        seen.add(key)


def by_kind_and_name(objects: list[Manifest]) -> dict[tuple[str, str], Manifest]:
    """Index objects by ``(kind, name)`` (copies, so callers can mutate them)."""
    return {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
