"""The static tier's tokenizer as data: a per-codepoint normalization table (`charmap.tsv`).

A BERT WordPiece tokenizer (MiniLM's, kept by model2vec's distillation) is
`BertNormalizer` -> `BertPreTokenizer` -> `WordPiece`. An engine without the
HF `tokenizers` library cannot run its Rust code, so the exporter writes what
those two first steps do, codepoint by codepoint, as a table any language can
apply (docs/specs/router-scorer.md, "Tokenizer"):

    # replaylab charmap 1
    <HEX codepoint> \t <class> \t <replacement: space-separated HEX codepoints, empty = deleted>

- replacement: `normalizer.normalize_str(chr(c))`, i.e. clean_text (control
  characters dropped, whitespace -> " "), CJK ideographs padded with spaces,
  accents stripped (NFD, marks of category Mn dropped) and lowercase. Each of
  these maps one character independently of its neighbours, so the table is
  the normalizer (the one exception, canonical reordering of several combining
  marks in NFD, only reorders marks that are then dropped);
- class of the codepoint as a *normalized* character, from the pre-tokenizer
  itself: `w` whitespace (ends a word), `p` punctuation (a word of its own),
  `o` other. Found by asking `pre_tokenize_str("a" + c + "a")`.

Rows are written only for codepoints whose replacement is not themselves or
whose class is not `o` (234k of the 1.1M codepoints; CJK padding is most of
them). Surrogates (U+D800..U+DFFF) are not characters and are left out; a text
holding one is refused by the runtime as by HF `tokenizers`.

Why hand-written: no maintained package exports a tokenizer's normalization
as a portable table; this is 2.9 s of probing the real tokenizer, and the
exporter proves the table by tokenizing its parity texts both ways
(`replaylab.router.static_encoder`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

HEADER = "# replaylab charmap 1"
CLASSES = ("w", "p", "o")
MAX_CODEPOINT = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)


def _probe_class(pre_tokenizer: Any, ch: str) -> str:
    pieces = [p for p, _ in pre_tokenizer.pre_tokenize_str(f"a{ch}a")]
    if pieces == ["a", "a"]:
        return "w"
    if pieces == ["a", ch, "a"]:
        return "p"
    if pieces == [f"a{ch}a"]:
        return "o"
    raise ValueError(f"U+{ord(ch):04X}: pre-tokenizer split 'a?a' into {pieces}: not a "
                     "BertPreTokenizer (whitespace / punctuation / other)")


def check_bert_pipeline(tokenizer_json: dict) -> None:
    """Refuse a tokenizer the table cannot describe (ValueError names the part)."""
    norm, pre, model = (tokenizer_json.get(k) or {} for k in
                        ("normalizer", "pre_tokenizer", "model"))
    if norm.get("type") != "BertNormalizer":
        raise ValueError(f"normalizer {norm.get('type')!r}: the charmap describes BertNormalizer")
    if pre.get("type") != "BertPreTokenizer":
        raise ValueError(f"pre_tokenizer {pre.get('type')!r}: expected BertPreTokenizer")
    if model.get("type") != "WordPiece":
        raise ValueError(f"model {model.get('type')!r}: expected WordPiece")


def charmap_rows(tokenizer: Any) -> Iterator[tuple[int, str, str]]:
    """(codepoint, class, replacement) for every codepoint that is not (itself, `o`).

    tokenizer: a HF `tokenizers.Tokenizer` with BertNormalizer and BertPreTokenizer.
    """
    norm, pre = tokenizer.normalizer, tokenizer.pre_tokenizer
    if norm is None or pre is None:
        raise ValueError("the tokenizer has no normalizer or no pre-tokenizer")
    for cp in range(MAX_CODEPOINT + 1):
        if cp in SURROGATES:
            continue
        ch = chr(cp)
        out = norm.normalize_str(ch)
        cls = _probe_class(pre, ch)
        if out != ch or cls != "o":
            yield cp, cls, out


def charmap_tsv(tokenizer: Any) -> str:
    """The whole `charmap.tsv` text (LF line ends, a trailing newline)."""
    lines = [HEADER]
    for cp, cls, out in charmap_rows(tokenizer):
        lines.append(f"{cp:X}\t{cls}\t{' '.join(f'{ord(c):X}' for c in out)}")
    return "\n".join(lines) + "\n"
