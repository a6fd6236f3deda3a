"""From a Wikipedia dump to BERT's text format: one sentence per line, a blank line between documents.

    prepare("enwiki-latest-pages-articles.xml.bz2", "wiki/", workers=8)   # -> wiki/wiki-00000.txt, ...

Input: a MediaWiki XML export (`.xml`, or compressed: bz2, including Wikipedia's multistream files, gzip or
xz, recognised by their first bytes), streamed with `xml.etree.ElementTree.iterparse`, each <page> dropped
from the tree once read, so memory does not grow with the dump; or a Hugging Face `wikipedia` /
`wikimedia/wikipedia` dataset saved with `save_to_disk` (columns id, url, title, text; the text is already
plain).

Kept: articles, i.e. pages of namespace 0 that are neither redirects (a <redirect/> element or text starting
with #REDIRECT) nor disambiguation pages (a template of the {{disambiguation}} family, see `DISAMBIGUATION`,
or a title ending in "(disambiguation)"). Counted, not kept: redirects, disambiguation pages, pages of other
namespaces, and articles with no prose left after cleaning.

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

Output: OUTPUT/wiki-00000.txt, wiki-00001.txt, ... with `docs_per_shard` articles each (the last one
fewer; an article that is empty after cleaning takes its place in the count but writes nothing), in the
dump's order, byte-identical for any number of workers. Workers convert and split; the main process reads
the dump and writes the shards in order.

Resumable: a shard is written to NAME.partial and renamed when complete; OUTPUT/progress.json (the source,
its size, docs_per_shard, and every complete shard with its counts, size and sha256) is rewritten after
each shard. A rerun with the same source and output re-reads the dump but skips the conversion of the
articles of complete shards, and writes what an uninterrupted run writes. OUTPUT/wikipedia.json, the
manifest (source, counts, shards, seconds), is written last and atomically. Every shard and record is fsynced
before its rename; a write that fails (a full disk) keeps the complete shards, as an interruption does. A run
holds OUTPUT.lock (flock) while it writes: a second run on the same output is refused.

Bad input (`WikipediaError`, one line): a missing or empty file, bytes that are not XML, XML that is not a
MediaWiki export, a truncated or corrupt compressed file, a dump without a <page> or without an article
that has text, an output that is a file or a folder that holds something else. When the input turns out bad
while shards are being written, this run's files are removed: no manifest and no shard is left behind.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import multiprocessing as mp
import os
import platform
import re
import sys
import time
import xml.etree.ElementTree as ET
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import mwparserfromhell
from mwparserfromhell import nodes as _nodes

from ..files import OutputBusy, OutputLock, describe_os_error, fsync_dir
from .text import DataInputError, is_hf_dataset

FORMAT_VERSION = 1
MANIFEST = "wikipedia.json"
PROGRESS = "progress.json"
SHARD = "wiki-{:05d}.txt"
_SHARD_RE = re.compile(r"^wiki-\d{5,}\.txt(\.partial)?$")
DEFAULT_DOCS_PER_SHARD = 10000
LICENSE = "the dump's licence (Wikipedia text: CC BY-SA 4.0 and GFDL)"


class WikipediaError(DataInputError):
    """Bad input to `prepare`: the message (one line) names the file, the problem and the fix."""


@dataclass
class Page:
    id: str
    title: str
    ns: int
    redirect: str | None  # the target, when the page is a redirect
    text: str


# ---------------------------------------------------------------------------------------------- reading


def _sniff(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(6)
    if not head:
        raise WikipediaError(f"{path}: the file is empty; give a MediaWiki XML dump (.xml or .xml.bz2)")
    if head.startswith(b"BZh"):
        return "bz2"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        raise WikipediaError(f"{path}: 7z archives are not supported; use the .xml.bz2 dump or extract it (7z x)")
    return None


def _open_dump(path: Path):
    """(raw file, decompressed stream, compression) of a dump; raw.tell() is how far it has been read."""
    compression = _sniff(path)
    raw = open(path, "rb")
    if compression == "bz2":
        stream = bz2.BZ2File(raw)
    elif compression == "gzip":
        stream = gzip.GzipFile(fileobj=raw)
    elif compression == "xz":
        stream = lzma.LZMAFile(raw)
    else:
        stream = raw
    return raw, stream, compression


class _EofReader:
    """A stream that remembers whether it was read to the end (a parse error there is a truncated file)."""

    def __init__(self, stream):
        self.stream, self.eof = stream, False

    def read(self, size=-1):
        data = self.stream.read(size)
        if not data:
            self.eof = True
        return data


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


_REDIRECT_TEXT = re.compile(r"\s*#redirect\b", re.IGNORECASE)


def iter_pages(path: str | Path, on_progress: Callable[[int], None] | None = None) -> Iterator[Page]:
    """The pages of a MediaWiki XML dump, in order, streamed (plain, bz2, gzip or xz). A page with several
    revisions gives its last one. `on_progress(bytes)` is told after each page how far into the (compressed)
    file the reader is. Raises WikipediaError on a file that is not a complete MediaWiki export."""
    path = Path(path)
    if not path.is_file():
        raise WikipediaError(f"{path}: no such file; give the path of a MediaWiki XML dump (.xml or .xml.bz2)"
                             if not path.exists() else f"{path}: not a file; give a MediaWiki XML dump")
    raw, stream, compression = _open_dump(path)
    pages = 0
    try:
        reader = _EofReader(stream)
        events = iter(ET.iterparse(reader, events=("start", "end")))
        try:
            _, root = next(events)
            if _local(root.tag) != "mediawiki":
                raise WikipediaError(f"{path}: XML but not a MediaWiki export (the root element is "
                                     f"<{_local(root.tag)}>, expected <mediawiki>)")
            ns = root.tag[:-len("mediawiki")]
            page_tag, siteinfo_tag = ns + "page", ns + "siteinfo"
            namespaces: dict[str, int] = {}
            for event, elem in events:
                if event != "end":
                    continue
                if elem.tag == page_tag:
                    page = _page(elem, ns, namespaces)
                    root.clear()  # drop the page (and everything before it) from the tree
                    pages += 1
                    yield page
                    if on_progress is not None:
                        on_progress(raw.tell())
                elif elem.tag == siteinfo_tag:
                    for item in elem.iter(ns + "namespace"):
                        if item.text and item.get("key", "").lstrip("-").isdigit():
                            namespaces[item.text.strip().lower()] = int(item.get("key"))
        except ET.ParseError as e:
            what = "ends early (truncated?)" if reader.eof and pages else "is not well-formed XML"
            raise WikipediaError(f"{path}: {what} ({e}); give a complete MediaWiki XML dump") from None
        except EOFError:
            raise WikipediaError(f"{path}: the {compression} stream ends early: the file is truncated "
                                 "(an interrupted download?); download it again") from None
        except (OSError, lzma.LZMAError) as e:
            if compression is None:
                raise WikipediaError(f"{path}: cannot read: {e}") from None
            raise WikipediaError(f"{path}: corrupt {compression} data ({e}); download the dump again") from None
        except StopIteration:
            raise WikipediaError(f"{path}: holds no XML; give a MediaWiki XML dump") from None
        if pages == 0:
            raise WikipediaError(f"{path}: the dump holds no <page>; give a dump with pages (pages-articles)")
    finally:
        stream.close()
        raw.close()


def _page(elem, ns: str, namespaces: dict[str, int]) -> Page:
    title = (elem.findtext(ns + "title") or "").strip()
    number = (elem.findtext(ns + "ns") or "").strip()
    if number.lstrip("-").isdigit():
        namespace = int(number)
    else:  # exports before schema 0.5 have no <ns>: the title's prefix says
        prefix = title.split(":", 1)[0].strip().lower() if ":" in title else ""
        namespace = namespaces.get(prefix, 0)
    redirect = elem.find(ns + "redirect")
    revisions = elem.findall(ns + "revision")
    text = (revisions[-1].findtext(ns + "text") or "") if revisions else ""
    target = None
    if redirect is not None:
        target = redirect.get("title") or ""
    elif _REDIRECT_TEXT.match(text):
        target = ""
    return Page(id=(elem.findtext(ns + "id") or "").strip(), title=title, ns=namespace, redirect=target, text=text)


# The {{disambiguation}} family on the English Wikipedia: the template, its redirects, and its variants
# (every "... disambiguation" template such as {{hospital disambiguation}}, and the short-named ones).
DISAMBIGUATION = ("disambiguation", "disambig", "disamb", "dab", "hndis", "geodis", "numberdis",
                  "mil-unit-dis", "letter-numbercombdisambig", "letter-number combination disambiguation")
_DISAMBIGUATION_RE = re.compile(
    r"\{\{\s*(?:template\s*:\s*)?(?:" + "|".join(re.escape(n).replace(r"\ ", "[ _]") for n in DISAMBIGUATION)
    + r"|[^{}|\n]*?[ _]disambiguation|[^{}|\n]*?disambig)\s*(?:\||\}\})", re.IGNORECASE)


def is_disambiguation(title: str, text: str) -> bool:
    return title.rstrip().lower().endswith("(disambiguation)") or bool(_DISAMBIGUATION_RE.search(text))


def page_kind(page: Page) -> str:
    """"article", "redirect", "disambiguation" or "other_namespace"."""
    if page.ns != 0:
        return "other_namespace"
    if page.redirect is not None:
        return "redirect"
    if is_disambiguation(page.title, page.text):
        return "disambiguation"
    return "article"


def is_article(page: Page) -> bool:
    """Namespace 0, not a redirect, not a disambiguation page."""
    return page_kind(page) == "article"


# ---------------------------------------------------------------------------------------------- cleaning

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


def _convert(task):
    """Worker: (kind, [(article index, text)]) -> [(article index, sentences)]."""
    kind, items = task
    to_paragraphs = wikitext_to_paragraphs if kind == "wikitext" else text_to_paragraphs
    return [(index, split_into_sentences(to_paragraphs(text))) for index, text in items]


# ---------------------------------------------------------------------------------------------- writing


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file, then a rename."""
    tmp = path.with_name(path.name + ".tmp")  # the name _ours() knows
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())  # durable before the rename makes it the record
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _ours(path: Path) -> bool:
    return bool(_SHARD_RE.match(path.name)) or path.name in (
        MANIFEST, PROGRESS, MANIFEST + ".tmp", PROGRESS + ".tmp")


