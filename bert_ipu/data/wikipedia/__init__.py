"""From a Wikipedia dump to BERT's text format: one sentence per line, a blank line between documents.

    prepare("enwiki-latest-pages-articles.xml.bz2", "wiki/", workers=8)   # -> wiki/wiki-00000.txt, ...

reader.py reads the dump (or a `datasets` folder) page by page and keeps the articles; wikitext.py cleans
each article's wikitext into prose paragraphs and splits them into sentences; writer.py writes the shards in
the dump's order, resumably, with a manifest last (`prepare`). data/prepare_wikipedia.py is its command line.
"""

from .reader import Page, WikipediaError, is_article, is_disambiguation, iter_pages, page_kind
from .wikitext import split_into_sentences, text_to_paragraphs, wikitext_to_paragraphs
from .writer import DEFAULT_DOCS_PER_SHARD, MANIFEST, PROGRESS, prepare

__all__ = ["DEFAULT_DOCS_PER_SHARD", "MANIFEST", "PROGRESS", "Page", "WikipediaError", "is_article",
           "is_disambiguation", "iter_pages", "page_kind", "prepare", "split_into_sentences", "text_to_paragraphs",
           "wikitext_to_paragraphs"]
