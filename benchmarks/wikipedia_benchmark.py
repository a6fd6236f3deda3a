"""Wikipedia preparation benchmark: dump -> plain text throughput, and the whole chain extrapolated to 1 GB.

    .venv/bin/python benchmarks/wikipedia_benchmark.py [--mb 24] [--workers 1 2] [--pack-copies 20]

1. A synthetic MediaWiki dump of about --mb MB of XML: the pages of tests/fixtures/wiki/tiny.xml (articles
   with infoboxes, tables, references, files, lists; redirects, disambiguation pages, other namespaces)
   replicated with varied text: every article gets paragraphs of generated sentences (Zipf-distributed
   words of the bert-base-uncased vocab, with links, references, templates, abbreviations and decimals mixed
   in, about as much markup as prose), so that bz2 compresses it about as well as it compresses a real
   pages-articles dump (its ratio is printed). Compressed with bz2.
2. data/prepare_wikipedia.py's `prepare` on it with each --workers: MB of compressed dump per second (and per
   core: the main process, which decompresses, parses and writes, counts as the first core), MB of XML per
   second, articles per second.
3. The chain after it, on the text it wrote: text -> instances (`create_pretraining_data`, 1 worker) at 128
   and at 512, and packing (`pack_pretraining_data`, CGHP, depth 3), timed on those instances and on
   --pack-copies copies of them (packing is a fixed cost plus a cost per instance); then each step's time
   for 1 GB of compressed dump, scaled by the text and instances 1 GB gives at the ratios measured here.
"""

from __future__ import annotations

import argparse
import bz2
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "wiki"))

import make_tiny  # noqa: E402  the fixture's pages and its XML writer

from bert_ipu.arguments import Parser, at_least, positive
from bert_ipu.data.instances import InstanceConfig, default_vocab  # noqa: E402
from bert_ipu.data.pipeline import create_pretraining_data, pack_pretraining_data  # noqa: E402
from bert_ipu.data.shards import DatasetWriter, PackedDataset  # noqa: E402
from bert_ipu.data.wikipedia import Page, is_article, prepare  # noqa: E402

ABBREVIATIONS = ["Dr.", "e.g.", "i.e.", "U.S.", "Mr.", "St.", "approx.", "No."]


def vocabulary() -> list[str]:
    words = [w.strip() for w in default_vocab().read_text(encoding="utf-8").splitlines()]
    return [w for w in words if w.isalpha() and w.isascii() and len(w) > 1]


class Generator:
    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.words = vocabulary()
        n = len(self.words)
        self.weights = [1.0 / (rank + 10) for rank in range(n)]  # Zipf-like, as words are in prose
        self.cum = []
        total = 0.0
        for w in self.weights:
            total += w
            self.cum.append(total)

    def word(self) -> str:
        return self.rng.choices(self.words, cum_weights=self.cum)[0]

    def sentence(self) -> str:
        rng = self.rng
        out = []
        for i in range(rng.randint(8, 28)):
            r = rng.random()
            w = self.word()
            if r < 0.08:
                out.append(f"[[{w.capitalize()} {self.word()}|{w}]]")
            elif r < 0.13:
                out.append(f"[[{w}]]")
            elif r < 0.15:
                out.append(f"{rng.randint(1, 999)}.{rng.randint(0, 99)}")
            elif r < 0.16:
                out.append(rng.choice(ABBREVIATIONS))
            elif r < 0.18:
                out.append(f"''{w}''")
            else:
                out.append(w)
        s = " ".join(out)
        s = s[0].upper() + s[1:] + "."
        r = rng.random()
        if r < 0.3:
            s += (f"<ref>{{{{cite web |url=https://example.org/{self.word()}/{rng.randint(1, 10**6)} |title="
                  f"{self.word().capitalize()} {self.word()} |publisher=[[{self.word().capitalize()}]] |date="
                  f"{rng.randint(1, 28)} May {rng.randint(1950, 2024)} |access-date=1 June 2024}}}}</ref>")
        elif r < 0.35:
            s += f"<ref name=\"{self.word()}{rng.randint(1, 50)}\" />"
        elif r < 0.4:
            s += f"{{{{citation needed|date=March {rng.randint(2005, 2024)}}}}}"
        return s

    def article(self, base: str) -> str:
        rng = self.rng
        parts = [base]
        for section in range(rng.randint(2, 6)):
            parts.append(f"\n== {self.word().capitalize()} {self.word()} ==\n")
            if rng.random() < 0.3:
                parts.append(f"[[File:{self.word().capitalize()}.jpg|thumb|{self.sentence()}]]\n")
            for _ in range(rng.randint(1, 4)):
                parts.append(" ".join(self.sentence() for _ in range(rng.randint(2, 7))) + "\n\n")
            if rng.random() < 0.3:
                parts.append("".join(f"* {self.sentence()}\n" for _ in range(rng.randint(2, 6))))
            if rng.random() < 0.15:
                rows = "".join(f"|-\n| {self.word()} || {rng.randint(1, 10**6)} || {self.word()}\n"
                               for _ in range(rng.randint(3, 10)))
                parts.append(f'{{| class="wikitable"\n! A !! B !! C\n{rows}|}}\n')
        parts.append("\n== References ==\n{{reflist}}\n\n")
        parts.append("".join(f"[[Category:{self.word().capitalize()} {self.word()}]]\n" for _ in range(4)))
        return "".join(parts)


