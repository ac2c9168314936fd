"""TEI's gRPC API in each API process (docs/grpc.md), over the same registry and route functions as HTTP.

`tei.proto` is text-embeddings-inference's own (proto/tei.proto of huggingface/text-embeddings-inference,
Apache-2.0: TEI-LICENSE beside it), unchanged; `tei_pb2*.py` are generated from it by grpcio-tools
(tests/test_grpc.py's `generate`, which a test runs to keep them equal). `server.py` serves it.
"""
