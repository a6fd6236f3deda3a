"""From a Wikipedia dump to packed shards: the dump -> BERT text step (bert_ipu/data/wikipedia.py and
data/prepare_wikipedia.py) on tests/fixtures/wiki/tiny.xml, plain and bz2, and on a Hugging Face dataset."""

import bz2
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import prepare_wikipedia as cli  # data/ scripts, on sys.path via conftest
from bert_ipu.data import wikipedia
from bert_ipu.data.wikipedia import wikitext as wiki_text, writer as wiki_writer
from bert_ipu.data.wikipedia import (MANIFEST, PROGRESS, WikipediaError, is_article, iter_pages, page_kind, prepare,
                                     split_into_sentences, text_to_paragraphs, wikitext_to_paragraphs)

ROOT = Path(__file__).resolve().parent.parent
WIKI = Path(__file__).resolve().parent / "fixtures" / "wiki"
TINY = WIKI / "tiny.xml"
sys.path.insert(0, str(WIKI))
import make_tiny  # noqa: E402  the fixture's generator

sys.path.remove(str(WIKI))

# exact lines of the fixture's articles that the output must hold
EXPECTED_LINES = [
    "Zürich (Züri) is the largest city in Switzerland and the capital of the canton of Zürich.",
    "It is located at the north-western tip of Lake Zürich.",
    "The city covers 87.88 km2 of land.",
    "The Romans founded a customs post called Turicum on the site.",
    "UBS has its head office in the city.",
    "The SIX Swiss Exchange is based there.",
    "São Paulo is the most populous city in Brazil, with about 11.45 million inhabitants.",
    "Its metropolitan area covers 7,946.96 km², e.g. the cities of Guarulhos and Osasco.",
    "Average rainfall is 1,441.1 mm per year, according to INMET.",
    "Tokyo (東京, Tōkyō) is the capital of Japan.",
    'The name 東京 means "eastern capital".',
    "Chiyoda hosts the Imperial Palace.",
    "Shinjuku is a major commercial centre.",
    "Alice Smith (born 1950) is an American physicist.",
    "Dr. Smith arrived at 3.14 p.m. and left.",
    "She moved to the U.S. in 1975 and worked at Bell Labs, e.g. on lasers.",
    "Her measurement of the constant was 3.14159 with an error of 0.001%!",
    "Mr. Jones and Prof. Lee wrote about her work in Jan. 2001.",
    'They called it "remarkable".',
    "Lake Geneva is a lake on the north side of the Alps, shared between Switzerland and France.",
    "The lake has a surface of 580 km2 and a depth of about 310 m.",
    "The Rhône flows into it.",
    "Mercury appears in many stories.",
]
# text of pages that are not articles, and of markup that is not prose: none of it may appear
ABSENT = ["may refer to", "Mercury (planet)", "Springfield, Illinois", "John Doe", "talk page", "census numbers",
          "settlement infobox", "free online encyclopedia", "Corine Mauch", "Limmat", "Grossmünster", "Municipal Theatre",
          "List of cities", "Population figures", "Sapopemba", "District", "Largest districts", "Measuring",
          "frac", "\\rho", "Swiss census", "Censo", "Nature", "Vernex", "citation needed", "Largest city", "Zurich skyline",
          "http", "example.org", "Category", "Cities in Switzerland", "Ships", "Short description", "NOTOC"]
MARKUP = ["{{", "}}", "[[", "]]", "<ref", "</", "/>", "|", "==", "''", "&nbsp;", "<!--", "{|", "__"]


def shard_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("wiki-*.txt"))}


def documents(out: Path) -> list[list[str]]:
    docs = []
    for data in shard_files(out).values():
        text = data.decode("utf-8")
        docs += [d.split("\n") for d in text.strip("\n").split("\n\n") if d]
    return docs


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("wiki") / "out"
    manifest = prepare(TINY, out, workers=1, docs_per_shard=2, progress=False)
    return out, manifest


