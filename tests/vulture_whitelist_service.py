"""Names in service/ that vulture reports as unused, each used by code it does not read (FastAPI, pydantic,
Starlette, FAISS, onnxruntime, the tests). tests/test_dead_code.py passes this file to vulture; a new
report means new dead code, or a new entry here with its reason.
"""

# ruff: noqa: B018, F821
_ = object()

# route functions: FastAPI calls them through the decorators that register them
add_documents, clear_index, collection_stats, delete_default_document, delete_documents, embeddings
get_document, get_documents, healthz, predict, readyz, reembed_collection, reload, search_default, tokenize
embed_v1, embed_v2, rerank_v1, rerank_v2  # Cohere's (service/api/routes/cohere.py)

# pydantic reads model_config and calls the validators; fields clients send or read, or exports record
model_config
_._lift_parameters, _._one_query_kind, _._some_weight, _._unique_ids, _._pairs, _._one_prompt, _._sequences
_._lexical_is_local  # a pydantic model validator of Settings
added, deleted, embedding, total_tokens, usage, user, parameters
base_model, created_at, opset, outputs, pad_token, parity_max_abs_diff, pooling, training

# Starlette reads a Response subclass's media_type and calls its render()
media_type
_.render

# the supervisor's control thread calls _stage / _switch / _discard by the op a reload sends
_._stage, _._switch, _._discard

# a task kept referenced so the event loop does not drop it; FAISS and onnxruntime options set by attribute
_._events
_.efConstruction, _.sel, _.intra_op_num_threads
_.rangestat, _.rangestat_arg, _.is_trained  # FAISS ScalarQuantizer training options, an SQ index's trained flag

# a module __getattr__ (LocalIndex imported lazily); methods only the tests and benchmarks call
__getattr__
_.add_in_process, _.memory, _.snapshot

# manifest fields the routes read from ModelInfo.manifest, the engine's manifest as a dict
_.score_activation
