"""The documentation: the MkDocs site builds in strict mode (a broken link, a missing page or a page left out
of the nav fails), the API pages cover every module of bert_ipu, and the README's links point at files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    """`make docs` (mkdocs build --strict) passes; a copy of the docs with one broken link does not."""
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "packing" / "index.html").read_text().count("doc-object") > 10
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    for shown in ("bert_ipu", "configs", "README.md"):  # what the pages include (API pages, snippets)
        (copy / shown).symlink_to(ROOT / shown)
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    broken = build(copy, tmp_path / "site2")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr


def test_every_module_has_an_api_page():
    """Each module of bert_ipu (but entry points and private ones) is rendered on one of docs/api/*.md."""
    rendered = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        rendered |= set(re.findall(r"^::: (\S+)", page.read_text(), re.M))
    modules = set()
    for path in (ROOT / "bert_ipu").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] != "__main__":  # entry points: the command line's page says what they run
            modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    skipped = {"bert_ipu"}  # the root package: the README's layout
    assert modules - skipped <= rendered, sorted(modules - skipped - rendered)
    assert rendered <= modules, sorted(rendered - modules)  # no page names a module that is gone


def test_readme_is_a_short_door_whose_links_exist():
    """README.md stays short (what, why, the two commands, headline results, layout, links) and every relative
    link in it names a file of the repository."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make run" in text and "make test" in text
    links = [link for link in re.findall(r"\]\(([^)#]+)", text) if "://" not in link]
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]


def test_the_refusals_page_lists_every_refusal_in_the_code():
    """docs/refused.md is generated from the source's raises (tools/refusals.py): a refusal added, removed or
    reworded without regenerating the page fails here; and the collector does find refusals of each kind the
    commands print (a collector that found nothing would pass the comparison)."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import refusals

    found = refusals.collect()
    kinds = {kind for _, _, kind, _ in found}
    assert {"ConfigError", "RunError", "DataInputError", "DatasetError", "PackingInputError", "GlueInputError"} <= kinds
    assert any("refused for safety" in message for *_, message in found)
    assert (ROOT / "docs" / "refused.md").read_text(encoding="utf-8") == refusals.render(found), \
        "docs/refused.md is not current: run .venv/bin/python tools/refusals.py"
