"""Request and response bodies: TEI's, the index's, OpenAI's. Limits set by settings are checked in the routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from service.api.output_types import EmbeddingType


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
    model: str | None = Field(None, description="which of the served models (GET /info: `models`) answers, as "
                              "OpenAI's `model` picks one; unset: the default model (an extension: TEI serves one)")

    @model_validator(mode="before")
    @classmethod
    def _lift_parameters(cls, data):
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            data = {**{k: v for k, v in data["parameters"].items() if v is not None}, **data}
        return data


TruncationDirection = Literal["Right", "Left", "right", "left"]

_PROMPT_NAME = ("one of the model's prompts by name (GET /info: `prompts`), put before each text as "
                "sentence-transformers' encode(prompt_name=) puts it: its tokens count toward the model's length "
                "limit and the usage. Unset: the model's `default_prompt_name`, if it has one")
_INSTRUCTION = ("text of your own put before each text, as sentence-transformers' encode(prompt=); instead of "
                "prompt_name, not with it. \"\" embeds the texts as they are, without the default prompt")
_EMBEDDING_TYPE = ("ours: the output type, as sentence-transformers' quantize_embeddings gives it: float, int8 / "
                   "uint8 (per-dimension ranges calibrated at export), binary / ubinary (sign bits packed eight to a "
                   "byte, as int8 / uint8); see docs/output-types.md")
_NO_PROMPT_FOR_IDS = ("; inputs given as token ids take no prompt: naming one with them is refused (422), and the "
                      "default prompt is not applied to them")


class ChunkingOptions(_Request):
    """How long texts are cut (docs/long-documents.md): token windows with overlap, at sentence ends where one
    is near, counted with the model's tokenizer."""

    size: int | None = Field(None, ge=1, description="tokens per chunk at most: 8 up to the model's window "
                             "(max_seq_length less its special tokens and the prompt's); unset: SEMBED_CHUNK_SIZE")
    overlap: int | None = Field(None, ge=0, description="tokens consecutive chunks share at most: 0 up to half the "
                                "size; unset: SEMBED_CHUNK_OVERLAP (at most a quarter of the size)")
    mode: Literal["text", "markdown"] = Field("text", description="text: cut at paragraph, sentence, then word "
                                              "ends; markdown: at headings, blocks and list items first")


_CHUNKING = ("true, or {size, overlap, mode}: a text over the model's window becomes chunks, each its own vector "
             "with its character span (start, end); false or unset: one vector per text, truncated as `truncate` says")


class _Prompted(BaseModel):
    """prompt_name or instruction: what goes before each text."""

    prompt_name: str | None = Field(None, description=_PROMPT_NAME, examples=["query"])
    instruction: str | None = Field(None, description=_INSTRUCTION)

    @model_validator(mode="after")
    def _one_prompt(self):
        if self.prompt_name is not None and self.instruction is not None:
            raise ValueError("give prompt_name or instruction, not both")
        return self


class EmbedRequest(_TeiRequest, _Prompted):
    """TEI's /embed body."""

    inputs: str | NonEmpty[str] = Field(description="one text or a list of texts",
                                    examples=[["A man is playing a guitar."]])
    normalize: StrictBool = Field(True, description="L2-normalise the embeddings")
    truncate: StrictBool | None = Field(None, description="cut inputs over the model's max_seq_length tokens; "
                                  "false: such inputs get 422; unset: the server's auto_truncate")
    truncation_direction: TruncationDirection = Field("Right", description="which end a cut removes")
    dimensions: int | None = Field(None, ge=1, description="keep the first n dimensions (Matryoshka), "
                                   "renormalised when normalize is true")
    embedding_type: EmbeddingType = Field("float", description=_EMBEDDING_TYPE)
    chunking: StrictBool | ChunkingOptions | None = Field(None, description="ours: " + _CHUNKING + ". With it the "
                                                          "answer is, per input, a list of {start, end, embedding}")

    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class ChunkEmbedding(BaseModel):
    """/embed with chunking: one chunk of an input, its span in it and its vector."""

    start: int
    end: int
    embedding: list[float]