def _burn(n: int) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - start


def effective_cores(n: int = 10_000_000) -> float:
    """How many CPU-bound processes this machine really runs at once (a CPU quota can give fewer than
    os.cpu_count()): the time of one burn over the time of two side by side, times two."""
    import concurrent.futures as cf
    import multiprocessing as mp

    alone = _burn(n)
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(_burn, 1000).result()
        pool.submit(_burn, 1000).result()
        both = max(f.result() for f in [pool.submit(_burn, n), pool.submit(_burn, n)])
    return min(2.0, max(1.0, 2 * alone / both))  # noisy on a throttled machine: between 1 and 2


def synthetic_dump(path: Path, target_mb: float, seed: int = 0) -> tuple[int, int]:
    """Write path (bz2) with about target_mb MB of XML; returns (xml bytes, articles)."""
    gen = Generator(seed)
    pages, size, copy = [], 0, 0
    while size < target_mb * 1e6:
        for title, ns, redirect, text in make_tiny.PAGES:
            title = f"{title} {copy}" if copy else title
            if is_article(Page("", title, ns, redirect, text)) and "stub" not in title:
                text = gen.article(text)
            pages.append((title, ns, redirect, text))
            size += len(text.encode("utf-8")) + 700
        copy += 1
    xml = make_tiny.dump_xml(pages).encode("utf-8")
    path.write_bytes(bz2.compress(xml, 9))
    return len(xml), sum(1 for p in pages if p[1] == 0 and len(p[3]) > 2000)


def replicate(src: Path, dst: Path, copies: int) -> Path:
    """An unpacked dataset holding `copies` copies of src's training instances (to time packing at scale)."""
    data = PackedDataset(src)
    with DatasetWriter(dst, data.layout, overwrite=True) as writer:
        shutil.copyfile(src / "vocab.txt", writer.partial / "vocab.txt")
        arrays = data.read("train")
        for _ in range(copies):
            writer.write_shard("train", arrays)
        writer.finish({k: data.manifest[k] for k in ("kind", "instance_config", "vocab")})
    return dst


