"""Wikitext -> clean prose paragraphs -> sentences, as BERT's text format wants them.

    split_into_sentences(wikitext_to_paragraphs(page.text))

Cleaning (`wikitext_to_paragraphs`, with mwparserfromhell): templates are dropped (infoboxes, navboxes,
citations, parser functions), except a few inline ones whose text is part of the sentence (`{{nowrap|..}}`,
`{{lang|xx|..}}`, `{{lang-xx|..}}`, `{{convert|3|km}}` -> "3 km"); dropped too: tables, <ref>..</ref> and
<ref/>, images and files ([[File:..]] with their captions), categories, interlanguage links, comments,
<math>, <gallery> and other non-prose tags, bare and numbered external links, and whole boilerplate
sections ("See also", "References", "External links", ...). Kept: the text of links ([[target|text]] ->
text, [[target]] -> target), of labelled external links, of formatting tags, bold and italic (without their
markup). Headings end a paragraph and are not kept; every list item is a paragraph of its own.

Sentences: `sentencex` (Wikimedia's rule-based segmenter, compiled; "Dr. Smith", "e.g.", "U.S.", "3.14" do
not end a sentence), per paragraph.
"""

from __future__ import annotations

import re

import mwparserfromhell
from mwparserfromhell import nodes as _nodes

# Tags whose content is not prose (dropped whole); others keep their content.
_DROP_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "ce", "score", "timeline", "imagemap",
              "syntaxhighlight", "source", "pre", "graph", "mapframe", "maplink", "templatedata", "includeonly",
              "hiero", "inputbox", "categorytree", "charinsert", "section", "indicator", "templatestyles",
              "style", "script", "noinclude"}
_BLOCK_TAGS = {"p", "div", "blockquote", "ul", "ol", "dl", "center", "poem", "hr", "h1", "h2", "h3", "h4", "h5",
               "h6", "caption", "figure"}
_LINE_ITEMS = {"li", "dt", "dd"}
_DROP_LINK_NAMESPACES = {"file", "image", "media", "category", "datei", "bild", "fichier", "imagen", "archivo",
                         "kategorie", "catégorie", "categoría", "categoria", "ファイル", "画像", "カテゴリ"}
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]+)*\s*:")
# Sections that hold no prose (lists of links, citations); dropped up to the next heading of their level.
_SKIP_SECTIONS = {"see also", "references", "external links", "further reading", "notes", "notes and references",
                  "references and notes", "bibliography", "sources", "citations", "footnotes", "gallery",
                  "works cited", "external link", "reference", "other websites"}
# Inline templates whose text belongs to the sentence: name -> the positional arguments (0-based) shown,
# as a function of the arguments' plain text.
_RANGE_WORDS = ("-", "–", "to", "and", "or", "by", "x", "and(-)", "to(-)")


def _first(a):
    return [0][:len(a)]


def _convert_args(a):
    return [0, 1, 2, 3][:len(a)] if len(a) > 3 and a[1] in _RANGE_WORDS else [0, 1][:len(a)]


_KEEP_TEMPLATES = {
    "nowrap": _first, "nobr": _first, "nobold": _first, "noitalic": _first, "small": _first, "smaller": _first,
    "big": _first, "sic": lambda a: [len(a) - 1] if a else [], "lang": lambda a: [1][:len(a) - 1],
    "langx": lambda a: [1][:len(a) - 1], "transl": lambda a: [len(a) - 1] if a else [],
    "convert": _convert_args, "cvt": _convert_args,
}

_SPACE = re.compile(r"\s+")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_QUOTES = re.compile(r"'{2,}")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:.]?\s*\)|\[\s*\]")
_OPEN_PAREN_JUNK = re.compile(r"\(\s*[,;:]\s*")
_SPACE_BEFORE = re.compile(r"\s+([,.;:!?)\]])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[])\s+")


# where something invisible was: a line holding nothing else is no line (as in MediaWiki). A noncharacter
# (removed from the input first); not NUL, at which the parser's tokenizer stops.
_DROPPED = "\ufdd0"
_DROPPED_LINE = re.compile(r"\n[ \t]*\ufdd0[\ufdd0 \t]*(?=\n)")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_REF = re.compile(r"<ref(?:\s[^<>]*)?/>|<ref(?:\s[^<>]*)?>.*?</ref\s*>", re.DOTALL | re.IGNORECASE)


