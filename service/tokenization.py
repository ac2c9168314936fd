"""Text to token ids, in the API processes (and for an engine's own start-up checks).

`Tokenizer` reads an export's tokenizer.json with Hugging Face tokenizers and tokenises a whole
request in one batch call, straight into a TokenBatch (one buffer per field). `WordTokenizer` is
the fake backend's counterpart: words are tokens, so tests know every id.
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from service.chunking import SplitterCache
from service.ipc.messages import InputTooLong, InvalidInput, TokenBatch
from service.manifest import Manifest

log = logging.getLogger("sembed.tokenization")


class TextTokenizer(Protocol):
    max_seq_length: int
    vocab_size: int  # ids at or above it are no token of this tokenizer
    #: requests of up to this many characters are tokenised on the API process's event loop (about a
    #: millisecond); longer ones in a thread, so other requests' HTTP work goes on meanwhile
    inline_chars: int
    #: the special tokens ([CLS], [SEP], ...) a single text gets: a chunk's window is max_seq_length less these
    special_tokens: int
    #: the long-text splitters counting with this tokenizer (service/chunking.py)
    splitters: SplitterCache

    def encode(self, texts: list[str], truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        """Each text truncated to max_seq_length, cutting the end (right) or the start (left); and the
        token count of each before truncation, special tokens included."""

    def encode_pairs(self, pairs: list[tuple[str, str]],
                     truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        """(query, text) pairs as one sequence each, for a cross-encoder; too long: the longer side is cut."""

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize answer: per text, each token's id, text, special flag and character span."""

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """TEI's /decode answer: each sequence of ids as text."""


