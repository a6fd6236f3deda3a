"""Reading a Wikipedia source: a MediaWiki XML dump (any compression) or a `datasets` folder, page by page.

    for page in iter_pages("enwiki-latest-pages-articles.xml.bz2"):
        if is_article(page): ...

Input: a MediaWiki XML export (`.xml`, or compressed: bz2, including Wikipedia's multistream files, gzip or
xz, recognised by their first bytes), streamed with `xml.etree.ElementTree.iterparse`, each <page> dropped
from the tree once read, so memory does not grow with the dump; or a Hugging Face `wikipedia` /
`wikimedia/wikipedia` dataset saved with `save_to_disk` (columns id, url, title, text; the text is already
plain).

Kept: articles, i.e. pages of namespace 0 that are neither redirects (a <redirect/> element or text starting
with #REDIRECT) nor disambiguation pages (a template of the {{disambiguation}} family, see `DISAMBIGUATION`,
or a title ending in "(disambiguation)"). Counted, not kept: redirects, disambiguation pages, pages of other
namespaces, and articles with no prose left after cleaning.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..text import DataInputError, check_text_column, is_hf_dataset

class WikipediaError(DataInputError):
    """Bad input to `prepare`: the message (one line) names the file, the problem and the fix."""


@dataclass
class Page:
    id: str
    title: str
    ns: int
    redirect: str | None  # the target, when the page is a redirect
    text: str


def sniff(path: Path) -> str | None:
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
    compression = sniff(path)
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


def source_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file())
    return path.stat().st_size


def check_source(source: Path, source_type: str | None) -> str:
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
        sniff(source)
    except OSError as e:
        raise WikipediaError(f"{source}: cannot read: {e.strerror or e}") from None
    return "dump"


def hf_pages(path: Path, on_progress) -> Iterator[Page]:
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
        try:
            check_text_column(part, path)
        except DataInputError as e:
            raise WikipediaError(str(e)) from None
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


def hf_rows(path: Path) -> int:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception:
        return 0
    return sum(len(loaded[k]) for k in loaded) if isinstance(loaded, datasets.DatasetDict) else len(loaded)
