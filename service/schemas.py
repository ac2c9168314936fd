"""Request and response bodies of the native routes. Limits that depend on settings are checked in the routes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


class EmbedRequest(_Request):
    inputs: str | list[str] = Field(description="one text or a list of texts",
                                     examples=[["A man is playing a guitar."]])
    normalize: bool = Field(True, description="L2-normalise the embeddings")
    truncate: bool | None = Field(None, description="cut inputs over the model's max_seq_length tokens; "
                                  "false: such inputs get 422; unset: the server's auto_truncate")

    @field_validator("inputs")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("inputs must not be an empty list")
        return v

    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class EmbedResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    embeddings: list[list[float]]
    model: str
    dim: int


class SimilarityRequest(_Request):
    source_sentence: str = Field(examples=["A man is playing a guitar."])
    sentences: list[str] = Field(min_length=1, examples=[["A person plays the guitar.", "Stocks fell sharply."]])


class SimilarityResponse(BaseModel):
    scores: list[float] = Field(description="cosine similarity of each sentence to the source, in order")


class DocumentIn(_Request):
    id: str = Field(min_length=1, max_length=512)
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class AddDocumentsRequest(_Request):
    documents: list[DocumentIn] = Field(min_length=1)

    @field_validator("documents")
    @classmethod
    def _unique_ids(cls, docs):
        seen, dupes = set(), set()
        for d in docs:
            (dupes if d.id in seen else seen).add(d.id)
        if dupes:
            raise ValueError(f"duplicate document ids in one request: {sorted(dupes)[:10]}")
        return docs


class AddDocumentsResponse(BaseModel):
    added: int
    total: int


class DeleteDocumentsRequest(_Request):
    ids: list[str] = Field(min_length=1)


class DeleteDocumentsResponse(BaseModel):
    deleted: int
    total: int


class SearchRequest(_Request):
    query: str | list[str] = Field(examples=["Who plays the guitar?"])
    k: int = Field(10, ge=1, description="hits per query")

    @field_validator("query")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("query must not be an empty list")
        return v

    @property
    def queries(self) -> list[str]:
        return _as_list(self.query)


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="cosine similarity")
    text: str
    metadata: dict[str, Any]


class SearchResponse(BaseModel):
    results: list[list[SearchHit]] = Field(description="one ranked list per query, best first")


class ErrorResponse(BaseModel):
    error: str
    detail: Any = None


# --- OpenAI embeddings API (/v1/) --------------------------------------------------------------------
class OpenAIEmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # clients send `user` and more

    input: str | list[str] | list[int] | list[list[int]] = Field(examples=["A man is playing a guitar."])
    model: str | None = Field(None, description="one of GET /v1/models; unset: the default model")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first n dimensions, then renormalise")
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("input must not be an empty list")
        return v


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage
