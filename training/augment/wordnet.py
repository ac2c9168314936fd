"""WordNet antonyms, read straight from the WordNet 3.0 database files (ConIsI-o2, §3.2.1).

Why not nltk: nltk's WordNetCorpusReader needs a `lexnames` file that Debian's `wordnet-base`
does not install under /usr/share/wordnet, and nltk's path sentinel refuses directories outside
its own data path. Antonymy is one pointer type ("!") of the documented database format (wndb(5WN)),
so reading it here takes a few lines and no global nltk configuration.

What is read: every lexical antonym pointer "!" in data.{adj,adv,verb,noun}. A pointer's
source/target field "sstt" names the word number in the source and target synsets, so the pair is
word-to-word (good ↔ bad), not synset-to-synset, and always within one part of speech (WordNet
has no cross-POS antonym pointer), so the table is keyed by word *and* part of speech: "close"
as a verb gives "open", as an adjective "distant". Within a part of speech antonyms follow the
sense order of index.<pos> (most frequent sense first). `Antonyms.in_context` picks the part of
speech from the word's use in its sentence (training/augment/pos.py).

The POS guess also reads the index files (which parts of speech each lemma has, and how often
each was tagged in WordNet's semantic concordance) and the morphological exception lists (*.exc).

Only base forms are keys: "hotter" is not looked up as "hot", because its antonym could not be
re-inflected anyway. Multi-word lemmas are stored with spaces ("ill at ease").
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from training.augment.pos import guess_pos

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"
#: Debian/Ubuntu package that installs the database files read here (data.* and index.*).
APT_PACKAGES = ("wordnet-base",)
POS_ORDER = ("adj", "adv", "verb", "noun")
_POS_OF_CODE = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
_MARKER = re.compile(r"\([a-z]+\)$")  # adjective syntactic markers such as good(a), elect(ip)


class WordNetMissing(FileNotFoundError):
    pass


def _word(raw: str) -> str:
    return _MARKER.sub("", raw).replace("_", " ")


def _parse_synset(line: str) -> tuple[int, list[str], list[tuple[str, int, str, int, int]]]:
    """One data.<pos> line → (offset, words, pointers (symbol, offset, pos, src_word, tgt_word))."""
    fields = line.split(" | ", 1)[0].split()
    offset = int(fields[0])
    n_words = int(fields[3], 16)
    words = [_word(fields[4 + 2 * i]) for i in range(n_words)]
    i = 4 + 2 * n_words
    n_ptrs = int(fields[i])
    ptrs = []
    for j in range(n_ptrs):
        sym, off, pos, st = fields[i + 1 + 4 * j : i + 5 + 4 * j]
        ptrs.append((sym, int(off), _POS_OF_CODE[pos], int(st[:2], 16), int(st[2:], 16)))
    return offset, words, ptrs


#: per lemma and part of speech: (tagsense_cnt, synset_cnt) from index.<pos>, the POS guess's prior
Lexicon = dict[str, dict[str, tuple[int, int]]]


def check_wordnet_dir(wordnet_dir: str | Path) -> Path:
    root = Path(wordnet_dir)
    needed = [f"{kind}.{pos}" for pos in POS_ORDER for kind in ("data", "index")]
    missing = [name for name in needed if not (root / name).is_file()]
    if missing:
        raise WordNetMissing(
            f"WordNet 3.0 database not found in {root} (missing {', '.join(missing)}). ConIsI's "
            f"antonym strategy (o2) needs it: install the Debian/Ubuntu package(s) "
            f"{' '.join(APT_PACKAGES)} (`apt-get install -y {' '.join(APT_PACKAGES)}`), "
            f"or pass wordnet_dir= pointing at a directory holding data.* and index.* files."
        )
    return root


@lru_cache(maxsize=4)
def load_antonyms(wordnet_dir: str | Path = DEFAULT_WORDNET_DIR) -> dict[str, dict[str, tuple[str, ...]]]:
    """lower-case word → {part of speech: its antonyms in that part of speech, best first}.

    Cached per directory; about a second to build, then shared by every collate call in the process.
    """
    root = check_wordnet_dir(wordnet_dir)
    # (word, pos, source synset offset) → antonyms in pointer order
    found: dict[tuple[str, str, int], list[str]] = {}
    for pos in POS_ORDER:
        with open(root / f"data.{pos}", encoding="utf-8") as data:
            for line in data:
                if line.startswith("  ") or " ! " not in line:  # licence header / no antonym
                    continue
                offset, words, ptrs = _parse_synset(line)
                for sym, tgt_off, tgt_pos, src, tgt in ptrs:
                    if sym != "!" or src == 0:  # antonymy is lexical: word numbers are set
                        continue
                    antonym = _target_word(root, tgt_pos, tgt_off, tgt)
                    found.setdefault((words[src - 1].lower(), pos, offset), []).append(antonym)
    sense_rank = _sense_ranks(root, {(w, p) for w, p, _ in found})
    ranked: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for (word, pos, offset), ants in found.items():
        rank = sense_rank.get((word, pos), {}).get(offset, 10**6)
        ranked.setdefault((word, pos), []).extend((rank, a) for a in ants)
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for (word, pos), items in ranked.items():
        seen = dict.fromkeys(a for _, a in sorted(items, key=lambda t: t[0]) if a.lower() != word)
        if seen:
            out.setdefault(word, {})[pos] = tuple(seen)
    return out


@lru_cache(maxsize=4)
def load_lexicon(wordnet_dir: str | Path = DEFAULT_WORDNET_DIR) -> Lexicon:
    """Every lemma's parts of speech with (tagsense_cnt, synset_cnt), plus the inflected forms of the
    exception lists (*.exc, e.g. "fell" → verb) under their base form's counts."""
    root = check_wordnet_dir(wordnet_dir)
    out: Lexicon = {}
    for pos in POS_ORDER:
        with open(root / f"index.{pos}", encoding="utf-8") as index:
            for line in index:
                if line.startswith("  "):
                    continue
                fields = line.split()
                n_ptr_types = int(fields[3])
                counts = (int(fields[5 + n_ptr_types]), int(fields[2]))  # tagsense_cnt, synset_cnt
                out.setdefault(fields[0].replace("_", " "), {})[pos] = counts
    for pos in POS_ORDER:
        exc = root / f"{pos}.exc"
        if not exc.is_file():  # optional: only sharpens the guess for irregular forms
            continue
        with open(exc, encoding="utf-8") as f:
            for line in f:
                inflected, *bases = line.split()
                base = out.get(bases[0].replace("_", " "), {}) if bases else {}
                if pos in base:
                    out.setdefault(inflected.replace("_", " "), {}).setdefault(pos, base[pos])
    return out


