"""Text to token ids, in the API processes (and for an engine's own start-up checks).

`Tokenizer` reads an export's tokenizer.json with Hugging Face tokenizers and tokenises a whole
request in one batch call, straight into a TokenBatch (one buffer per field). `WordTokenizer` is
the fake backend's counterpart: words are tokens, so tests know every id.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from service.ipc.messages import InputTooLong, InvalidInput, TokenBatch
from service.manifest import Manifest


class TextTokenizer(Protocol):
    max_seq_length: int
    vocab_size: int | None

    def encode(self, texts: list[str], truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        """Each text truncated to max_seq_length, cutting the end (right) or the start (left); and the
        token count of each before truncation, special tokens included."""

    def encode_pairs(self, pairs: list[tuple[str, str]],
                     truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        """(query, text) pairs as one sequence each, for a cross-encoder; too long: the longer side is cut."""

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize answer: per text, each token's id, text, special flag and character span."""


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
        self.vocab_size = self._right.get_vocab_size()

    def encode(self, texts: list[str], truncation_direction: str = "right") -> tuple[TokenBatch, np.ndarray]:
        tokenizer = self._left if truncation_direction == "left" else self._right
        encodings = tokenizer.encode_batch_fast(texts)  # skips character offsets, which only /tokenize reads
        rows = [e.ids for e in encodings]  # each .ids builds a list: once
        original = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        for i, e in enumerate(encodings):
            if e.overflowing:  # every overflow piece repeats the special tokens: count the text's own
                original[i] += sum(len(o.ids) - sum(o.special_tokens_mask) for o in e.overflowing)
        return self._batch(encodings, rows), original

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

    def token_details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        out = []
        for text, enc in zip(texts, self._right.encode_batch(texts, add_special_tokens=add_special_tokens)):
            out.append([{"id": i, "text": text[a:b] if not special else tok, "special": bool(special),
                         "start": None if special else a, "stop": None if special else b}
                        for i, tok, special, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)])
        return out


class WordTokenizer:
    """The fake backend's tokenizer: each word is one token, [CLS] and [SEP] around; the word FAIL
    becomes the id the fake backend fails on."""

    CLS, SEP, FAIL = 101, 102, 999

    def __init__(self, max_seq_length: int = 32, vocab_size: int = 31000):
        self.max_seq_length = max_seq_length
        self.vocab_size = vocab_size

    @classmethod
    def token_id(cls, word: str) -> int:
        return cls.FAIL if word == "FAIL" else 1000 + zlib.crc32(word.encode()) % 30000

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


def check_texts(texts: list[str], field: str = "inputs") -> None:
    """Refuse text no tokenizer can take (a lone UTF-16 surrogate) with the index of the culprit."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInput(f"{field}[{i}] is not valid Unicode: {e.reason} at character {e.start}") from None


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
