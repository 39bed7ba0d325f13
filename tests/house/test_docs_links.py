"""The docs house (issue 32): no dead link, no dead `docs/` path, no orphan page.

Checked, from the files on disk:

- every relative Markdown link `[text](path)` and image `![alt](path)` of a Markdown
  file (README.md, docs/, tests/, bench/, scripts/, scorers/) resolves to an existing
  file or folder, relative to the file that holds it; a `#anchor` must name a heading
  of the target page (GitHub's slugs);
- every `docs/...` path (`.md`, `.json`, `.png`) written anywhere in those places or
  in src/, conf/, the entry points, the Rust crate, the Makefile and pyproject.toml
  exists, relative to the repository root (pages of other projects' `docs/`,
  quoted as sources, are listed in EXTERNAL);
- every page under docs/ is reachable from docs/README.md by links or `docs/` paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = "docs"
INDEX = "docs/README.md"

# Where to look (relative to the repository root) and which files count.
SCANNED = {
    ".": ("README.md", "Makefile", "pyproject.toml"),
    "docs": ("*.md",),
    "src": ("*.py",),
    "conf": ("*.yaml",),
    "training": ("*.py",),
    "export": ("*.py",),
    "evaluation": ("*.py",),
    "bench": ("*.py", "*.md", "*.sh"),
    "scripts": ("*.py", "*.md", "*.sh"),
    "tests": ("*.py", "*.md"),
    "scorers": ("*.rs", "*.toml", "*.md"),
}
SKIP_PARTS = {"__pycache__", "target", ".venv", "node_modules"}

# `docs/` paths of other projects, cited as sources (not pages of this repository).
EXTERNAL = {
    "docs/design/metrics.md": "vllm-project/vllm (telemetry adapter sources)",
    "docs/user_guide/metrics.md": "triton-inference-server/server (telemetry adapter sources)",
    "docs/metrics_guide.md": "ROCm ATOM (telemetry adapter sources)",
}

# [text](target) and ![alt](target); target without spaces, optional "title" dropped.
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# docs/... with a file suffix, not the tail of a longer path or of a URL.
DOCS_PATH = re.compile(r"(?<![\w/.:-])docs/[\w./-]*?\.(?:md|json|png)(?![\w-])")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def scanned_files(root: Path) -> list[Path]:
    """The files whose links and `docs/` paths are checked."""
    out = set()
    for folder, patterns in SCANNED.items():
        base = root / folder
        for pattern in patterns:
            found = base.glob(pattern) if folder == "." else base.rglob(pattern)
            out.update(p for p in found if p.is_file()
                       and not SKIP_PARTS.intersection(p.relative_to(root).parts))
    return sorted(out)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _blank(match: re.Match) -> str:
    """Code replaced by spaces (newlines kept), so positions and line numbers hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def markdown_links(text: str) -> Iterator[tuple[int, str]]:
    """(line, target) of each link outside code blocks and inline code."""
    prose = INLINE_CODE.sub(_blank, FENCE.sub(_blank, text))
    for m in LINK.finditer(prose):
        yield _line(prose, m.start()), m.group(1)


def docs_paths(text: str) -> Iterator[tuple[int, str]]:
    """(line, path) of each `docs/...` path written in the text (code included)."""
    for m in DOCS_PATH.finditer(text):
        yield _line(text, m.start()), m.group(0)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the page's headings (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub(_blank, page.read_text(encoding="utf-8"))
    for m in HEADING.finditer(text):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def _link_problem(source: Path, target: str, root: Path) -> str | None:
    """Why a relative link of `source` is dead, or None when it resolves."""
    path, _, anchor = target.partition("#")
    dest = (source.parent / path).resolve() if path else source
    if path and not dest.exists():
        return "no such file"
    if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(root) if dest.is_relative_to(root) else dest}"
    return None


def dead_links(files: Iterable[Path], root: Path,
               external: dict[str, str] | None = None) -> list[str]:
    """'file:line: target (why)' for each dead Markdown link or `docs/` path."""
    external = EXTERNAL if external is None else external
    bad = []
    for source in files:
        text = source.read_text(encoding="utf-8")
        where = source.relative_to(root)
        if source.suffix == ".md":
            for line, target in markdown_links(text):
                if SCHEME.match(target):
                    continue
                why = _link_problem(source, target, root)
                if why:
                    bad.append(f"{where}:{line}: ({target}) {why}")
        for line, path in docs_paths(text):
            if path not in external and not (root / path).exists():
                bad.append(f"{where}:{line}: {path} does not exist")
    return bad