class _Renderer:
    """Walks mwparserfromhell's nodes and collects the visible prose; "\n\n" marks a paragraph break."""

    def __init__(self):
        self.out: list[str] = []
        self.line_item = False  # inside a wiki list item: the next newline ends the paragraph

    def text(self, s: str) -> None:
        if self.line_item:
            i = s.find("\n")
            if i >= 0:
                s = s[:i] + "\n\n" + s[i + 1:]
                self.line_item = False
        self.out.append(s)

    def paragraph_break(self) -> None:
        self.line_item = False
        self.out.append("\n\n")

    def top(self, nodes) -> None:
        skip_level = None
        for node in nodes:
            if isinstance(node, _nodes.Heading):
                self.paragraph_break()
                title = _SPACE.sub(" ", node.title.strip_code()).strip().lower()
                if skip_level is not None and node.level <= skip_level:
                    skip_level = None
                if skip_level is None and title in _SKIP_SECTIONS:
                    skip_level = node.level
            elif skip_level is None:
                self.node(node)

    def nodes(self, nodes) -> None:
        for node in nodes:
            self.node(node)

    def node(self, node) -> None:
        n = _nodes
        if isinstance(node, n.Text):
            self.text(node.value)
        elif isinstance(node, n.Wikilink):
            self.wikilink(node)
        elif isinstance(node, n.Tag):
            self.tag(node)
        elif isinstance(node, n.Template):
            self.template(node)
        elif isinstance(node, n.HTMLEntity):
            try:
                self.out.append(node.normalize())
            except (ValueError, OverflowError):
                pass
        elif isinstance(node, n.ExternalLink):
            # [http://x label] shows its label; a bare URL, [http://x] and a numbered [http://x 1] are
            # not prose
            if node.title is not None and not str(node.title).strip().isdigit():
                self.nodes(node.title.nodes)
            else:
                self.out.append(_DROPPED)
        elif isinstance(node, n.Heading):
            self.paragraph_break()
        else:  # Comment, Argument ({{{1}}}) and anything else: nothing visible
            self.out.append(_DROPPED)

    def wikilink(self, node) -> None:
        title = str(node.title).strip()
        if title.startswith(":"):  # [[:Category:X]]: a visible link to a namespace page
            title = title[1:].strip()
        elif ":" in title:
            prefix = title.split(":", 1)[0].strip().lower()
            if prefix in _DROP_LINK_NAMESPACES:
                self.out.append(_DROPPED)
                return
            if node.text is None and _INTERLANGUAGE.match(title):
                self.out.append(_DROPPED)  # [[de:Zürich]]: an interlanguage link, not shown in the text
                return
        if node.text is not None and str(node.text).strip():
            self.nodes(node.text.nodes)
        else:
            self.text(title)

    def tag(self, node) -> None:
        tag = str(node.tag).strip().lower()
        if tag in _DROP_TAGS:
            if tag == "table":
                self.paragraph_break()
            else:
                self.out.append(_DROPPED)
            return
        if tag in _LINE_ITEMS:
            self.paragraph_break()
            if node.wiki_markup:  # "* item", "; term", ": text": the item runs to the end of the line
                self.line_item = True
            elif node.contents is not None:
                self.nodes(node.contents.nodes)
                self.paragraph_break()
            return
        if tag == "br":
            self.out.append(" ")
            return
        block = tag in _BLOCK_TAGS
        if block:
            self.paragraph_break()
        if node.contents is not None and not node.self_closing:
            self.nodes(node.contents.nodes)
        if block:
            self.paragraph_break()

    def template(self, node) -> None:
        name = _SPACE.sub(" ", str(node.name).replace("_", " ")).strip().lower()
        if name.startswith("template:"):
            name = name[len("template:"):].strip()
        keep = _KEEP_TEMPLATES.get(name)
        if keep is None and name.startswith("lang-"):
            keep = _KEEP_TEMPLATES["nowrap"]
        if keep is None:
            self.out.append(_DROPPED)
            return
        positional = [p.value for p in node.params if not p.showkey]
        for i, k in enumerate(keep([str(v).strip() for v in positional])):
            if i:
                self.out.append(" ")
            self.nodes(positional[k].nodes)