class Tokenizer:
    def __init__(self, export_dir: str | Path):
        from tokenizers import Tokenizer as HfTokenizer

        export_dir = Path(export_dir)
        manifest = Manifest.load(export_dir)
        path = str(export_dir / "tokenizer.json")
        self.max_seq_length = manifest.max_seq_length
        self.needs_type_ids = "token_type_ids" in manifest.inputs
        self._right = HfTokenizer.from_file(path)
        self._right.no_padding()  # the engine pads, to the length the whole pass needs
        self._right.enable_truncation(max_length=self.max_seq_length)
        self._left = HfTokenizer.from_file(path)
        self._left.no_padding()
        self._left.enable_truncation(max_length=self.max_seq_length, direction="left")
        self._full = HfTokenizer.from_file(path)  # counts a cut pair
        self._full.no_padding()
        self._full.no_truncation()
        processor = self._full.post_processor
        self.special_tokens = processor.num_special_tokens_to_add(False) if processor is not None else 0
        full = self._full
        self.splitters = SplitterCache(lambda kind, size, overlap: kind.from_huggingface_tokenizer(
            full, capacity=size, overlap=overlap))
        self.vocab_size = self._right.get_vocab_size()
        self.wordpiece = BertWordPiece.for_tokenizer(path, self._right)
        # about a millisecond of either (python -m benchmarks.tokenization: the fast path costs an eighth)
        self.inline_chars = 4096 if self.wordpiece is None else 16384

    def encode(self, texts: list[str], truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        if self.wordpiece is None:
            rows, original, encodings = self._reference(texts, truncation_direction)
            return self._batch(encodings, rows), original
        others = self.wordpiece.refused(texts)
        if not others:
            rows, original = self.wordpiece.encode(texts, self.max_seq_length, truncation_direction)
        else:  # tokenizers for the texts only it gets right, the fast path for the rest
            refused = set(others)
            taken = [i for i in range(len(texts)) if i not in refused]
            rows, original = [[]] * len(texts), np.zeros(len(texts), dtype=np.int64)
            for part, (part_rows, part_original) in (
                    (taken, self.wordpiece.encode([texts[i] for i in taken], self.max_seq_length,
                                                  truncation_direction)),
                    (others, self._reference([texts[i] for i in others], truncation_direction)[:2])):
                for i, row, n in zip(part, part_rows, part_original):
                    rows[i], original[i] = row, n
        batch = TokenBatch.from_rows(rows)
        if self.needs_type_ids:  # one sequence: every type id is 0
            batch = TokenBatch(batch.ids, batch.offsets, np.zeros(len(batch.ids), dtype=np.int8))
        return batch, original

    def _reference(self, texts: list[str], direction: str) -> tuple[list[list[int]], np.ndarray, list]:
        """tokenizers' rows, each text's token count before truncation, and its encodings."""
        tokenizer = self._left if direction == "left" else self._right
        encodings = tokenizer.encode_batch_fast(texts)  # skips character offsets, which only /tokenize reads
        rows = [e.ids for e in encodings]  # each .ids builds a list: once
        original = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        for i, e in enumerate(encodings):
            if e.overflowing:  # every overflow piece repeats the special tokens: count the text's own
                original[i] += sum(len(o.ids) - sum(o.special_tokens_mask) for o in e.overflowing)
        return rows, original, encodings

    def encode_pairs(self, pairs: list[tuple[str, str]],
                     truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        tokenizer = self._left if truncation_direction == "left" else self._right
        encodings = tokenizer.encode_batch_fast(pairs)
        # a cut pair's overflow pieces combine both sides' remainders: count it again, uncut (rare)
        original = np.array([len(self._full.encode(*pair).ids) if e.overflowing else len(e.ids)
                             for pair, e in zip(pairs, encodings)], dtype=np.int64)
        return self._batch(encodings, [e.ids for e in encodings]), original

    def _batch(self, encodings, rows: list[list[int]]) -> TokenBatch:
        return TokenBatch.from_rows(rows, [e.type_ids for e in encodings] if self.needs_type_ids else None)

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._right.decode_batch(ids, skip_special_tokens=skip_special_tokens)

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        out = []
        for text, enc in zip(texts, self._right.encode_batch(texts, add_special_tokens=add_special_tokens)):
            out.append([{"id": i, "text": text[a:b] if not special else tok, "special": bool(special),
                         "start": None if special else a, "stop": None if special else b}
                        for i, tok, special, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)])
        return out


#: the bytes of the texts the fast path takes: tab, newline, carriage return, printable ASCII but "["
_FAST_BYTES = bytes([9, 10, 13, *range(0x20, 0x5B), *range(0x5C, 0x7F)])


class BertWordPiece:
    """BERT's tokenizer (BertNormalizer, BertPreTokenizer, WordPiece, [CLS] text [SEP]) for plain ASCII
    text, in a few lines of Python, at a fraction of the CPU per sentence of tokenizers' encode_batch_fast,
    which builds Python objects per token (ids, tokens, offsets) and made tokenisation most of an API
    process's CPU under batch-256 load (`python -m benchmarks.tokenization`; RESULTS.md, "The server's own
    CPU"). flash-tokenizer's C++ is as fast but holds far more memory per process (commit 2223924).

    On printable ASCII (tab and newlines allowed) BERT's normaliser only lowercases and turns
    whitespace into spaces, its pre-tokenizer splits runs of letters and digits from single
    punctuation characters, and WordPiece finds most words whole in the vocabulary. Where that is
    not all there is to it, tokenizers does the text: any other character, a "[" (tokenizers matches
    added tokens such as "[SEP]" written inside a text), or a word over WordPiece's length limit. The
    fast path is used only for a tokenizer.json with exactly that pipeline, and only after it gave
    tokenizers' ids on a probe set at load; tests/test_tokenization.py compares the two on 30,000
    STS, SICK and SNLI sentences and on random ASCII.
    """

    PROBE = ("A man is playing a guitar.", "Don't split U.S.A. or e-mail; 3.14159 $100 @user #tag C++!",
             "unaffable  \t tab\nnewline\r\ncarriage", "", " ", "ALL CAPS AND MixedCase words", "x" * 100,
             "~`!@#$%^&*()_+-={}|\\:\";'<>?,./", "supercalifragilisticexpialidocious antidisestablishment")

    def __init__(self, vocab: dict[str, int], lowercase: bool, max_word_chars: int):
        self._get = vocab.get
        self.lowercase = lowercase
        self.cls_id, self.sep_id, self.unk_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[UNK]"]
        self._words = re.compile(r"[a-z0-9]+|[^\sa-z0-9]" if lowercase else r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")
        # what only tokenizers gets right: a character outside printable ASCII (tab and newlines allowed),
        # "[", or a word over WordPiece's limit
        self._refer = re.compile(rf"[^\t\n\r\x20-\x5a\x5c-\x7e]|[A-Za-z0-9]{{{max_word_chars + 1}}}")
        self._max_word_chars = max_word_chars
        self._pieces: dict[str, list[int]] = {}  # words not in the vocabulary, split

    @classmethod
    def for_tokenizer(cls, path: str, reference) -> BertWordPiece | None:
        """The fast path for this tokenizer.json, or None where it is not BERT's pipeline or differs from
        `reference` (tokenizers) on the probe."""
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
        template = spec.get("post_processor") or {}
        single = [step.get("SpecialToken", {}).get("id") or step.get("Sequence", {}).get("id")
                  for step in template.get("single", [])]
        if not (model.get("type") == "WordPiece" and model.get("continuing_subword_prefix") == "##"
                and {"[CLS]", "[SEP]", "[UNK]"} <= model.get("vocab", {}).keys()
                and model.get("unk_token") == "[UNK]"
                and normalizer.get("type") == "BertNormalizer" and normalizer.get("clean_text")
                and normalizer.get("handle_chinese_chars")
                and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
                and template.get("type") == "TemplateProcessing" and single == ["[CLS]", "A", "[SEP]"]
                and all(t["content"].startswith("[") for t in spec.get("added_tokens", []))):
            return None
        fast = cls(model["vocab"], bool(normalizer.get("lowercase")), model.get("max_input_chars_per_word", 100))
        refused = fast.refused(list(cls.PROBE))
        probe = [t for i, t in enumerate(cls.PROBE) if i not in refused]
        if fast.encode(probe, 1 << 30, "right")[0] != [e.ids for e in reference.encode_batch_fast(probe)]:
            log.warning("the ASCII WordPiece differs from tokenizers on %s: tokenising with tokenizers only", path)
            return None
        return fast

    def refused(self, texts: list[str]) -> list[int]:
        """The texts only tokenizers gets right, by index: one scan over the whole batch."""
        joined = "\n".join(texts)  # no match spans a newline
        # the common case in C: printable ASCII without "[" (deleting those bytes leaves nothing), no long text
        if (joined.isascii() and not joined.encode("ascii").translate(None, _FAST_BYTES)
                and max(map(len, texts), default=0) <= self._max_word_chars):
            return []
        hits = [m.start() for m in self._refer.finditer(joined)]
        if not hits:
            return []
        starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
        return sorted(set((np.searchsorted(starts, hits, side="right") - 1).tolist()))

    def encode(self, texts: list[str], limit: int, direction: str) -> tuple[list[list[int]], np.ndarray]:
        """Each text's ids cut to `limit` as tokenizers cuts them, and its token count before the cut."""
        get, split, cls_id, sep_id = self._get, self._split, self.cls_id, self.sep_id
        # one lower() and one findall for the whole batch: texts end at "\0", which none of them holds
        # (refused) and which the word pattern yields as a token of its own
        if not texts:
            return [], np.zeros(0, dtype=np.int64)
        joined = "\0".join(texts) + "\0"
        rows, row = [], [cls_id]
        for word in self._words.findall(joined.lower() if self.lowercase else joined):
            found = get(word)
            if found is not None:
                row.append(found)
            elif word == "\0":
                row.append(sep_id)
                rows.append(row)
                row = [cls_id]
            else:
                row += split(word)
        lengths = list(map(len, rows))
        original = np.array(lengths, dtype=np.int64)
        if max(lengths) > limit:  # the text's own tokens cut, then [CLS] and [SEP] again
            keep = limit - 2
            for cut in np.flatnonzero(original > limit):
                own = rows[cut][1:-1]
                rows[cut] = [self.cls_id, *(own[-keep:] if direction == "left" and keep else own[:keep]),
                             self.sep_id]
        return rows, original

    def _split(self, word: str) -> list[int]:
        """WordPiece's greedy longest match first, "##" inside a word; no match: the whole word is [UNK]."""
        ids = self._pieces.get(word)
        if ids is not None:
            return ids
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                i = self._get(word[start:end] if start == 0 else "##" + word[start:end])
                if i is not None:
                    ids.append(i)
                    start = end
                    break
            else:
                ids = [self.unk_id]
                break
        if len(self._pieces) > 100_000:  # bounded: a stream of made-up words must not grow it forever
            self._pieces.clear()
        self._pieces[word] = ids
        return ids


class WordTokenizer:
    """The fake backend's tokenizer: each word is one token, [CLS] and [SEP] around; the word FAIL
    becomes the id the fake backend fails on."""

    CLS, SEP, FAIL = 101, 102, 999
    inline_chars = 4096
    special_tokens = 2

    def __init__(self, max_seq_length: int = 32, vocab_size: int = 31000):
        self.max_seq_length = max_seq_length
        self.vocab_size = vocab_size
        self.splitters = SplitterCache(lambda kind, size, overlap: kind.from_callback(
            lambda text: len(text.split()), capacity=size, overlap=overlap))
        self._words: dict[int, str] = {}  # the words seen, by id: what decode gives back

    def token_id(self, word: str) -> int:
        i = self.FAIL if word == "FAIL" else 1000 + zlib.crc32(word.encode()) % 30000
        self._words.setdefault(i, word)
        return i

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        special = {self.CLS: "[CLS]", self.SEP: "[SEP]"}
        return [" ".join(special[i] if i in special else self._words.get(i, "[UNK]") for i in row
                         if not (skip_special_tokens and i in special)) for row in ids]

    def encode(self, texts: list[str], truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        rows, original, keep = [], [], self.max_seq_length - 2
        for text in texts:
            words = [self.token_id(w) for w in text.split()]
            original.append(len(words) + 2)
            if len(words) > keep:
                words = words[-keep:] if truncation_direction == "left" else words[:keep]
            rows.append([self.CLS, *words, self.SEP])
        return TokenBatch.from_rows(rows), np.array(original, dtype=np.int64)

    def encode_pairs(self, pairs: list[tuple[str, str]],
                     truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        rows, types, original, keep = [], [], [], self.max_seq_length - 3
        for query, text in pairs:
            a, b = [self.token_id(w) for w in query.split()], [self.token_id(w) for w in text.split()]
            original.append(len(a) + len(b) + 3)
            while len(a) + len(b) > keep:  # the longer side loses a word first
                longer = a if len(a) >= len(b) else b
                del longer[0 if truncation_direction == "left" else -1]
            rows.append([self.CLS, *a, self.SEP, *b, self.SEP])
            types.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
        return TokenBatch.from_rows(rows, types), np.array(original, dtype=np.int64)

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        out: list[list[dict]] = []
        for text in texts:
            tokens: list[dict] = []
            start = 0
            for word in text.split():
                start = text.index(word, start)
                tokens.append({"id": self.token_id(word), "text": word, "special": False, "start": start,
                               "stop": start + len(word)})
                start += len(word)
            special = [{"id": i, "text": t, "special": True, "start": None, "stop": None}
                       for i, t in ((self.CLS, "[CLS]"), (self.SEP, "[SEP]"))]
            out.append([special[0], *tokens, special[1]] if add_special_tokens else tokens)
        return out


def check_texts(texts: list[str], field: str = "inputs", indices: list[int] | None = None) -> None:
    """Refuse text no tokenizer can take (a lone UTF-16 surrogate) with the index of the culprit (its index in
    the request: `indices[i]` where the texts are some of the request's)."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            at = indices[i] if indices is not None else i
            raise InvalidInput(f"{field}[{at}] is not valid Unicode: {e.reason} at character {e.start}") from None


def check_truncation(original: np.ndarray, limit: int, what: str = "inputs[{}]") -> None:
    """With truncate=false, an input over the model's length is refused, naming it."""
    over = np.flatnonzero(original > limit)
    if len(over):
        i = int(over[0])
        raise InputTooLong(f"{what.format(i)} has {int(original[i])} tokens; the model takes at most {limit}: "
                           f"shorten it, or send truncate=true to cut it to {limit}")


def from_ids(inputs: list[list[int]], limit: int, vocab_size: int | None, truncate: bool) -> TokenBatch:
    """Inputs a client sent as the model's own token ids, taken as they are (cut to `limit` if allowed)."""
    rows = []
    for i, ids in enumerate(inputs):
        if not ids:
            raise InvalidInput(f"inputs[{i}] is an empty list of token ids")
        if vocab_size is not None and not all(0 <= t < vocab_size for t in ids):
            raise InvalidInput(f"inputs[{i}] holds token ids outside the model's vocabulary of {vocab_size}")
        if len(ids) > limit and not truncate:
            raise InputTooLong(f"inputs[{i}] has {len(ids)} tokens; the model takes at most {limit}")
        rows.append(ids[:limit])
    return TokenBatch.from_rows(rows)
