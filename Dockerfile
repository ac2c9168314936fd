# syntax=docker/dockerfile:1
# Two stages: torch exports the model to ONNX; the runtime image has onnxruntime + tokenizers only.

FROM python:3.11-slim AS export
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
COPY core ./core
COPY training ./training
COPY evaluation ./evaluation
# The CPU build of torch keeps this stage small; it never reaches the runtime image.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt ".[train]"
ARG MODEL=default
# No fp16 variant: the runtime image has onnxruntime's CPU build, and fp16 is for GPUs.
RUN python -m training.export --model "${MODEL}" --out /models/default --no-fp16

FROM python:3.11-slim AS runtime
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    SEMBED_MODEL_DIR=/models/default SEMBED_PORT=8080 SEMBED_INDEX_PATH=/data/index
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
RUN pip install -c constraints.txt . \
    && useradd --system --uid 10001 --no-create-home sembed \
    && mkdir -p /data && chown sembed /data
COPY --from=export /models /models
USER 10001
EXPOSE 8080
VOLUME ["/data"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"]
CMD ["python", "-m", "service"]