class _ShardWriter:
    """Articles arrive in order (index, sentences); shard k holds articles [k N, (k + 1) N). Each shard is
    written to NAME.partial and renamed once its last article is in; then progress.json is rewritten."""

    def __init__(self, output: Path, docs_per_shard: int, identity: dict, done: list[dict]):
        self.output, self.n, self.identity = output, docs_per_shard, identity
        self.shards = list(done)
        self.base = sum(r["articles"] for r in done)  # articles in the complete shards
        self.file = None
        self.partial: Path | None = None
        self._new_record()

    def _new_record(self) -> None:
        self.record = {"file": SHARD.format(len(self.shards)), "articles": 0, "documents": 0,
                       "empty_after_cleaning": 0, "sentences": 0, "bytes": 0}
        self.hash = hashlib.sha256()

    def add(self, index: int, sentences: list[str]) -> None:
        assert index == self.base + self.record["articles"], "articles out of order"
        if self.file is None:
            self.partial = self.output / (self.record["file"] + ".partial")
            self.file = open(self.partial, "wb")
        r = self.record
        r["articles"] += 1
        if sentences:
            data = ("\n" if r["documents"] else "") + "\n".join(sentences) + "\n"
            data = data.encode("utf-8")
            self.file.write(data)
            self.hash.update(data)
            r["documents"] += 1
            r["sentences"] += len(sentences)
            r["bytes"] += len(data)
        else:
            r["empty_after_cleaning"] += 1
        if r["articles"] == self.n:
            self.commit()

    def commit(self) -> None:
        if self.file is None:
            return
        self.file.flush()
        os.fsync(self.file.fileno())  # the shard's bytes reach the disk before its name and progress.json do
        self.file.close()
        self.file = None
        self.record["sha256"] = self.hash.hexdigest()
        os.replace(self.partial, self.output / self.record["file"])
        self.partial = None
        self.shards.append(self.record)
        self.base += self.record["articles"]
        _commit_shard(self.output, self.identity, self.shards)
        self._new_record()

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.partial is not None:
            self.partial.unlink(missing_ok=True)
            self.partial = None


