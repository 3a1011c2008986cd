"""Write the dashboards of both variants as JSON, or check the committed files.

``python -m dashboards`` writes ``dashboards/<variant>/<kind>.json`` and the
panel reference block of ``docs/dashboards.md``; ``python -m dashboards
--check`` compares instead and exits 1 naming every file that differs, is
missing or is left over. ``--out DIR`` and ``--docs FILE`` point elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dashboards import fleet, goodput, node, reference, training
from dashboards.builder import Board
from dashboards.dcgm import DCGM
from dashboards.tencent import TENCENT
from dashboards.variant import FLEET, GOODPUT, NODE, TITLES, TRAINING, Variant

VARIANTS: tuple[Variant, ...] = (DCGM, TENCENT)
DASHBOARDS: tuple[tuple[str, Callable[[Variant], Board]], ...] = (
    (TRAINING, training.build),
    (NODE, node.build),
    (FLEET, fleet.build),
    (GOODPUT, goodput.build),
)
OUTPUT = Path(__file__).resolve().parent
DOCS = OUTPUT.parent / "docs" / "dashboards.md"


def render() -> dict[Path, str]:
    """Every dashboard's JSON by its path relative to the output folder."""
    return {
        Path(variant.slug) / f"{kind}.json": build(variant).to_json()
        for variant in VARIANTS
        for kind, build in DASHBOARDS
    }


def render_docs(document: str, dashboards: dict[Path, str]) -> str:
    """``document`` (docs/dashboards.md) with its panel reference regenerated."""
    kinds = [
        (TITLES[kind], [(variant.slug, json.loads(dashboards[Path(variant.slug) / f"{kind}.json"]))
                        for variant in VARIANTS])
        for kind, _ in DASHBOARDS
    ]
    return reference.replace_block(document, reference.reference(kinds))


def write(out: Path, docs: Path) -> list[Path]:
    """Write every dashboard under ``out`` and the reference into ``docs``; the paths written."""
    dashboards = render()
    written = []
    for relative, text in dashboards.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    docs.write_text(render_docs(docs.read_text(encoding="utf-8"), dashboards), encoding="utf-8")
    return [*written, docs]


def check(out: Path, docs: Path) -> list[str]:
    """What differs between ``out``/``docs`` and the generator's output (empty: in sync)."""
    expected = render()
    problems = []
    for relative, text in expected.items():
        path = out / relative
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: differs from the generator's output")
    for variant in VARIANTS:
        for path in sorted((out / variant.slug).glob("*.json")):
            if path.relative_to(out) not in expected:
                problems.append(f"{path}: not produced by the generator")
    document = docs.read_text(encoding="utf-8")
    try:
        if render_docs(document, expected) != document:
            problems.append(f"{docs}: the panel reference differs from the generator's output")
    except ValueError as error:
        problems.append(f"{docs}: {error}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards",
                                     description="Write or check the trainmon dashboards.")
    parser.add_argument("--check", action="store_true",
                        help="compare with the generator's output; exit 1 on any difference")
    parser.add_argument("--out", type=Path, default=OUTPUT, metavar="DIR",
                        help="folder holding one sub-folder per variant (default: %(default)s)")
    parser.add_argument("--docs", type=Path, default=DOCS, metavar="FILE",
                        help="the document with the panel reference (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out, args.docs)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `make generate` (python -m dashboards) and commit the result",
                  file=sys.stderr)
            return 1
        print(f"{len(render())} dashboards and their panel reference up to date")
        return 0
    for path in write(args.out, args.docs):
        print(path)
    return 0
