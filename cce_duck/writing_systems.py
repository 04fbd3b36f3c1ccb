"""Writing systems: Unicode tables for word splitting beyond Latin script.

- :data:`NO_SPACE`: character ranges of scripts written without spaces between words (CJK
  ideographs, kana, Hangul, Thai, Lao, Khmer, Myanmar); runs of them are indexed as bigrams.
- :data:`MARKS`: combining marks (Devanagari vowel signs and virama, Arabic and Hebrew points,
  Latin combining accents, ...). Python's ``\\w`` does not match them, so without this class
  ``मेरी`` would split into ``म`` and ``र``.
- :data:`FOLD`: a ``str.translate`` table applied after NFKC and case folding: any decimal digit
  becomes its ASCII digit, zero-width joiners and soft hyphens disappear (a zero-width space
  becomes a space), Russian yo (U+0451) folds to ie (U+0435), and Arabic is lightly normalised (optional
  vowel marks and tatweel removed, alef/yeh/teh-marbuta variants unified) the way Lucene's
  Arabic normaliser does. Latin accents are kept: ``año`` and ``ano`` stay different words.
- :func:`script_of`: a coarse script label of a word, for "a word in another script" checks.
"""

from __future__ import annotations

import unicodedata

__all__ = ["FOLD", "KATAKANA", "MARKS", "NO_SPACE", "script_of"]

NO_SPACE = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff\u31f0-\u31ff"  # Hiragana, Katakana (+ phonetic extensions)
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\U00020000-\U0002fa1f"  # CJK extension B and later
)
KATAKANA = "\u30a0-\u30ff\u31f0-\u31ff"

_SYMBOL_MARKS = (range(0x20D0, 0x2100), range(0xFE00, 0xFE10), range(0xFE20, 0xFE30))


def _mark_ranges() -> str:
    """Combining marks of the BMP outside :data:`NO_SPACE` and symbol/variation marks."""
    no_space = [(0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1100, 0x11FF), (0x1780, 0x17FF),
                (0x3040, 0x30FF), (0x3130, 0x318F)]
    out: list[str] = []
    start = prev = -2
    skip = {cp for a, b in no_space for cp in range(a, b + 1)}
    skip.update(cp for r in _SYMBOL_MARKS for cp in r)
    category = unicodedata.category
    for cp in range(0x0300, 0x10000):
        if category(chr(cp))[0] != "M" or cp in skip:
            continue
        if cp != prev + 1:
            if start >= 0:
                out.append(_range(start, prev))
            start = cp
        prev = cp
    out.append(_range(start, prev))
    return "".join(out)


def _range(a: int, b: int) -> str:
    return f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}"


MARKS = _mark_ranges()


def _fold_table() -> dict[int, str | None]:
    table: dict[int, str | None] = {}
    for cp in range(0x80, 0x10000):  # NFKC already maps mathematical digits to ASCII
        c = chr(cp)
        if c.isdecimal():
            table[cp] = str(unicodedata.decimal(c))
    table.update({
        ord("\u2019"): "'",  # right single quotation mark as apostrophe
        0x200B: " ",  # zero-width space separates words
        0x200C: None, 0x200D: None, 0x2060: None, 0xFEFF: None, 0x00AD: None,
        ord("ё"): "е",
        0x0640: None,  # Arabic tatweel
        ord("أ"): "ا", ord("إ"): "ا", ord("آ"): "ا", ord("ٱ"): "ا",
        ord("ى"): "ي", ord("ة"): "ه",
    })
    for cp in (*range(0x064B, 0x0660), 0x0670):  # Arabic harakat, superscript alef
        table[cp] = None
    return table


FOLD = _fold_table()

_SCRIPTS: tuple[tuple[int, int, str], ...] = (
    (0x0000, 0x024F, "latin"), (0x0370, 0x03FF, "greek"), (0x0400, 0x052F, "cyrillic"),
    (0x0590, 0x05FF, "hebrew"), (0x0600, 0x06FF, "arabic"), (0x0750, 0x077F, "arabic"),
    (0x0900, 0x097F, "devanagari"), (0x0980, 0x0DFF, "indic"), (0x0E00, 0x0EFF, "thai"),
    (0x1E00, 0x1EFF, "latin"), (0x3040, 0x30FF, "cjk"), (0x3400, 0x9FFF, "cjk"),
    (0xAC00, 0xD7AF, "hangul"), (0xF900, 0xFAFF, "cjk"), (0xFB50, 0xFDFF, "arabic"),
    (0xFE70, 0xFEFF, "arabic"), (0x20000, 0x2FA1F, "cjk"),
)


def script_of(word: str) -> str:
    """Coarse script of a word, from its first character (``"other"`` when unknown)."""
    cp = ord(word[0]) if word else 0
    for a, b, name in _SCRIPTS:
        if a <= cp <= b:
            return name
    return "other"
