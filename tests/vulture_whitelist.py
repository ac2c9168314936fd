"""Names vulture reports as unused in core, training, evaluation and benchmarks, each reviewed: they are
used, but by code vulture does not read (torch, onnx, onnxruntime, mteb, the service, dataclasses.asdict,
a registry of strings, the tests). tests/test_dead_code.py passes this file to vulture; a new report means
new dead code or a new entry here with its reason.
"""

# ruff: noqa: B018, F821
_ = object()

# torch calls nn.Module.forward through __call__
_.forward

# attributes of objects that other libraries read
_.dim_value  # onnx's TensorShapeProto.Dimension (export/exporter.py sets the output width)
_.graph_optimization_level  # onnxruntime.SessionOptions (export/quantize.py)
_.enable_profiling  # onnxruntime.SessionOptions (benchmarks/int8_profile.py)
_.profile_file_prefix
_.log_severity_level
_.snapshot_every_ops  # service.index.LocalIndex's settings, reset by benchmarks/index.py
_.snapshot_every_s
note  # core.beir.Protocol: written to protocol.json by dataclasses.asdict, for the reader of the folder

# the objective classes, looked up by name in training/objectives/__init__.py's registry
ConIsI
CoSENT
CoSENTCrossEncoder
SimCSE

# evaluation/adapters.py: the interfaces BEIR and mteb call (encode_queries / encode_corpus; mteb 2's
# EncoderProtocol with its keyword arguments, similarity functions and model card)
BeirServiceModel
_.encode_queries
_.encode_corpus
MtebServiceEncoder
_.model_card_data
_.similarity
_.similarity_pairwise
hf_split
task_metadata
hf_subset
prompt_type

# read by the tests: what a reader of a run or a data set can check
SENTEVAL_SUBSETS  # evaluation/sts_data.py: the subsets SentEval scores, which the readers must find
_.cache_size  # CLSR: how many frozen embeddings prepare() cached
_.mlm_head_source  # InfoCSE: where the MLM head and the auxiliary layers came from
_.aux_source