def _targets(page: Path, root: Path) -> Iterator[Path]:
    """Pages a page leads to: its relative links and its `docs/` paths."""
    text = page.read_text(encoding="utf-8")
    for _, target in markdown_links(text):
        path = target.partition("#")[0]
        if path and not SCHEME.match(target):
            yield (page.parent / path).resolve()
    for _, path in docs_paths(text):
        yield (root / path).resolve()


def orphans(root: Path, index: str = INDEX, docs: str = DOCS) -> list[str]:
    """Pages under docs/ that no chain of links from the index reaches."""
    start = (root / index).resolve()
    seen, todo = {start}, [start]
    while todo:
        page = todo.pop()
        for dest in _targets(page, root):
            if dest.suffix == ".md" and dest.is_file() and dest not in seen:
                seen.add(dest)
                todo.append(dest)
    pages = {p.resolve() for p in (root / docs).rglob("*.md")}
    return sorted(str(p.relative_to(root.resolve())) for p in pages - seen)


# ---------------------------------------------------------------- the repository
def test_no_dead_link_or_docs_path_in_the_repository():
    files = scanned_files(REPO)
    assert REPO / INDEX in files and REPO / "README.md" in files
    bad = dead_links(files, REPO)
    assert not bad, "dead links or docs/ paths:\n" + "\n".join(bad)


def test_every_docs_page_is_reachable_from_the_index():
    lost = orphans(REPO)
    assert not lost, f"pages no link from {INDEX} reaches:\n" + "\n".join(lost)


def test_external_docs_paths_are_still_cited():
    """An EXTERNAL entry nobody cites any more goes (the list only shrinks)."""
    cited = {path for f in scanned_files(REPO)
             for _, path in docs_paths(f.read_text(encoding="utf-8"))}
    assert set(EXTERNAL) <= cited, set(EXTERNAL) - cited


# ---------------------------------------------------------------- the checker itself
def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_the_checker_finds_dead_links_paths_anchors_and_orphans(tmp_path):
    d = "docs" + "/"  # built, so this file's own source holds no dead docs/ path
    _tree(tmp_path, {
        "README.md": f"See [the index]({d}README.md) and `{d}gone.md`.\n",
        f"{d}README.md": ("# Index\n\n[a](design/a.md), [a's part](design/a.md#part-two)"
                          ", [missing](design/missing.md), [bad anchor](design/a.md#nope)"
                          ", [web](https://example.org/x.md)\n"),
        f"{d}design/a.md": ("# A\n\n## Part two\n\n[back](../README.md)\n"
                            "```\n[in code](not-checked.md)\n```\n"),
        f"{d}design/orphan.md": "# Nobody links here\n",
        "src/pkg/mod.py": f'"""Rules: {d}design/a.md; upstream `{d}metrics_guide.md`."""\n',
    })
    files = scanned_files(tmp_path)
    bad = dead_links(files, tmp_path, external={f"{d}metrics_guide.md": "upstream"})
    assert any(b.startswith("README.md:1:") and f"{d}gone.md" in b for b in bad)
    assert any("(design/missing.md) no such file" in b for b in bad)
    assert any("(design/a.md#nope) no heading #nope" in b for b in bad)
    assert len(bad) == 3, bad  # the good link, anchor, URL, code block and upstream pass
    assert orphans(tmp_path) == [f"{d}design/orphan.md"]
    # without the allow-list, the upstream project's path counts as dead
    assert len(dead_links(files, tmp_path, external={})) == 4


def test_slugs_follow_github():
    assert slug("Why 3 ms is out of reach, and what it would take") == \
        "why-3-ms-is-out-of-reach-and-what-it-would-take"
    assert slug("Speed (`bench/bench_fleet.py`)") == "speed-benchbench_fleetpy"
    assert slug("The champion on the challenger's rows") == "the-champion-on-the-challengers-rows"