@pytest.fixture(scope="module")
def tiny_bz2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dump") / "tiny.xml.bz2"
    path.write_bytes(bz2.compress(TINY.read_bytes()))
    return path


def test_fixture_is_current():
    assert make_tiny.dump_xml() == TINY.read_text(encoding="utf-8"), "run tests/fixtures/wiki/make_tiny.py"


def test_iter_pages_streams_pages_and_classifies_them(tiny_bz2):
    pages = list(iter_pages(TINY))
    assert len(pages) == 15
    kinds = {p.title: page_kind(p) for p in pages}
    assert kinds == {
        "Zürich": "article", "Zurich": "redirect", "São Paulo": "article",
        "Sao Paulo": "redirect",  # no <redirect/> element: the #REDIRECT text says so
        "Mercury (disambiguation)": "disambiguation", "Tokyo": "article", "Springfield": "disambiguation",
        "Alice Smith (scientist)": "article", "Talk:Zürich": "other_namespace",
        "Template:Infobox settlement": "other_namespace", "John Doe": "disambiguation", "Lake Geneva": "article",
        "Mercury in fiction": "article",  # {{disambiguation needed}} is an inline tag, not a disambiguation page
        "Brig stub": "article", "Wikipedia:About": "other_namespace"}
    assert pages[1].redirect == "Zürich" and pages[0].redirect is None and pages[8].ns == 1
    assert "[[Corine Mauch]]" in pages[0].text and "<ref" in pages[0].text  # the raw wikitext, unescaped
    assert [(p.title, p.text) for p in iter_pages(tiny_bz2)] == [(p.title, p.text) for p in pages]
    seen = []
    list(iter_pages(tiny_bz2, on_progress=seen.append))
    assert len(seen) == 15 and seen == sorted(seen) and seen[-1] == tiny_bz2.stat().st_size


@pytest.mark.parametrize("text, title, expected", [
    ("{{disambig}}", "Mercury", False), ("{{Dab}}", "X", False), ("{{disambiguation|geo}}", "X", False),
    ("{{Hndis|Doe, John}}", "X", False), ("{{geodis}}", "X", False), ("{{Human name disambiguation}}", "X", False),
    ("{{Disambiguation needed|date=May 2021}}", "X", True), ("Prose.", "Mercury (disambiguation)", False),
    ("{{About|the lake|Lake Geneva (disambiguation)}} Prose.", "Lake Geneva", True),
])
def test_is_article_disambiguation_family(text, title, expected):
    assert is_article(wikipedia.Page("1", title, 0, None, text)) is expected


def test_wikitext_to_paragraphs():
    text = """{{Infobox city|name=[[Bern]]|mayor=[[Alec von Graffenried]]}}
'''Bern''' ({{lang|de|[[Bern|'''Bärn''']]}}) is the ''de facto'' [[capital city|capital]] of [[Switzerland]].<ref name=x>{{cite web|title=A [[nested]] ref}}</ref> It lies on the [[Aare]].<ref name=x/>
[[File:Bern.jpg|thumb|The [[Zytglogge|clock tower]] in <b>winter</b>]]
<!-- a comment --><span class="x">Its old town</span> is a <abbr>UNESCO</abbr> site.
== History ==
The city was founded in 1191.
* First item with [[Link|text]]
* Second item
After the list.
{| class="wikitable"
| cell one || cell two
|}
[[Category:Capitals]] [[de:Bern]]"""
    assert wikitext_to_paragraphs(text) == [
        "Bern (Bärn) is the de facto capital of Switzerland. It lies on the Aare. Its old town is a UNESCO site.",
        "The city was founded in 1191.", "First item with text", "Second item", "After the list."]
    assert wikitext_to_paragraphs("{{stub}}\n[[Category:X]]") == []
    assert wikitext_to_paragraphs("Odd\ufdd0 bytes\x00 stay prose.") == ["Odd bytes stay prose."]
    assert wikitext_to_paragraphs("== See also ==\n* [[Y]]\n== References ==\n{{reflist}}") == []