def _write_progress(output: Path, identity: dict, shards: list[dict]) -> None:
    _write_json(output / PROGRESS, {"identity": identity, "shards": shards})


def _commit_shard(output: Path, identity: dict, shards: list[dict]) -> None:
    """Record the complete shards (after each one): what a rerun skips."""
    _write_progress(output, identity, shards)


# ---------------------------------------------------------------------------------------------- prepare


def _source_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file())
    return path.stat().st_size


def _check_source(source: Path, source_type: str | None) -> str:
    if not source.exists():
        raise WikipediaError(f"{source}: no such file or folder; give a MediaWiki XML dump (.xml or .xml.bz2) "
                             "or a Hugging Face wikipedia dataset folder")
    if source.is_dir():
        if source_type == "dump":
            raise WikipediaError(f"{source}: a folder, not a dump file; for a dataset saved with save_to_disk "
                                 "use --hf-dataset")
        if not is_hf_dataset(source):
            raise WikipediaError(f"{source}: not a `datasets` folder saved with save_to_disk (no "
                                 "dataset_info.json, dataset_dict.json or state.json)")
        return "hf-dataset"
    if source_type == "hf-dataset":
        raise WikipediaError(f"{source}: a file, not a dataset folder; for an XML dump use --dump")
    if not source.is_file():
        raise WikipediaError(f"{source}: not a regular file; give a MediaWiki XML dump")
    try:
        _sniff(source)
    except OSError as e:
        raise WikipediaError(f"{source}: cannot read: {e.strerror or e}") from None
    return "dump"


