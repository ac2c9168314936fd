"""The bridge from a model directory to the service: an ONNX graph verified against torch, its int8 and fp16
variants, and the manifest the service reads. It imports core (the torch model) and service (the manifest), never
a trainer; `python -m export` is its command line."""
