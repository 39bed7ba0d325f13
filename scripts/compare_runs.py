"""Compare two `make run` output folders: summaries key by key, manifests file by file.

    python scripts/compare_runs.py BEFORE AFTER      # e.g. outputs/make-run of two commits
    python scripts/compare_runs.py BEFORE AFTER --rtol 1e-9   # floats to a relative tolerance

A refactor that moves code and changes no behaviour leaves every summary leaf equal
(timings, run paths and export timestamps aside) and every exported file with the same
sha256. Prints each difference and exits 1 if there is one, 0 otherwise. --rtol: two
floats within that relative tolerance count as equal (a refactor that sums the same terms
in another order moves the last bits; the default 0 is exact).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KINDS = ("demand", "router")
# leaves that differ between two runs of the same code: wall time, when the artifact was
# made, the MLflow run id, and what the registry already held (its version numbers and
# which blobs it could reuse depend on the store's history, not on the run)
VOLATILE = ("/wall_seconds", "/seconds", "/artifact_path", "/created_at", "/valid_until",
            "/content_hash", "/mlflow/run_id",
            # what the encoder cache already held (a fresh clone exports the encoder again)
            "/encoder/cache_hits", "/encoder/cache_misses")
VOLATILE_PARTS = ("/timings_s/", "/registry/")
# an absolute path into a checkout (maybe after "source:"), up to its src/replaylab/ or outputs/
CHECKOUT = re.compile(r"(^|:)/\S*?(/src/replaylab/|/outputs/)")


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, f"{prefix}/{i}")
    else:
        yield prefix, node


def volatile(key: str) -> bool:
    return any(key.endswith(tail) for tail in VOLATILE) or any(
        part in key for part in VOLATILE_PARTS)


def relative(value: Any, root: Path) -> Any:
    """A path the run wrote, relative to its output folder (the folders differ); a path in
    a checkout (the package's data, the outputs/ cache), relative to the checkout."""
    if not isinstance(value, str):
        return value
    if value.startswith(str(root)):
        return "<run>" + value[len(str(root)):]
    return CHECKOUT.sub(r"\1<checkout>\2", value, count=1)


def same(x: Any, y: Any, rtol: float = 0.0) -> bool:
    """Equal leaves; two floats also when within rtol of each other (relative)."""
    if x == y:
        return True
    return (rtol > 0 and isinstance(x, float) and isinstance(y, float)
            and math.isclose(x, y, rel_tol=rtol, abs_tol=0.0))


def compare_json(before: Path, after: Path, label: str, rtol: float = 0.0) -> list[str]:
    a = {k: relative(v, before.parent.resolve())
         for k, v in leaves(json.loads(before.read_text()))}
    b = {k: relative(v, after.parent.resolve()) for k, v in leaves(json.loads(after.read_text()))}
    out = [f"{label}{k}: only before" for k in sorted(a.keys() - b.keys()) if not volatile(k)]
    out += [f"{label}{k}: only after" for k in sorted(b.keys() - a.keys()) if not volatile(k)]
    out += [f"{label}{k}: {a[k]!r} != {b[k]!r}" for k in sorted(a.keys() & b.keys())
            if not volatile(k) and not same(a[k], b[k], rtol)]
    return out


def manifest_files(root: Path) -> dict[str, dict[str, str]]:
    """Each manifest under root (relative path) -> {file path: sha256}. A nested folder's
    manifest.json is left out of its parent's list (it holds its own creation time); it is
    compared as a manifest of its own, file by file."""
    found = {}
    for path in sorted(root.rglob("manifest.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("files"), list):
            found[str(path.relative_to(root))] = {
                f["path"]: f["sha256"] for f in doc["files"]
                if not f["path"].endswith("/manifest.json")}
    return found


def compare(before: Path, after: Path, rtol: float = 0.0) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    counts = {"summary_leaves": 0, "manifests": 0, "files": 0}
    for kind in KINDS:
        b_sum, a_sum = before / kind / "summary.json", after / kind / "summary.json"
        if not b_sum.is_file() or not a_sum.is_file():
            problems.append(f"{kind}: summary.json missing in {'before' if not b_sum.is_file() else 'after'}")
            continue
        problems += compare_json(b_sum, a_sum, f"{kind}/summary.json", rtol)
        counts["summary_leaves"] += sum(1 for k, _ in leaves(json.loads(b_sum.read_text()))
                                        if not volatile(k))
        b_man, a_man = manifest_files(before / kind), manifest_files(after / kind)
        for name in sorted(b_man.keys() | a_man.keys()):
            if name not in b_man or name not in a_man:
                problems.append(f"{kind}/{name}: only {'after' if name not in b_man else 'before'}")
                continue
            counts["manifests"] += 1
            counts["files"] += len(b_man[name])
            for file in sorted(b_man[name].keys() | a_man[name].keys()):
                if b_man[name].get(file) != a_man[name].get(file):
                    problems.append(f"{kind}/{name}: {file}: sha256 {b_man[name].get(file)} "
                                    f"!= {a_man[name].get(file)}")
    return problems, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rtol", type=float, default=0.0,
                        help="floats within this relative tolerance are equal (default 0: exact)")
    args = parser.parse_args(argv)
    problems, counts = compare(args.before, args.after, args.rtol)
    for line in problems:
        print(line)
    print(f"{len(problems)} differences; compared {counts['summary_leaves']} summary leaves, "
          f"{counts['manifests']} manifests, {counts['files']} files"
          + (f" (floats to rtol {args.rtol:g})" if args.rtol else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