class SimilarityInputs(BaseModel):
    source_sentence: str = Field(examples=["A man is playing a guitar."])
    sentences: list[str] = Field(min_length=1, examples=[["A person plays the guitar.", "Stocks fell sharply."]])


class SimilarityRequest(_TeiRequest, _Prompted):
    """TEI's /similarity body (the Hugging Face sentence-similarity task); a prompt goes before every sentence."""

    inputs: SimilarityInputs
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection = "Right"


class RerankRequest(_TeiRequest):
    """TEI's /rerank body; a cross-encoder export scores each (query, text) pair, a bi-encoder export
    each text by cosine similarity to the query (both embedded after its default prompt, if it has one)."""

    query: str = Field(examples=["What is Deep Learning?"])
    texts: list[str] = Field(min_length=1, examples=[["Deep Learning is a kind of machine learning.", "Cheese."]])
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection = "Right"
    raw_scores: StrictBool = Field(False, description="a cross-encoder's logits instead of their sigmoid; "
                                   "cosine scores (bi-encoder) are the raw scores")
    return_text: StrictBool = False


class PredictRequest(_TeiRequest):
    """TEI's /predict body: one text, one pair [text, text], or a batch of both [[text], [text, text], ...]."""

    inputs: str | NonEmpty[str] | NonEmpty[NonEmpty[str]] = Field(
        description="a text, a pair of texts, or a batch of texts ([text]) and pairs ([text, text])",
        examples=["I like you.", ["A man plays.", "Someone makes music."], [["I like you."], ["Hi", "Hello"]]])
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection = "Right"
    raw_scores: StrictBool = Field(False, description="the logits instead of their softmax over the labels (a "
                                   "sigmoid each for a multi-label model)")

    @field_validator("inputs")
    @classmethod
    def _sequences(cls, inputs):
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], list):
            bad = next((i for i, x in enumerate(inputs) if len(x) not in (1, 2)), None)
            if bad is not None:
                raise ValueError(f"inputs[{bad}] holds {len(inputs[bad])} texts: a batch item is [text] or "
                                 "[text, text]")
        elif isinstance(inputs, list) and len(inputs) > 2:
            raise ValueError(f"{len(inputs)} texts: one input is a text or a pair [text, text]; a batch is "
                             "[[text], [text, text], ...]")
        return inputs

    @property
    def batched(self) -> bool:
        return isinstance(self.inputs, list) and isinstance(self.inputs[0], list)

    @property
    def sequences(self) -> list[str | tuple[str, str]]:
        """Each input as a text or a (text, text) pair."""
        items = cast(list[str | list[str]], self.inputs if self.batched else [self.inputs])
        out: list[str | tuple[str, str]] = []
        for x in items:
            out.append(x if isinstance(x, str) else x[0] if len(x) == 1 else (x[0], x[1]))
        return out


class Prediction(BaseModel):
    score: float
    label: str


class RerankHit(BaseModel):
    index: int
    score: float
    text: str | None = None


class TokenizeRequest(_TeiRequest, _Prompted):
    """TEI's /tokenize body: the tokens /embed would embed, prompt included."""

    inputs: str | NonEmpty[str]
    add_special_tokens: StrictBool = True

    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class DecodeRequest(_TeiRequest):
    """TEI's /decode body: the model's token ids back to text."""

    ids: NonEmpty[int] | NonEmpty[NonEmpty[int]] = Field(description="one sequence of token ids, or a batch",
                                                          examples=[[101, 1037, 2158, 3248, 102]])
    skip_special_tokens: StrictBool = Field(True, description="leave out [CLS], [SEP] and the like")

    @property
    def sequences(self) -> list[list[int]]:
        return cast(list[list[int]], self.ids if isinstance(self.ids[0], list) else [self.ids])


class _TokenStatesRequest(_TeiRequest):
    inputs: str | NonEmpty[str] = Field(description="one text or a list of texts",
                                        examples=[["A man is playing a guitar."]])
    truncate: StrictBool | None = Field(None, description="cut inputs over the model's max_seq_length tokens; "
                                        "false: such inputs get 422; unset: the server's auto_truncate")
    truncation_direction: TruncationDirection = Field("Right", description="which end a cut removes")
    prompt_name: str | None = Field(None, description=_PROMPT_NAME, examples=["query"])

    @property
    def texts(self) -> list[str]:
        return _as_list(self.inputs)


