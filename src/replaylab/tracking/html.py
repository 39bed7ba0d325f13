"""HTML building blocks shared by every report: style, escaping, badges, tables, figures, pages.

Pure string functions (only the ``write_*`` functions touch the file they are
handed). Every block returns markup; arguments named ``*_html``, table cells and
section headings are markup too, so escape any data in them with :func:`escape`.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;
 margin:24px auto;padding:0 20px;color:#222;line-height:1.45}
h1{margin-bottom:4px}h2{border-bottom:2px solid #e4e4e4;padding-bottom:4px;margin-top:36px}
.src{color:#666;font-size:.88em;margin:4px 0 10px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:.92em}
th,td{border:1px solid #ddd;padding:4px 10px;text-align:right}
th:first-child,td:first-child,td.l,th.l{text-align:left}thead th{background:#f4f6f9}
tr.model td{background:#eef4fc;font-weight:600}td.best{text-decoration:underline}
.ok,.bad,.warn{border-radius:4px;padding:1px 7px;font-weight:600;font-size:.9em}
.ok{background:#dff0d8;color:#2d6a2d}.bad{background:#f8d7d4;color:#a12a1d}
.warn{background:#fcf0cf;color:#7a5a00}
.box{border-left:4px solid #a12a1d;background:#fbeeed;padding:8px 14px;margin:10px 0}
figure{margin:10px 0 18px}img{max-width:100%;display:block;border:1px solid #eee}
figcaption{color:#555;font-size:.88em;margin-top:4px}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:.82em}
ul{margin-top:4px}.row{display:flex;gap:28px;align-items:flex-start}
.row figure{flex:0 1 620px}
"""
"""The reports' style sheet: tables, badges (.ok .bad .warn), boxes, figures, ``.src`` notes."""

TD_L = "<td class='l'"
"""How a left-aligned cell starts: ``f"{TD_L}>text</td>"`` (``<td class='l'>``)."""


def escape(x: Any) -> str:
    """``str(x)`` with ``& < > " '`` escaped, for text inside markup or an attribute."""
    return html.escape(str(x))


def badge(ok: bool | None, yes: str = "pass", no: str = "fail") -> str:
    """A green (ok), red (not ok) or yellow 'n/a' (None) label with the text yes or no."""
    if ok is None:
        return "<span class='warn'>n/a</span>"
    return f"<span class='{'ok' if ok else 'bad'}'>{escape(yes if ok else no)}</span>"


def table(head: Sequence[str], rows: Sequence[Sequence[str]],
          row_cls: Sequence[str] | None = None) -> str:
    """A table with a header row; ``row_cls`` gives each body row's class (e.g. 'model').

    Cells are markup: plain ones are wrapped in ``<td>`` (right-aligned), ones that
    start with ``<td`` are used as they are. A header is left-aligned when its
    column's first cell starts with :data:`TD_L`.
    """
    first = rows[0] if rows else []
    th = "".join(f"<th class='{'l' if j < len(first) and first[j].startswith(TD_L) else ''}'>"
                 f"{h}</th>" for j, h in enumerate(head))
    body = "".join(
        f"<tr class='{(row_cls or [''] * len(rows))[i]}'>" + "".join(
            c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>"
        for i, r in enumerate(rows))
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def facts_table(facts: Mapping[str, Any]) -> str:
    """A two-column 'fact / value' table, values in ``<code>`` (dicts and lists as JSON);
    a '(none reported)' note when facts is empty."""
    rows = [[f"{TD_L}>{escape(k)}</td>", f"{TD_L}><code>" + escape(
        json.dumps(v, default=str) if isinstance(v, (dict, list)) else v) + "</code></td>"]
        for k, v in facts.items()]
    return table(["fact", "value"], rows) if rows else "<p class='src'>(none reported)</p>"


def embedded_figure(path: Path | None, caption_html: str) -> str:
    """The PNG at path inlined as base64 (the page opens anywhere), with its caption;
    a '(figure not drawn: ...)' note when path is None or missing."""
    if path is None or not Path(path).exists():
        return f"<p class='src'>(figure not drawn: {escape(caption_html)})</p>"
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f"<figure><img alt='{escape(Path(path).stem)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{caption_html}</figcaption></figure>")


def linked_figure(path: Path, caption: str, page_dir: Path) -> str:
    """An image linked by its path relative to page_dir (the page's folder), with a text
    caption."""
    return (f'<figure><img src="{escape(Path(path).relative_to(page_dir))}" '
            f'style="max-width:100%"><figcaption>{escape(caption)}</figcaption></figure>')


def section(heading_html: str, *parts: str, level: int = 2) -> str:
    """``<h2>heading</h2>`` (or another level) followed by the parts, concatenated."""
    return f"<h{level}>{heading_html}</h{level}>" + "".join(parts)


def page(title: str, body: Iterable[str], css: str = CSS) -> str:
    """A complete HTML5 page: utf-8, the title (text), the style sheet, the body parts."""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{escape(title)}</title><style>{css}</style></head>"
            f"<body>{''.join(body)}</body></html>")


def write_page(path: Path, text: str) -> Path:
    """Write a page's text as UTF-8 to path (its folder made if needed); return path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_html_report(path: Path, title: str, facts: Mapping[str, Any],
                      figures: Mapping[str, Path]) -> Path:
    """A plain self-contained page: a facts table (dicts and lists as JSON) and the
    figures linked relative to the page, captioned by their names. Returns path."""
    path = Path(path)
    rows = "".join(
        f"<tr><th>{escape(k)}</th><td><code>"
        f"{escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)}"
        f"</code></td></tr>" for k, v in facts.items())
    imgs = "".join(linked_figure(p, n, path.parent) for n, p in figures.items())
    return write_page(path,
                      f"<!doctype html><meta charset='utf-8'><title>{escape(title)}</title>"
                      f"<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
                      f"<h1>{escape(title)}</h1><table>{rows}</table>{imgs}</body>")