def _check_output(output: Path, identity: dict, overwrite: bool) -> list[dict]:
    """The complete shards a rerun keeps (a verified prefix of progress.json); raises on an output that is
    a file or holds something else."""
    if output.exists() and not output.is_dir():
        raise WikipediaError(f"--output {output} is an existing file; give a folder (new, or one this tool "
                             "wrote for the same dump)")
    if not output.exists():
        return []
    entries = list(output.iterdir())
    foreign = sorted(p.name for p in entries if not _ours(p))
    if foreign:
        raise WikipediaError(f"--output {output} holds other files ({', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}); give a new or empty folder")
    if overwrite or not entries:
        for p in entries:
            p.unlink()
        return []
    progress = _read_json(output / PROGRESS) or {}
    manifest = _read_json(output / MANIFEST) or {}
    recorded = progress.get("identity") or manifest.get("identity")
    if recorded is None and not any(_SHARD_RE.match(p.name) and not p.name.endswith(".partial") for p in entries):
        for p in entries:  # only half-written files of a run stopped before its first shard
            p.unlink()
        return []
    if recorded != identity:
        if recorded is None:
            raise WikipediaError(f"--output {output} holds shards without {PROGRESS}; pass --overwrite to "
                                 "start over")
        raise WikipediaError(f"--output {output} holds the output of {recorded.get('source')} with "
                             f"--docs-per-shard {recorded.get('docs_per_shard')}; rerun with those to resume, "
                             "or pass --overwrite to start over")
    shards = progress.get("shards") or manifest.get("shards") or []
    done = []
    for i, record in enumerate(shards):
        path = output / SHARD.format(i)
        if (not isinstance(record, dict) or record.get("file") != path.name or not path.is_file()
                or path.stat().st_size != record.get("bytes") or _sha256(path) != record.get("sha256")
                or (done and done[-1].get("articles") != identity["docs_per_shard"])):  # only the last is short
            break
        done.append(record)
    # everything after the verified prefix is redone: drop it, and any half-written shard
    keep = {r["file"] for r in done} | {PROGRESS}
    for p in entries:
        if p.name not in keep and p.name != MANIFEST:
            p.unlink()
    if len(done) < len(shards):
        (output / MANIFEST).unlink(missing_ok=True)
    return done


