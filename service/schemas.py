"""Request and response bodies: TEI's, the index's, OpenAI's. Limits set by settings are checked in the routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


T = TypeVar("T")
NonEmpty = Annotated[list[T], Field(min_length=1)]
# Booleans are StrictBool: `0` is not false, as TEI's serde has it.


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


class _TeiRequest(BaseModel):
    # TEI ignores fields it does not know; huggingface_hub's InferenceClient sends `parameters`.
    model_config = ConfigDict(extra="ignore")

    parameters: dict[str, Any] | None = Field(None, description="huggingface_hub's InferenceClient puts "
                                              "options here; they count as top-level fields")

    @model_validator(mode="before")
    @classmethod
    def _lift_parameters(cls, data):
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            data = {**{k: v for k, v in data["parameters"].items() if v is not None}, **data}
        return data


TruncationDirection = Literal["Right", "Left", "right", "left"]


class EmbedRequest(_TeiRequest):
    """TEI's /embed body."""

    inputs: str | NonEmpty[str] = Field(description="one text or a list of texts",
                                    examples=[["A man is playing a guitar."]])
    normalize: StrictBool = Field(True, description="L2-normalise the embeddings")
    truncate: StrictBool | None = Field(None, description="cut inputs over the model's max_seq_length tokens; "
                                  "false: such inputs get 422; unset: the server's auto_truncate")
    truncation_direction: TruncationDirection = Field("Right", description="which end a cut removes")
    dimensions: int | None = Field(None, ge=1, description="keep the first n dimensions (Matryoshka), "
                                   "renormalised when normalize is true")
    prompt_name: None = Field(None, description="not supported: exports carry no prompts")


    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class SimilarityInputs(BaseModel):
    source_sentence: str = Field(examples=["A man is playing a guitar."])
    sentences: list[str] = Field(min_length=1, examples=[["A person plays the guitar.", "Stocks fell sharply."]])


class SimilarityRequest(_TeiRequest):
    """TEI's /similarity body (the Hugging Face sentence-similarity task)."""

    inputs: SimilarityInputs
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection = "Right"


class RerankRequest(_TeiRequest):
    """TEI's /rerank body; a bi-encoder export scores each text by cosine similarity to the query."""

    query: str = Field(examples=["What is Deep Learning?"])
    texts: list[str] = Field(min_length=1, examples=[["Deep Learning is a kind of machine learning.", "Cheese."]])
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection = "Right"
    raw_scores: StrictBool = Field(False, description="accepted for TEI clients; cosine scores are the raw scores")
    return_text: StrictBool = False


class RerankHit(BaseModel):
    index: int
    score: float
    text: str | None = None


class TokenizeRequest(_TeiRequest):
    inputs: str | NonEmpty[str]
    add_special_tokens: StrictBool = True
    prompt_name: None = None

    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


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
    query: str | NonEmpty[str] = Field(examples=["Who plays the guitar?"])
    k: int = Field(10, ge=1, description="hits per query")


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

    input: str | NonEmpty[str] | NonEmpty[int] | NonEmpty[NonEmpty[int]] = Field(
        examples=["A man is playing a guitar."])
    model: str | None = Field(None, description="one of GET /v1/models; unset: the default model")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first n dimensions, then renormalise")
    user: str | None = None



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