def _clean_paragraph(p: str) -> str:
    p = _MAGIC_WORD.sub("", p)
    p = _QUOTES.sub("", p)
    p = _SPACE.sub(" ", p)
    p = _EMPTY_PARENS.sub("", p)
    p = _OPEN_PAREN_JUNK.sub("(", p)
    p = _SPACE_AFTER_OPEN.sub(r"\1", p)
    p = _SPACE_BEFORE.sub(r"\1", p)
    p = _SPACE.sub(" ", p).strip()
    if "{{" in p or "}}" in p or "{|" in p or "|}" in p:
        return ""  # markup the parser could not match (an unclosed template or table): not prose
    p = p.replace("[[", "").replace("]]", "").strip()
    if not any(ch.isalnum() for ch in p):
        return ""
    return p


def wikitext_to_paragraphs(text: str) -> list[str]:
    """Wikitext -> the article's prose, one paragraph per item (whitespace collapsed; see the module doc)."""
    # references and comments go before parsing (a third of a typical article's bytes: citation templates)
    text = _COMMENT.sub(_DROPPED, text.replace(_DROPPED, "").replace("\x00", ""))  # NUL would end the parse
    text = _REF.sub(_DROPPED, text)
    try:
        code = mwparserfromhell.parse(text, skip_style_tags=False)
    except Exception:  # the parser gives up on a few pathological pages: no prose from them
        return []
    renderer = _Renderer()
    renderer.top(code.nodes)
    text = _DROPPED_LINE.sub("", "".join(renderer.out)).replace(_DROPPED, "")
    paragraphs = (_clean_paragraph(p) for p in _PARAGRAPH_BREAK.split(text))
    return [p for p in paragraphs if p]


_SENTENCE_END = re.compile(r"[.!?;:…\"'”’»)\]]$")


def text_to_paragraphs(text: str) -> list[str]:
    """Plain article text (a Hugging Face `wikipedia` record) -> paragraphs, one per line. A short line
    (8 words or fewer) without final punctuation is a section heading there, and is dropped."""
    out = []
    for line in text.splitlines():
        line = _SPACE.sub(" ", line).strip()
        if not line or not any(ch.isalnum() for ch in line):
            continue
        if not _SENTENCE_END.search(line) and line.count(" ") < 8:
            continue
        out.append(line)
    return out


_CJK_END = ("。", "！", "？")
# sentencex reads a single letter and a full stop as an initial ("J. R. R. Tolkien"); after a number it is a
# unit that ends the sentence ("a depth of 310 m. The Rhône ..."), which units of two letters already do
_UNIT_END = re.compile(r"(?<=\d [a-z]\.) (?=[\"'“(\[]?[A-Z])")


def split_into_sentences(paragraphs: list[str]) -> list[str]:
    """Paragraphs -> sentences with sentencex (Wikimedia's rule-based segmenter: abbreviations such as
    "Dr.", "e.g.", "U.S." and decimals such as 3.14 do not end a sentence); a paragraph always ends a
    sentence. A boundary without whitespace after it ("ASP.NET", "object.__dict__") is not one, except after
    a CJK full stop; a one-letter unit after a number ("310 m.") before a capital is one. Whitespace is
    collapsed, so no sentence holds a newline."""
    import sentencex

    out = []
    for paragraph in paragraphs:
        paragraph = _SPACE.sub(" ", paragraph).strip()
        if not paragraph:
            continue
        pending = ""
        for piece in sentencex.segment("en", paragraph):
            if pending and not pending[-1].isspace() and not pending.endswith(_CJK_END):
                pending += piece  # no whitespace at the boundary: the same sentence
                continue
            out.extend(_UNIT_END.split(pending.strip()) if pending.strip() else [])
            pending = piece
        out.extend(_UNIT_END.split(pending.strip()) if pending.strip() else [])
    return out


def convert_batch(task):
    """Worker: (kind, [(article index, text)]) -> [(article index, sentences)]."""
    kind, items = task
    to_paragraphs = wikitext_to_paragraphs if kind == "wikitext" else text_to_paragraphs
    return [(index, split_into_sentences(to_paragraphs(text))) for index, text in items]