def _hf_pages(path: Path, on_progress) -> Iterator[Page]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a damaged folder
        raise WikipediaError(f"{path}: not a readable `datasets` dataset ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    parts = [loaded[k] for k in loaded] if isinstance(loaded, datasets.DatasetDict) else [loaded]
    rows = 0
    for part in parts:
        if "text" not in part.column_names:
            raise WikipediaError(f'{path}: the dataset has no "text" column (columns: '
                                 f'{", ".join(part.column_names)}); give a wikipedia dataset (id, url, title, text)')
        columns = [c for c in ("id", "title", "text") if c in part.column_names]
        for batch in part.select_columns(columns).iter(batch_size=1000):
            for i, text in enumerate(batch["text"]):
                rows += 1
                yield Page(id=str(batch["id"][i]) if "id" in batch else str(rows),
                           title=str(batch["title"][i] or "") if "title" in batch else "", ns=0, redirect=None,
                           text=text or "")
                if on_progress is not None:
                    on_progress(rows)
    if rows == 0:
        raise WikipediaError(f"{path}: the dataset has no rows")


def _hf_rows(path: Path) -> int:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception:
        return 0
    return sum(len(loaded[k]) for k in loaded) if isinstance(loaded, datasets.DatasetDict) else len(loaded)


def _ordered(pool, fn, tasks, in_flight):
    """Like pool.map, in order, with never more than `in_flight` tasks read ahead (a worker that dies raises
    BrokenProcessPool here instead of hanging)."""
    pending = deque()
    for task in tasks:
        pending.append(pool.submit(fn, task))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


class _Progress:
    """tqdm on a terminal; elsewhere a line on stderr every `every` seconds (and at the end)."""

    def __init__(self, enabled: bool, total: int, unit: str, label: str, every: float = 30.0):
        self.enabled, self.total, self.unit, self.label, self.every = enabled, total, unit, label, every
        self.bar = None
        self.done = 0
        self.start = self.last = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=label, file=sys.stderr)

    def update(self, done: int, articles: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(done - self.done)
            self.bar.set_postfix(articles=articles, refresh=False)
        elif time.perf_counter() - self.last >= self.every:
            self.last = time.perf_counter()
            self._line(done, articles)
        self.done = done

    def _line(self, done: int, articles: int) -> None:
        seconds = time.perf_counter() - self.start
        amount = (f"{done / 1e6:,.1f} of {self.total / 1e6:,.1f} MB" if self.unit == "B"
                  else f"{done:,} of {self.total:,} {self.unit}")
        print(f"{self.label}: {done / max(self.total, 1):.1%} ({amount}), {articles:,} articles, {seconds:.0f} s",
              file=sys.stderr, flush=True)

    def close(self, articles: int, ok: bool) -> None:
        """The last line on success; on an error nothing is left (the error is the one line)."""
        if self.bar is not None:
            self.bar.leave = ok
            self.bar.close()
        elif self.enabled and ok:
            self._line(self.done, articles)


def _versions() -> dict:
    from importlib.metadata import version

    return {"python": platform.python_version(), "mwparserfromhell": version("mwparserfromhell"),
            "sentencex": version("sentencex")}


def prepare(dump_or_dataset: str | Path, output: str | Path, workers: int = 1,
            docs_per_shard: int = DEFAULT_DOCS_PER_SHARD, progress: bool = True, overwrite: bool = False,
            source_type: str | None = None, batch_bytes: int = 1 << 19) -> dict:
    """A MediaWiki XML dump (file) or a Hugging Face wikipedia dataset (folder saved with save_to_disk) ->
    OUTPUT/wiki-NNNNN.txt in BERT's text format and OUTPUT/wikipedia.json. Returns the manifest.

    workers: processes that clean and split (the output does not depend on it). source_type: "dump" or
    "hf-dataset" to insist on one (default: a folder is a dataset, a file a dump). Resumes the shards of an
    interrupted run with the same source and docs_per_shard; `overwrite` starts over instead."""
    start = time.perf_counter()
    if workers < 1 or docs_per_shard < 1:
        raise WikipediaError("--workers and --docs-per-shard must be >= 1")
    source, output = Path(dump_or_dataset), Path(output)
    kind = _check_source(source, source_type)
    size = _source_size(source)
    identity = {"source": str(source.resolve()), "type": kind, "bytes": size, "docs_per_shard": docs_per_shard,
                "format_version": FORMAT_VERSION}
    try:
        lock = OutputLock(output)  # a second run writing the same folder is refused, not interleaved
    except OutputBusy as e:
        raise WikipediaError(str(e)) from None
    except OSError as e:
        raise WikipediaError(f"--output {output}: cannot create it ({e.strerror}); choose a folder that can be "
                             "written") from None
    try:
        return _prepare(source, output, kind, size, identity, overwrite, workers, docs_per_shard, progress,
                        batch_bytes, start)
    except OSError as e:  # before the shards (progress.json, the folder itself): nothing is lost
        raise WikipediaError(f"{describe_os_error(e)}; fix the cause (free space) and run the same command "
                             "again") from None
    finally:
        lock.release()


def _prepare(source: Path, output: Path, kind: str, size: int, identity: dict, overwrite: bool, workers: int,
             docs_per_shard: int, progress: bool, batch_bytes: int, start: float) -> dict:
    done = _check_output(output, identity, overwrite)
    manifest = _read_json(output / MANIFEST)
    if manifest and manifest.get("identity") == identity and len(done) == len(manifest.get("shards", [])):
        return manifest  # complete already: every shard verified
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    _write_progress(output, identity, done)  # from the start, the folder says whose output it is

    counts = {"pages": 0, "articles_kept": 0, "redirects": 0, "disambiguation": 0, "other_namespaces": 0,
              "empty_after_cleaning": 0, "sentences": 0, "bytes": 0}
    skip = sum(r["articles"] for r in done)  # articles of the complete shards: read, not converted
    writer = _ShardWriter(output, docs_per_shard, identity, done)
    if kind == "dump":
        bar = _Progress(progress, size, "B", f"{source.name} -> text")
        compression = _sniff(source)
    else:
        bar = _Progress(progress, _hf_rows(source), "rows", f"{source.name} -> text")
        compression = None
    articles = 0  # article indices handed out, skipped ones included

    def on_progress(position: int) -> None:
        bar.update(position, articles)

    def tasks():
        nonlocal articles
        pages = iter_pages(source, on_progress) if kind == "dump" else _hf_pages(source, on_progress)
        text_kind = "wikitext" if kind == "dump" else "plain"
        batch, batch_size = [], 0
        for page in pages:
            counts["pages"] += 1
            what = page_kind(page)
            if what == "redirect":
                counts["redirects"] += 1
            elif what == "disambiguation":
                counts["disambiguation"] += 1
            elif what == "other_namespace":
                counts["other_namespaces"] += 1
            else:
                index = articles
                articles += 1
                if index < skip:
                    continue
                batch.append((index, page.text))
                batch_size += len(page.text)
                if batch_size >= batch_bytes or len(batch) >= 512:
                    yield text_kind, batch
                    batch, batch_size = [], 0
        if batch:
            yield text_kind, batch

    pool = None
    ok = False
    try:
        if workers == 1:
            results = map(_convert, tasks())
        else:
            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
            results = _ordered(pool, _convert, tasks(), in_flight=3 * workers)
        for result in results:
            for index, sentences in result:
                writer.add(index, sentences)
        writer.commit()  # the last shard, with fewer articles
        if articles < skip:
            raise WikipediaError(f"{source}: holds {articles:,} articles but {PROGRESS} records {skip:,} in "
                                 "complete shards; pass --overwrite to start over")
        shards = writer.shards
        for record in shards:
            counts["articles_kept"] += record["documents"]
            counts["empty_after_cleaning"] += record["empty_after_cleaning"]
            counts["sentences"] += record["sentences"]
            counts["bytes"] += record["bytes"]
        if counts["articles_kept"] == 0:
            raise WikipediaError(f"{source}: no article with text ({counts['pages']:,} pages: "
                                 f"{counts['redirects']:,} redirects, {counts['disambiguation']:,} disambiguation, "
                                 f"{counts['other_namespaces']:,} in other namespaces, "
                                 f"{counts['empty_after_cleaning']:,} empty after cleaning)")
        manifest = {
            "kind": "wikipedia-text",
            "format": "BERT text: one sentence per line, a blank line between documents",
            "source": {"path": str(source), "type": kind, "bytes": size, "compression": compression,
                       "license": LICENSE},
            "identity": identity,
            "docs_per_shard": docs_per_shard,
            "counts": counts,
            "shards": shards,
            "resumed_shards": len(done),
            "workers": workers,
            "seconds": time.perf_counter() - start,
            "versions": _versions(),
        }
        _write_json(output / MANIFEST, manifest)  # last
        ok = True
    except WikipediaError:
        # bad input: nothing of this output is a conversion of it; leave nothing that looks complete
        writer.abort()
        for p in output.iterdir() if output.is_dir() else []:
            if _ours(p):
                p.unlink()
        if created:
            output.rmdir()
        raise
    except OSError as e:  # a full disk (or an unreadable dump): complete shards stay, as for an interruption
        writer.abort()
        raise WikipediaError(f"{describe_os_error(e)}; the complete shards in {output} are kept: fix the cause "
                             "(free space) and run the same command again to resume") from None
    except BaseException:
        writer.abort()  # interrupted: complete shards and progress.json stay for the rerun
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        bar.close(articles, ok)
    return manifest