def _target_word(root: Path, pos: str, offset: int, word_number: int) -> str:
    # synset offsets are byte offsets into data.<pos>; files are ASCII so bytes == characters
    with open(root / f"data.{pos}", "rb") as f:
        f.seek(offset)
        _, words, _ = _parse_synset(f.readline().decode("utf-8"))
    return words[word_number - 1]


def _sense_ranks(root: Path, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
    """(lemma, pos) → {synset offset: sense number} from index.<pos>, for the wanted lemmas only."""
    out: dict[tuple[str, str], dict[int, int]] = {}
    for pos in POS_ORDER:
        with open(root / f"index.{pos}", encoding="utf-8") as index:
            for line in index:
                if line.startswith("  "):
                    continue
                lemma = line.split(" ", 1)[0].replace("_", " ")
                if (lemma, pos) not in wanted:
                    continue
                fields = line.split()
                n_senses, n_ptr_types = int(fields[2]), int(fields[3])
                offsets = fields[4 + n_ptr_types + 2 :][:n_senses]
                out[(lemma, pos)] = {int(o): r for r, o in enumerate(offsets)}
    return out


class Antonyms:
    """Lazy handle on the antonym table and the lexicon (picklable for DataLoader workers: holds only
    the path)."""

    def __init__(self, wordnet_dir: str | Path = DEFAULT_WORDNET_DIR):
        self.wordnet_dir = str(wordnet_dir)

    def check(self) -> None:
        check_wordnet_dir(self.wordnet_dir)

    @property
    def table(self) -> dict[str, dict[str, tuple[str, ...]]]:
        return load_antonyms(self.wordnet_dir)

    @property
    def lexicon(self) -> Lexicon:
        return load_lexicon(self.wordnet_dir)

    def __call__(self, word: str, pos: str | None = None) -> tuple[str, ...]:
        """The antonyms of `word` as `pos`; with pos None, those of every part of speech in POS_ORDER."""
        by_pos = self.table.get(word.lower(), {})
        if pos is not None:
            return by_pos.get(pos, ())
        return tuple(dict.fromkeys(a for p in POS_ORDER for a in by_pos.get(p, ())))

    def in_context(self, words: list[str]) -> list[tuple[str, ...]]:
        """For each word of a sentence, its antonyms in the part of speech it has there (or none)."""
        tags = guess_pos(words, self.lexicon)
        return [self(w, t) if t else () for w, t in zip(words, tags)]
