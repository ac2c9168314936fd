"""Long texts as chunks: token windows with overlap, cut at sentence (or Markdown block) ends where one is
near, counted with the model's own tokenizer (semantic-text-splitter's splitters over it).

A text that fits the window is one chunk spanning all of it (0, len(text)): short texts are embedded as
they always were. Spans are character offsets into the text as given; a chunk's text is text[start:end]
(the splitter trims the whitespace between chunks).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

#: how a text is cut: `text` at paragraph, sentence, then word ends; `markdown` at headings, blocks and list items
#: first (semantic-text-splitter's TextSplitter and MarkdownSplitter)
MODES = ("text", "markdown")
#: the smallest chunk a request may ask for, in tokens: below it a chunk holds too little to stand for a passage
MIN_SIZE = 8
#: the splitters a tokenizer keeps, by (mode, size, overlap): requests choose among few sizes
_CACHED = 32


class ChunkingRefused(ValueError):
    """A chunking option out of range; the message names the allowed values."""


@dataclass(frozen=True)
class ChunkOptions:
    size: int  # tokens per chunk at most, special tokens and any prompt left out
    overlap: int  # tokens consecutive chunks share, at most
    mode: str = "text"


class Splitter(Protocol):
    def chunk_indices(self, text: str) -> list[tuple[int, str]]: ...


def window(max_seq_length: int, special_tokens: int, prompt_tokens: int = 0) -> int:
    """The tokens a chunk may hold: the model's max_seq_length less its special tokens and the prompt's."""
    return max(max_seq_length - special_tokens - prompt_tokens, 1)


def resolve(limit: int, size: int | None = None, overlap: int | None = None, mode: str = "text", *,
            default_size: int = 0, default_overlap: int = 32) -> ChunkOptions:
    """A request's options (None: the settings' defaults) checked against the model's window `limit`.

    default_size 0 is the whole window; the default overlap is at most a quarter of the size."""
    if mode not in MODES:
        raise ChunkingRefused(f"chunking mode {mode!r} is not known: use one of {', '.join(MODES)}")
    low = min(MIN_SIZE, limit)
    if size is None:
        size = min(default_size or limit, limit)
    elif not low <= size <= limit:
        raise ChunkingRefused(f"chunking size={size} is out of range: {low} to {limit} tokens (the model's window "
                              f"less its special tokens)")
    if overlap is None:
        overlap = min(default_overlap, size // 4)
    elif not 0 <= overlap <= size // 2:
        raise ChunkingRefused(f"chunking overlap={overlap} is out of range: 0 to {size // 2} tokens (half the "
                              f"chunk size {size})")
    return ChunkOptions(size, overlap, mode)


class SplitterCache:
    """A tokenizer's splitters, made on first use (each holds a copy of the tokenizer's state)."""

    def __init__(self, make):
        self._make = make  # (splitter class, size, overlap) -> Splitter
        self._splitters: dict[ChunkOptions, Splitter] = {}
        self._lock = threading.Lock()

    def get(self, options: ChunkOptions) -> Splitter:
        with self._lock:
            splitter = self._splitters.get(options)
            if splitter is None:
                from semantic_text_splitter import MarkdownSplitter, TextSplitter

                kind: Any = MarkdownSplitter if options.mode == "markdown" else TextSplitter
                if len(self._splitters) >= _CACHED:
                    self._splitters.pop(next(iter(self._splitters)))
                splitter = self._splitters[options] = self._make(kind, options.size, options.overlap)
            return splitter


def spans(splitter: Splitter, text: str) -> list[tuple[int, int]]:
    """The chunks' (start, end) character spans, in order; one span (0, len(text)) for a text that fits."""
    found = [(start, start + len(chunk)) for start, chunk in splitter.chunk_indices(text)]
    if len(found) <= 1:
        return [(0, len(text))]
    return found