class EmbedSparseRequest(_TokenStatesRequest):
    """TEI's /embed_sparse body: a sparse (SPLADE) model's vector of each text."""


class EmbedAllRequest(_TokenStatesRequest):
    """TEI's /embed_all body: every token's embedding of each text (the transformer's last hidden state)."""


class SparseValue(BaseModel):
    index: int
    value: float


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


# --- the search index -----------------------------------------------------------------------------------
IncludeField = Literal["text", "metadata", "vector"]


class DocumentIn(_Request):
    id: str = Field(min_length=1, max_length=256, description="letters, digits and _-.:@, not starting with '.'")
    text: str | None = Field(None, description="embedded by the service unless `vector` is given; stored")
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON object: depth <= 8, <= 256 keys, "
                                     "<= 16 KB, finite numbers; searchable with `filter`")
    vector: list[float] | None = Field(None, description="your own vector (the collection's dimension; "
                                       "normalised here) instead of embedding `text`")


class AddDocumentsRequest(_Request):
    documents: NonEmpty[DocumentIn]
    chunking: StrictBool | ChunkingOptions | None = Field(None, description="a text over the model's window "
                                                          "becomes chunks, each a vector with its span; search "
                                                          "answers the document at its best chunk. Unset: "
                                                          "SEMBED_CHUNKING (on; off with the milvus backend); "
                                                          "false: one vector, the text truncated")

    @field_validator("documents")
    @classmethod
    def _unique_ids(cls, docs):
        seen: set[str] = set()
        dupes: set[str] = set()
        for d in docs:
            (dupes if d.id in seen else seen).add(d.id)
        if dupes:
            raise ValueError(f"duplicate document ids in one request: {sorted(dupes)[:10]}")
        return docs


class AddDocumentsResponse(BaseModel):
    added: int
    total: int = Field(description="documents in the collection after the write")
    sequence: int = Field(description="the write-ahead log's sequence number of this write: durable when "
                          "the reply is sent")


class DeleteRequest(_Request):
    ids: NonEmpty[str] | None = None
    filter: dict[str, Any] | None = Field(None, description="delete every document matching this filter")


class DeleteDocumentsResponse(BaseModel):
    deleted: int
    total: int
    sequence: int


class GetDocumentsRequest(_Request):
    ids: NonEmpty[str]
    include: list[IncludeField] = Field(["text", "metadata"], description="fields to return")


class DocumentOut(BaseModel):
    id: str
    text: str | None = None
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None


class GetDocumentsResponse(BaseModel):
    documents: list[DocumentOut] = Field(description="the documents found, in the order asked")
    missing: list[str] = Field(description="ids not in the collection")


class Fusion(_Request):
    """How mode hybrid fuses its dense ranking with the lexical and sparse ones the collection keeps: reciprocal
    rank fusion."""

    k: int = Field(60, ge=1, le=10_000, description="RRF's constant: an item scores weight / (k + rank) in each "
                   "ranking (ranks from 1), summed")
    dense_weight: float = Field(1.0, ge=0, le=100, description="weight of the dense (vector) ranking")
    lexical_weight: float = Field(1.0, ge=0, le=100, description="weight of the lexical (BM25) ranking")
    sparse_weight: float = Field(1.0, ge=0, le=100, description="weight of the sparse (SPLADE) ranking")
    candidates: int = Field(100, ge=1, le=10_000, description="items taken from each ranking (at least the "
                            "search's k)")

    @model_validator(mode="after")
    def _some_weight(self):
        if self.dense_weight == 0 and self.lexical_weight == 0 and self.sparse_weight == 0:
            raise ValueError("dense_weight, lexical_weight and sparse_weight cannot all be 0")
        return self