def test_split_into_sentences_abbreviations_and_decimals():
    assert split_into_sentences(["Dr. Smith arrived at 3.14 p.m. and left. He was from the U.S. and liked fruit, "
                                 "e.g. apples. Pi is about 3.14159.", "A second paragraph without a full stop",
                                 "São Paulo and Zürich are cities.  東京 is too."]) == [
        "Dr. Smith arrived at 3.14 p.m. and left.", "He was from the U.S. and liked fruit, e.g. apples.",
        "Pi is about 3.14159.", "A second paragraph without a full stop", "São Paulo and Zürich are cities.",
        "東京 is too."]
    assert split_into_sentences(["Mr. Jones met Prof. Lee in Jan. 2001. They talked.", "J. R. R. Tolkien wrote. "
                                 "He died in 1973.", "ASP.NET and Node.js are frameworks. Version 2.0.1 was out.",
                                 "東京は首都です。大阪は大きい。", "The tower is 300 m. It is tall, i.e. high."]) == [
        "Mr. Jones met Prof. Lee in Jan. 2001.", "They talked.", "J. R. R. Tolkien wrote.", "He died in 1973.",
        "ASP.NET and Node.js are frameworks.", "Version 2.0.1 was out.", "東京は首都です。", "大阪は大きい。",
        "The tower is 300 m.", "It is tall, i.e. high."]


def test_output_keeps_the_articles_prose(tiny_out):
    out, manifest = tiny_out
    lines = [line for data in shard_files(out).values() for line in data.decode("utf-8").split("\n")]
    for line in EXPECTED_LINES:
        assert line in lines
    docs = documents(out)
    assert [d[0] for d in docs] == [EXPECTED_LINES[0], EXPECTED_LINES[6], EXPECTED_LINES[9], EXPECTED_LINES[13],
                                    EXPECTED_LINES[19], EXPECTED_LINES[22]]
    assert docs[3][-1] == "Light and Matter (1982)"  # a list item under a heading: its own line


def test_output_drops_markup_and_pages_that_are_not_articles(tiny_out):
    out, _ = tiny_out
    text = b"".join(shard_files(out).values()).decode("utf-8")
    for piece in ABSENT + MARKUP:
        assert piece not in text, piece
    assert "History" not in text.split("\n") and "Economy" not in text  # headings are not sentences
    for data in shard_files(out).values():  # BERT's format: no blank line at either end, none doubled
        assert not data.startswith(b"\n") and b"\n\n\n" not in data and (not data or data.endswith(b"\n"))


def test_manifest_and_shards(tiny_out):
    out, manifest = tiny_out
    assert manifest == json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["counts"] | {"sentences": 0, "bytes": 0} == {
        "pages": 15, "articles_kept": 6, "redirects": 2, "disambiguation": 3, "other_namespaces": 3,
        "empty_after_cleaning": 1, "sentences": 0, "bytes": 0}
    assert manifest["counts"]["sentences"] == sum(len(d) for d in documents(out))
    assert [s["file"] for s in manifest["shards"]] == list(shard_files(out)) == [
        f"wiki-{i:05d}.txt" for i in range(4)]
    assert [s["articles"] for s in manifest["shards"]] == [2, 2, 2, 1]  # 7 articles, the last one empty
    assert manifest["shards"][3]["documents"] == 0 and manifest["shards"][3]["empty_after_cleaning"] == 1
    assert (out / "wiki-00003.txt").read_bytes() == b""
    assert manifest["source"]["bytes"] == TINY.stat().st_size and manifest["seconds"] > 0
    assert not list(out.glob("*.partial")) and not list(out.glob("*.tmp"))


def test_bz2_gives_the_same_bytes(tiny_out, tiny_bz2, tmp_path):
    manifest = prepare(tiny_bz2, tmp_path / "out", docs_per_shard=2, progress=False)
    assert shard_files(tmp_path / "out") == shard_files(tiny_out[0])
    assert manifest["source"]["compression"] == "bz2" and manifest["counts"] == tiny_out[1]["counts"]


