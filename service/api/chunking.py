"""A request's `chunking`: its options checked against the model's window, and its texts cut into chunks with
the model's own tokenizer (service/chunking.py), in the API process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from service import chunking
from service.api.errors import ApiError
from service.api.registry import ServedModel
from service.settings import Settings
from service.tokenization import check_texts

Spans = list[tuple[int, int]]


def wanted(requested: Any, settings: Settings, default: bool) -> Any:
    """The options a request's `chunking` asks for (None: no chunking). Unset: `default`'s choice with the
    settings' size and overlap; true: those; false: none; an object: its fields over those."""
    if requested is None:
        requested = default
    if requested is False:
        return None
    return requested if requested is not True else _Defaults()


class _Defaults:
    size = None
    overlap = None
    mode = "text"


def _refused(message: str) -> ApiError:
    return ApiError(422, message, "Validation", param="chunking")


def options(served: ServedModel, requested: Any, settings: Settings, prompt_name: str | None = None,
                  instruction: str | None = None) -> chunking.ChunkOptions:
    """`requested` (from `wanted`) resolved for the model: the window is its max_seq_length less the special
    tokens and the prompt's tokens (the prompt goes before each chunk)."""
    prompt = served.prompt(prompt_name, instruction)
    prompt_tokens = 0
    if prompt.text:
        _, counted = served.tokenizer.encode([prompt.text])
        prompt_tokens = int(counted[0]) - served.tokenizer.special_tokens
    limit = chunking.window(served.tokenizer.max_seq_length, served.tokenizer.special_tokens, prompt_tokens)
    try:
        return chunking.resolve(limit, requested.size, requested.overlap, requested.mode,
                                default_size=settings.chunk_size, default_overlap=settings.chunk_overlap)
    except chunking.ChunkingRefused as e:
        raise _refused(str(e)) from None


async def split(served: ServedModel, texts: list[str], chosen: chunking.ChunkOptions, field: str = "inputs",
                indices: list[int] | None = None) -> list[Spans]:
    """Each text's chunk spans (one spanning it all where it fits); long requests are cut in a thread. The
    splitter takes only valid Unicode: a lone surrogate is the request's 422, naming `field[i]` (`indices[i]`
    where the texts are some of the request's)."""
    check_texts(texts, field, indices)
    splitter = served.tokenizer.splitters.get(chosen)

    def cut() -> list[Spans]:
        return [chunking.spans(splitter, text) for text in texts]

    if sum(map(len, texts)) <= served.tokenizer.inline_chars:
        return cut()
    return await run_in_threadpool(cut)


async def cut(served: ServedModel, texts: list[str], requested: Any, settings: Settings, field: str,
              prompt_name: str | None = None, instruction: str | None = None) -> tuple[list[Spans], list[str]]:
    """An embedding request's texts cut as its `chunking` asks: each text's spans, and the chunks' texts in order
    (the request refused whole where they exceed max_request_chunks)."""
    chosen = options(served, wanted(requested, settings, False), settings, prompt_name, instruction)
    spans = await split(served, texts, chosen, field)
    check_total(spans, settings.max_request_chunks, field)
    return spans, [text[a:b] for text, found in zip(texts, spans) for a, b in found]


def check_total(spans: Sequence[Spans | None], limit: int, field: str) -> int:
    """The chunks of the whole request (a text not cut counts one) against max_request_chunks: over it, the
    request is refused before anything is embedded or written, naming the input where it went over."""
    total = 0
    for i, found in enumerate(spans):
        total += 1 if found is None else len(found)
        if total > limit:
            raise _refused(f"{field}[{i}] brings this request to {total} chunks; the limit (max_request_chunks) is "
                           f"{limit}: send fewer or shorter texts in one request, or larger chunks")
    return total