class SearchRequest(_Request):
    query: str | NonEmpty[str] | None = Field(None, examples=["Who plays the guitar?"],
                                               description="text(s) to embed and search with")
    vector: NonEmpty[float] | NonEmpty[NonEmpty[float]] | None = Field(None, description="or your own query "
                                                                        "vector(s)")
    k: int = Field(10, ge=1, description="hits per query")
    filter: dict[str, Any] | None = Field(None, description="metadata filter, applied before ranking: "
                                          "$eq $ne $in $nin $gt $gte $lt $lte $and $or (docs/search-index.md)")
    score_threshold: float | None = Field(None, description="only hits scoring at least this")
    ef_search: int | None = Field(None, ge=1, description="HNSW: candidates explored (>= k; default 128)")
    nprobe: int | None = Field(None, ge=1, description="IVF: lists visited (default 16)")
    oversample: int | None = Field(None, ge=1, le=100, description="quantized collections: k × this candidates "
                                   "from the compact structure are rescored with the float vectors (default: "
                                   "SEMBED_INDEX_OVERSAMPLE)")
    include: list[IncludeField] = Field(["text", "metadata"], description="fields returned with each hit")
    chunks: StrictBool = Field(False, description="each hit also lists its document's other chunks among the "
                               "candidates that match: [{start, end, score}], best first")
    mode: Literal["dense", "lexical", "sparse", "hybrid"] = Field(
        "dense", description="dense: by embedding (cosine); lexical: BM25 over the stored texts; sparse: dot product "
        "of the query's sparse (SPLADE) vector with the stored ones; hybrid: dense and each of lexical and sparse the "
        "collection keeps, fused by reciprocal rank (`fusion`). lexical needs a collection created with lexical: "
        "true, sparse one created with a sparse_model, hybrid either; all three need query text")
    fusion: Fusion | None = Field(None, description="mode hybrid: the fusion's k, weights and candidates")

    @model_validator(mode="after")
    def _one_query_kind(self):
        if (self.query is None) == (self.vector is None):
            raise ValueError("give either query (text) or vector")
        if self.mode != "dense" and self.query is None:
            raise ValueError(f"mode {self.mode!r} searches by the query's text: give query (text), not vector")
        if self.fusion is not None and self.mode != "hybrid":
            raise ValueError(f"fusion applies to mode 'hybrid', not {self.mode!r}")
        return self

    @property
    def queries(self) -> list[str]:
        if self.query is None:
            raise ValueError("this search is by vector: it has no text queries")
        return _as_list(self.query)


class ChunkHit(BaseModel):
    start: int
    end: int
    score: float


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="cosine similarity (mode dense), BM25 (lexical), the sparse vectors' dot "
                         "product (sparse) or the fused reciprocal "
                         "rank score (hybrid)")
    text: str | None = None
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None
    start: int | None = Field(None, description="the best chunk's span in the document's text: its first "
                              "character ...")
    end: int | None = Field(None, description="... and the one after its last (the whole text: 0, len(text))")
    chunks: list[ChunkHit] | None = Field(None, description="with `chunks: true`: the document's matching chunks")


class SearchResponse(BaseModel):
    results: list[list[SearchHit]] = Field(description="one ranked list per query, best first")


class CreateCollectionRequest(_Request):
    name: str = Field(examples=["papers"], description="a letter, then up to 63 letters, digits or _")
    index_type: str = Field("Flat", description="Flat (exact), HNSW<M> (e.g. HNSW32), IVF<n>,SQ8 or IVF<n>,PQ<m>")
    model: str | None = Field(None, description="the served model that embeds its texts (unset: the default)")
    vectors_only: StrictBool = Field(False, description="true: documents bring their own vectors, no model")
    dimension: int | None = Field(None, ge=1, le=65536, description="vectors_only: the vectors' dimension")
    quantization: Literal["none", "int8", "binary"] = Field("none", description="what the searched structure "
                                                            "stores: float vectors (none), int8 codes or sign bits "
                                                            "(binary); the float vectors rescore its best candidates")
    lexical: StrictBool = Field(False, description="true: keep a lexical (BM25) index of the texts beside the "
                                "vectors, for search modes lexical and hybrid (local index only)")
    sparse_model: str | None = Field(None, description="a served sparse (SPLADE) model: keep its vector of each "
                                     "chunk beside the dense one, for search modes sparse and hybrid (local index "
                                     "only)")


class ModelStampOut(BaseModel):
    name: str
    sha256: str