def test_two_workers_write_the_same_bytes(tiny_out, tiny_bz2, tmp_path):
    manifest = prepare(tiny_bz2, tmp_path / "out", workers=2, docs_per_shard=2, progress=False, batch_bytes=1)
    assert shard_files(tmp_path / "out") == shard_files(tiny_out[0])
    assert manifest["counts"] == tiny_out[1]["counts"]


def test_interrupted_run_resumes_to_the_same_bytes(tiny_out, monkeypatch, tmp_path):
    out = tmp_path / "out"
    original = wiki_writer._commit_shard

    def commit_then_die(output, identity, shards):
        original(output, identity, shards)
        raise RuntimeError("simulated interruption after the first shard")

    monkeypatch.setattr(wiki_writer, "_commit_shard", commit_then_die)
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(TINY, out, docs_per_shard=2, progress=False)
    monkeypatch.setattr(wiki_writer, "_commit_shard", original)
    assert sorted(p.name for p in out.iterdir()) == [PROGRESS, "wiki-00000.txt"]  # no manifest, no .partial
    assert shard_files(out)["wiki-00000.txt"] == shard_files(tiny_out[0])["wiki-00000.txt"]

    converted = []
    real = wiki_text.wikitext_to_paragraphs
    monkeypatch.setattr(wiki_text, "wikitext_to_paragraphs", lambda text: converted.append(text) or real(text))
    manifest = prepare(TINY, out, docs_per_shard=2, progress=False)
    assert shard_files(out) == shard_files(tiny_out[0])
    assert manifest["resumed_shards"] == 1 and manifest["counts"] == tiny_out[1]["counts"]
    assert manifest["shards"] == tiny_out[1]["shards"]
    assert len(converted) == 7 - 2  # the first shard's two articles were not converted again

    # a third run finds the output complete and changes nothing
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prepare(TINY, out, docs_per_shard=2, progress=False) == manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_stopped_before_the_manifest_resumes_without_converting(tiny_out, tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare(TINY, out, docs_per_shard=2, progress=False)
    (out / MANIFEST).unlink()  # stopped after the last shard (the short one), before the manifest
    monkeypatch.setattr(wiki_text, "wikitext_to_paragraphs", lambda text: pytest.fail("converted again"))
    manifest = prepare(TINY, out, docs_per_shard=2, progress=False)
    assert manifest["resumed_shards"] == 4 and manifest["counts"] == tiny_out[1]["counts"]
    assert shard_files(out) == shard_files(tiny_out[0])


def test_multistream_bz2(tiny_out, tmp_path):
    """Wikipedia's *-multistream.xml.bz2 files are bz2 streams one after another."""
    data = TINY.read_bytes()
    cut = data.index(b"  <page>", len(data) // 2)
    path = tmp_path / "multistream.xml.bz2"
    path.write_bytes(bz2.compress(data[:cut]) + bz2.compress(data[cut:]))
    prepare(path, tmp_path / "out", docs_per_shard=2, progress=False)
    assert shard_files(tmp_path / "out") == shard_files(tiny_out[0])


def test_a_damaged_shard_is_redone(tiny_out, tmp_path):
    out = tmp_path / "out"
    prepare(TINY, out, docs_per_shard=2, progress=False)
    (out / "wiki-00002.txt").write_text("tampered\n")
    (out / MANIFEST).unlink()
    prepare(TINY, out, docs_per_shard=2, progress=False)
    assert shard_files(out) == shard_files(tiny_out[0])


def test_other_settings_do_not_mix_with_an_earlier_output(tmp_path):
    out = tmp_path / "out"
    prepare(TINY, out, docs_per_shard=2, progress=False)
    with pytest.raises(WikipediaError, match="--docs-per-shard 2.*--overwrite"):
        prepare(TINY, out, docs_per_shard=3, progress=False)
    manifest = prepare(TINY, out, docs_per_shard=3, progress=False, overwrite=True)
    assert len(manifest["shards"]) == 3 == len(shard_files(out))


EMPTY_DUMP = (b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11"><siteinfo>'
              b"<sitename>Wikipedia</sitename><namespaces><namespace key=\"0\" /></namespaces></siteinfo></mediawiki>")


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    data = TINY.read_bytes()
    compressed = bz2.compress(data)
    cases = {
        "not_xml": (b"This is a plain text file, not a dump.\n", "not well-formed XML"),
        "html": (b"<html><body><p>hello</p></body></html>", "not a MediaWiki export"),
        "truncated_bz2": (compressed[:len(compressed) // 2], "truncated"),
        "truncated_xml": (data[:len(data) * 3 // 4], "ends early"),  # after some pages: shards were written
        "empty_dump": (EMPTY_DUMP, "holds no <page>"),
        "no_article": (make_tiny.dump_xml([make_tiny.PAGES[1], make_tiny.PAGES[8]]).encode("utf-8"),
                       "no article with text"),
        "empty_file": (b"", "the file is empty"),
    }
    out = {}
    for name, (content, message) in cases.items():
        path = tmp / (name + (".xml.bz2" if "bz2" in name else ".xml"))
        path.write_bytes(content)
        out[name] = (path, message)
    out["missing"] = (tmp / "missing.xml.bz2", "no such file")
    return out


@pytest.mark.parametrize("case", ["not_xml", "html", "truncated_bz2", "truncated_xml", "empty_dump", "no_article",
                                  "empty_file", "missing"])
def test_bad_input_is_one_clear_error_and_leaves_nothing(case, tmp_path, capsys):
    path, message = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    with pytest.raises(WikipediaError, match=message) as error:
        prepare(path, out, docs_per_shard=1, progress=False)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert not out.exists()  # no manifest, no shard, no progress: the folder this run made is gone

    assert cli.main(["--dump", str(path), "--output", str(out), "--docs-per-shard", "1"]) == 2  # progress on
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not out.exists()


def test_truncated_dump_after_complete_shards_removes_them(tmp_path, monkeypatch):
    path, _ = _bad_inputs(tmp_path)["truncated_xml"]
    committed = []
    original = wiki_writer._commit_shard
    monkeypatch.setattr(wiki_writer, "_commit_shard", lambda o, i, s: committed.append(len(s)) or original(o, i, s))
    out = tmp_path / "out"
    out.mkdir()  # an existing empty folder stays, empty
    with pytest.raises(WikipediaError, match="ends early"):
        prepare(path, out, docs_per_shard=1, progress=False, batch_bytes=1)
    assert len(committed) >= 3 and list(out.iterdir()) == []


def test_output_that_is_a_file_or_holds_other_files(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    with pytest.raises(WikipediaError, match="is an existing file"):
        prepare(TINY, target, progress=False)
    assert target.read_text() == "keep me"
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(WikipediaError, match="holds files this tool did not write"):
        prepare(TINY, folder, progress=False)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert cli.main(["--dump", str(TINY), "--output", str(target)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("name", ["progress.json", "wikipedia.json", "wiki-00000.txt"])
def test_a_users_file_named_as_ours_is_never_replaced(tmp_path, name):
    """A folder holding only the user's own progress.json (or wikipedia.json, or a wiki-00000.txt) is not this
    tool's output: the file names prove nothing, its marker does. Refused, with --overwrite too, the file
    untouched (it was replaced without --overwrite)."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / name).write_text('{"my": "notes"}')
    for overwrite in (False, True):
        with pytest.raises(WikipediaError, match="holds files this tool did not write"):
            prepare(TINY, folder, progress=False, overwrite=overwrite)
    assert [p.name for p in folder.iterdir()] == [name] and (folder / name).read_text() == '{"my": "notes"}'
    made = prepare(TINY, tmp_path / "fresh", progress=False)
    assert made["written_by"] == "bert_ipu prepare_wikipedia"
    again = prepare(TINY, tmp_path / "fresh", progress=False)  # its own output: recognised, complete
    assert again["shards"] == made["shards"]


def test_cli_exit_code_and_help(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "data" / "prepare_wikipedia.py"), "--dump",
                          str(tmp_path / "nope.xml"), "--output", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and run.stderr.count("\n") == 1
    help_text = subprocess.run([sys.executable, str(ROOT / "data" / "prepare_wikipedia.py"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    for word in ("--dump", "--hf-dataset", "--workers", "--docs-per-shard", "--overwrite", "progress.json",
                 "wiki-00000.txt", "create_pretraining_data", "Interrupted"):
        assert word in help_text


def test_cli_writes_and_summarises(tiny_out, tmp_path, capsys):
    assert cli.main(["--dump", str(TINY), "--output", str(tmp_path / "out"), "--docs-per-shard", "2"]) == 0
    captured = capsys.readouterr()
    assert "6 articles" in captured.out and "2 redirects" in captured.out and "3 disambiguation" in captured.out
    assert "100.0%" in captured.err  # progress off a terminal: a line, not a bar
    assert shard_files(tmp_path / "out") == shard_files(tiny_out[0])


def test_hf_dataset_goes_through_the_same_path(tmp_path):
    import datasets

    text = ("Zürich\n\nZürich is the largest city in Switzerland. Dr. Smith arrived at 3.14 p.m. and left.\n\n"
            "History\n\nThe Romans founded Turicum. It grew, e.g. in the U.S. sense of the word.\n")
    ds = datasets.Dataset.from_dict({
        "id": ["1", "2", "3", "4"],
        "url": [f"https://en.wikipedia.org/wiki?curid={i}" for i in range(1, 5)],
        "title": ["Zürich", "Mercury (disambiguation)", "Empty", "東京"],
        "text": [text, "Mercury may refer to:\nMercury (planet)\n", "", "東京 is the capital of Japan. It is large.\n"],
    })
    folder = tmp_path / "wikipedia_hf"
    ds.save_to_disk(str(folder))
    out = tmp_path / "out"
    manifest = prepare(folder, out, docs_per_shard=2, progress=False)
    assert documents(out) == [
        ["Zürich is the largest city in Switzerland.", "Dr. Smith arrived at 3.14 p.m. and left.",
         "The Romans founded Turicum.", "It grew, e.g. in the U.S. sense of the word."],
        ["東京 is the capital of Japan.", "It is large."]]
    assert manifest["source"]["type"] == "hf-dataset"
    assert {k: manifest["counts"][k] for k in ("pages", "articles_kept", "disambiguation", "empty_after_cleaning")} == {
        "pages": 4, "articles_kept": 2, "disambiguation": 1, "empty_after_cleaning": 1}
    assert text_to_paragraphs(text)[0].startswith("Zürich is")  # the heading line "Zürich" is dropped
    assert cli.main(["--hf-dataset", str(TINY), "--output", str(tmp_path / "x"), "--quiet"]) == 2
    assert cli.main(["--dump", str(folder), "--output", str(tmp_path / "x"), "--quiet"]) == 2


def test_create_pretraining_data_reads_the_output(tiny_out, tmp_path):
    from bert_ipu.data.instances import InstanceConfig
    from bert_ipu.data.pipeline import create_pretraining_data

    out, manifest = tiny_out
    inst = create_pretraining_data([str(out)], tmp_path / "inst", InstanceConfig(max_seq_length=128),
                                   validation_fraction=0.0, progress=False)
    assert inst["text"]["documents"] == manifest["counts"]["articles_kept"]
    assert inst["text"]["sentences"] == manifest["counts"]["sentences"]
    assert inst["counts"]["instances"]["train"] > 0


def test_a_dump_changed_in_place_is_not_taken_for_the_old_one(tmp_path):
    """A rerun after the dump changed (same path, same size) kept the old text: the output's identity was the
    path and size. It is now the content: the rerun refuses in one line, and --overwrite makes the new text."""
    from bert_ipu.data.wikipedia.reader import WikipediaError

    dump = tmp_path / "dump.xml"
    original = TINY.read_bytes()
    dump.write_bytes(original)
    out = tmp_path / "out"
    prepare(dump, out, workers=1, docs_per_shard=2, progress=False)
    changed = original.replace(b"largest city", b"biggest town")
    assert len(changed) == len(original)
    dump.write_bytes(changed)
    with pytest.raises(WikipediaError, match="content changed since"):
        prepare(dump, out, workers=1, docs_per_shard=2, progress=False)
    prepare(dump, out, workers=1, docs_per_shard=2, progress=False, overwrite=True)
    text = "".join(p.read_text() for p in sorted(out.glob("wiki-*.txt")))
    assert "biggest town" in text and "largest city" not in text


def test_an_output_that_is_a_link_is_written_where_it_points(tmp_path, capsys):
    """--output LINK, a symbolic link to a folder that does not exist yet: the text is written there, the link kept
    and the lock taken beside the real folder, and removed after (it was 'File exists', exit code 2, and a
    LINK.lock left)."""
    (tmp_path / "link").symlink_to("text")
    assert cli.main(["--dump", str(TINY), "--output", str(tmp_path / "link"), "--quiet"]) == 0
    assert "error" not in capsys.readouterr().err
    assert (tmp_path / "link").is_symlink() and (tmp_path / "text" / MANIFEST).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "text"]
    assert cli.main(["--dump", str(TINY), "--output", str(tmp_path / "link"), "--quiet", "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "text"]


def test_a_piece_of_work_larger_than_memory_is_refused(tmp_path, capsys):
    """--batch-mb past what a worker can hold (1e9 MB made the whole dump one piece, read into memory) is one line
    naming the limit, before anything is written."""
    assert cli.main(["--dump", str(TINY), "--output", str(tmp_path / "out"), "--batch-mb", "1e9", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch-mb" in err and "at most 1024" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_instances_tool_reads_a_conversion_as_its_manifest_lists_it(tmp_path, capsys):
    """create_pretraining_data.py read a prepare_wikipedia folder as any folder: an interrupted conversion (no
    wikipedia.json), or one with shards deleted or cut, made a corpus of whatever was there, without a word. Now
    the shards wikipedia.json lists, each of its recorded size, and nothing else; else one line, exit 2."""
    import create_pretraining_data as create_cli

    out = tmp_path / "wiki"
    prepare(TINY, out, docs_per_shard=2, progress=False)
    listed = [out / r["file"] for r in json.loads((out / MANIFEST).read_text())["shards"]]
    (out / "notes.txt").write_text("my notes, not an article")
    assert wiki_writer.listed_shards(out) == listed and len(listed) > 2
    assert create_cli.main(["--input", str(out), "--output", str(tmp_path / "instances"), "--max-seq-length", "64",
                            "--validation-fraction", "0"]) == 0
    made_from = json.loads((tmp_path / "instances" / "manifest.json").read_text())["made_from"]
    assert "notes" not in json.dumps(made_from)  # (the listed shards only)
    shutil.rmtree(tmp_path / "instances")
    capsys.readouterr()
    damage = {"shard cut": lambda: listed[1].write_bytes(listed[1].read_bytes()[:-5]),
              "shard deleted": lambda: listed[2].unlink(),
              "no wikipedia.json": lambda: (out / MANIFEST).unlink()}
    for name, damaged in damage.items():
        damaged()
        assert create_cli.main(["--input", str(out), "--output", str(tmp_path / "instances")]) == 2, name
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "prepare_wikipedia.py again" in err[0], (name, err)
        assert not (tmp_path / "instances").exists()