def main() -> None:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=positive, default=24.0, help="MB of XML in the synthetic dump")
    p.add_argument("--workers", type=at_least(1), nargs="+", default=[1, 2])
    p.add_argument("--pack-copies", type=at_least(1), default=20, help="copies of the instances for the packing fit")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wikipedia_bench_"))
    try:
        print(f"machine: {os.cpu_count()} cores")
        dump = work / "synthetic.xml.bz2"
        start = time.perf_counter()
        xml_bytes, articles = synthetic_dump(dump, args.mb)
        compressed = dump.stat().st_size
        print(f"\n1. synthetic dump: {xml_bytes / 1e6:.1f} MB of XML, {compressed / 1e6:.2f} MB bz2 (ratio "
              f"{xml_bytes / compressed:.2f}), made in {time.perf_counter() - start:.0f} s")

        cores_available = effective_cores()
        print(f"\n2. dump -> plain text (prepare); this machine runs {cores_available:.2f} CPU-bound processes' worth "
              f"at once (measured with two side by side; {os.cpu_count()} cores listed)")
        rates = {}
        text_dir = None
        for workers in args.workers:
            out = work / f"text_{workers}"
            start = time.perf_counter()
            m = prepare(dump, out, workers=workers, docs_per_shard=2000, progress=False)
            seconds = time.perf_counter() - start
            c = m["counts"]
            rate = compressed / 1e6 / seconds
            cores = min(workers, cores_available)
            rates[workers] = rate
            print(f"  {workers} worker(s): {seconds:6.1f} s, {rate:5.3f} MB/s compressed ({rate / cores:5.3f} "
                  f"per core on {cores:.2f}), {xml_bytes / 1e6 / seconds:5.2f} MB/s of XML, "
                  f"{c['articles_kept'] / seconds:6.1f} articles/s; text {c['bytes'] / 1e6:.1f} MB, "
                  f"{c['articles_kept']:,} articles, {c['sentences']:,} sentences")
            if text_dir is None:
                text_dir = out
            else:
                same = all((out / s["file"]).read_bytes() == (text_dir / s["file"]).read_bytes() for s in m["shards"])
                print(f"  output identical to {args.workers[0]} worker(s): {same}")
        text_bytes = m["counts"]["bytes"]

        print("\n3. the chain on that text, and extrapolated to 1 GB of compressed dump (at this dump's ratios)")
        scale = 1e9 / compressed  # 1 GB of compressed dump holds this many times the text written here
        per_core = rates[min(rates)] / min(min(rates), cores_available)  # 1 worker: one process does it all
        dump_seconds = 1e9 / 1e6 / per_core
        print(f"  dump -> text: {text_bytes / compressed:.2f} MB of text per MB of bz2; 1 GB: "
              f"{dump_seconds / 3600:.2f} core-hours ({per_core:.3f} MB/s per core)")
        totals, inst_seconds_by = {}, {}
        for seq in (128, 512):
            inst = work / f"inst_{seq}"
            start = time.perf_counter()
            mi = create_pretraining_data([str(text_dir)], inst, InstanceConfig(max_seq_length=seq), docs_per_shard=2000,
                                         validation_fraction=0.0, progress=False)
            t_inst = time.perf_counter() - start
            n = mi["counts"]["instances"]["train"]
            # packing is a fixed cost (the LP on the histogram) plus a cost per instance: time it on the
            # instances and on --pack-copies copies of them, and fit both
            points = []
            for copies in (1, args.pack_copies):
                src = inst if copies == 1 else replicate(inst, work / f"inst_{seq}_x{copies}", copies)
                start = time.perf_counter()
                packed = pack_pretraining_data(src, work / f"packed_{seq}_{copies}", "cghp", 3, progress=False)
                points.append((n * copies, time.perf_counter() - start))
                info = packed["packing"]["train"]
                if copies == 1:
                    print(f"  text -> instances at {seq}: {t_inst:5.1f} s, {text_bytes / 1e6 / t_inst:4.2f} MB/s of "
                          f"text, {n:,} instances; packing (CGHP, depth 3): {points[0][1]:4.1f} s, "
                          f"{info['packs']:,} packs, efficiency {info['efficiency']:.1%}")
                shutil.rmtree(work / f"packed_{seq}_{copies}")
                if copies != 1:
                    shutil.rmtree(src)
            shutil.rmtree(inst)
            (n1, t1), (n2, t2) = points
            per_instance = (t2 - t1) / (n2 - n1)
            if per_instance <= 0:  # the fixed part varied more than the rest: bound the cost by the larger run
                per_instance = t2 / n2
            fixed = max(0.0, t1 - per_instance * n1)
            n_gb = n * scale
            pack_seconds = fixed + per_instance * n_gb
            inst_seconds_by[seq] = t_inst * scale
            totals[seq] = dump_seconds + inst_seconds_by[seq] + pack_seconds
            print(f"    1 GB of bz2 dump -> {n_gb / 1e6:.2f} M instances: text -> instances "
                  f"{inst_seconds_by[seq] / 3600:.2f} core-hours; packing {pack_seconds / 60:.1f} min (fixed "
                  f"{fixed:.1f} s + {per_instance * 1e6:.1f} us per instance, timed at {n1:,} and {n2:,})")
        for seq, total in totals.items():
            print(f"  whole chain at {seq}, 1 GB of bz2 dump: {total / 3600:.2f} core-hours (dump -> text "
                  f"{dump_seconds / total:.0%}, packing {1 - (dump_seconds + inst_seconds_by[seq]) / total:.0%})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