class CollectionOut(BaseModel):
    name: str
    dimension: int
    index_type: str
    model: ModelStampOut | None = Field(description="the model that made its vectors; null: vectors only")
    count: int
    sequence: int = Field(description="the last durable write to this collection")
    ann_ready: bool = Field(description="false while the ANN structure trains or rebuilds (search is exact)")
    quantization: str = Field("none", description="none, int8 or binary")
    lexical: bool = Field(False, description="whether it keeps a lexical (BM25) index: search modes lexical, hybrid")
    sparse_model: ModelStampOut | None = Field(None, description="the sparse (SPLADE) model whose vector of each "
                                               "chunk it keeps (search modes sparse, hybrid); null: none")
    sparse_dimension: int = Field(0, description="that model's vocabulary: its vectors' dimension (0: none)")


class CollectionsOut(BaseModel):
    collections: list[CollectionOut]


# --- OpenAI embeddings API (/v1/) --------------------------------------------------------------------
class OpenAIEmbeddingRequest(_Prompted):
    """OpenAI's body; prompt_name and instruction are ours (the openai client sends them with extra_body)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # clients send `user` and more

    input: str | NonEmpty[str] | NonEmpty[int] | NonEmpty[NonEmpty[int]] = Field(
        examples=["A man is playing a guitar."])
    model: str | None = Field(None, description="one of GET /v1/models; unset: the default model")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first n dimensions, then renormalise")
    embedding_type: EmbeddingType = Field("float", description=_EMBEDDING_TYPE + "; with encoding_format base64, "
                                          "each row's bytes (float32 little-endian, or one byte per value)")
    user: str | None = None
    prompt_name: str | None = Field(None, description=_PROMPT_NAME + _NO_PROMPT_FOR_IDS, examples=["query"])
    instruction: str | None = Field(None, description=_INSTRUCTION + _NO_PROMPT_FOR_IDS)
    chunking: StrictBool | ChunkingOptions | None = Field(None, description="ours (extra_body): " + _CHUNKING +
                                                          ". With it `data` has a row per chunk: `index` its "
                                                          "input's, with `start` and `end`; text inputs only")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    start: int | None = Field(None, description="with chunking: the chunk's span in its input")
    end: int | None = None


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


# --- Cohere's embed and rerank (/v1/, /v2/) ----------------------------------------------------------
class CohereEmbedRequest(BaseModel):
    """Cohere's embed body (v2; v1's is the same less output_dimension), as the cohere SDK sends it: text only."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # the SDK's `priority` and the like

    texts: NonEmpty[str] | None = Field(None, examples=[["A man is playing a guitar."]])
    images: list[Any] | None = Field(None, description="not served: this service embeds text")
    inputs: list[Any] | None = Field(None, description="not served: send `texts`")
    model: str | None = Field(None, description="one of the served models (GET /v1/models); unset: the default")
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = Field(
        None, description="puts the model's prompt for it before each text (docs/output-types.md); unset: the "
        "model's default prompt, if any")
    embedding_types: NonEmpty[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = Field(
        None, description="the output types asked for, each its own key of `embeddings`; unset: float")
    output_dimension: int | None = Field(None, ge=1, description="keep the first n dimensions, renormalised")
    truncate: Literal["NONE", "START", "END"] = Field("END", description="an input over the model's length: "
                                                      "refused (NONE), or cut at its start or end")
    max_tokens: int | None = Field(None, ge=1, description="only the model's own limit (max_seq_length) or more")


class CohereDocument(BaseModel):
    model_config = ConfigDict(extra="allow")  # a document's other fields travel along, unread

    text: str


class CohereRerankRequest(BaseModel):
    """Cohere's rerank body (v1 and v2), which Jina's and many RAG frameworks' rerankers post too."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # max_tokens_per_doc, rank_fields, ...

    model: str | None = Field(None, description="a served reranker (or embedding model); unset: the default")
    query: str = Field(examples=["What is Deep Learning?"])
    documents: NonEmpty[str | CohereDocument] = Field(
        examples=[["Deep Learning is a kind of machine learning.", "Cheese."]])
    top_n: int | None = Field(None, ge=1, description="the best n only; unset: all")
    return_documents: StrictBool = Field(False, description="each result carries its document ({\"text\"})")

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]
