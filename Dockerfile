# syntax=docker/dockerfile:1
# Targets (docker build --target ...):
#   runtime   the CPU service (default): onnxruntime + FAISS (CPU), no torch, the default model exported at build
#   gpu       the GPU service on a CUDA 13 runtime base: onnxruntime-gpu (the only onnxruntime) + faiss-gpu-cuvs
#   trainer   torch (CUDA 13 build from PyPI) + make + WordNet: runs `make train-export` into /models
# Bases are pinned by exact tag, one Python tag for every Python stage (append @sha256:<digest> to pin harder);
# Python packages by constraints.txt. Every target runs as uid 10001 and writes only under /data (the index),
# /models (the trainer's exports) and $TMPDIR (the supervisor's sockets and metrics files: a tmpfs where the root
# filesystem is read-only).
# ---- export the default model to ONNX (torch lives in this stage only) ---------------------------------------
FROM python:3.11.14-slim-trixie AS export
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
COPY core ./core
COPY export ./export
COPY training ./training
COPY evaluation ./evaluation
# The CPU build of torch keeps this stage small; it never reaches a runtime image.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt ".[train]"
ARG MODEL=default
# No fp16 variant: fp16 is written only after its quality check on a GPU (the trainer target, on GPU nodes).
RUN python -m export --model "${MODEL}" --out /models/default --no-fp16

# ---- the CPU service's packages, in a venv the runtime copies ------------------------------------------------
FROM python:3.11.14-slim-trixie AS build-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
# EXTRAS="[milvus]": the Milvus client too (the stateless API of compose's `scale` profile and k8s's scale overlay).
ARG EXTRAS=""
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install -c constraints.txt ".${EXTRAS}"

# ---- the GPU service's packages: `make venv-gpu`'s install, in a venv ------------------------------------------
FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04 AS gpu-base
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The base image's tag pins the distribution; Ubuntu drops superseded package versions from its archive, so a
# version pinned here would break the next build after a security update (hadolint DL3008, waived for this line).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home sembed

FROM gpu-base AS build-gpu
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
ARG GPU_CUDA_LIBS="cuda-toolkit[cublas,cudart,cufft,curand,cusolver,cusparse,nvjitlink,nvrtc]==13.2.2"
# onnxruntime and onnxruntime-gpu (like faiss-cpu and faiss-gpu-cuvs) write one package folder: the CPU builds
# go first, then the gpu extra; the last line fails the build unless exactly one onnxruntime is installed.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install -c constraints.txt . \
    && /opt/venv/bin/pip uninstall -y onnxruntime faiss-cpu \
    && /opt/venv/bin/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['gpu'], '${GPU_CUDA_LIBS}', sep='\n')" > /tmp/gpu-requirements.txt \
    && /opt/venv/bin/pip install -c constraints.txt -r /tmp/gpu-requirements.txt \
    && /opt/venv/bin/python -c "import importlib.metadata as m; ort = sorted(d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].startswith('onnxruntime')); assert ort == ['onnxruntime-gpu'], ort"

# ---- the GPU service --------------
FROM gpu-base AS gpu
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TMPDIR=/tmp \
    SEMBED_MODEL_DIR=/models/default SEMBED_MODELS_ROOT=/models/trained SEMBED_PORT=8080 SEMBED_DATA_DIR=/data \
    SEMBED_GRPC_PORT=50051 SEMBED_DEVICE=cuda
WORKDIR /app
RUN mkdir -p /data /models/trained && chown 10001:10001 /data /models/trained
COPY --from=build-gpu /opt/venv /opt/venv
COPY --from=export --chown=10001:10001 /models /models
USER 10001
EXPOSE 8080 50051
VOLUME ["/data"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('SEMBED_PORT', '8080'), timeout=2)"]
CMD ["python", "-m", "service"]

# ---- the trainer: `make train-export` (torch 2.13.0 from PyPI is its CUDA 13 build; it runs on a CPU too) --------
FROM gpu-base AS trainer
# make runs the Makefile; wordnet-base is ConIsI's antonym table (the Makefile's `wordnet` target checks it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make wordnet-base \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml constraints.txt README.md Makefile ./
COPY service ./service
COPY core ./core
COPY export ./export
COPY training ./training
COPY evaluation ./evaluation
COPY deploy/train-and-reload.sh ./deploy/
# VENV=/opt/venv with its .installed stamp: make uses this environment instead of building .venv.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install -c constraints.txt ".[train,eval]" \
    && touch /opt/venv/.installed \
    && mkdir -p /models/trained /data && chown 10001:10001 /models/trained /data
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 VENV=/opt/venv DATA=/datasets \
    HOME=/data HF_HOME=/data/hf
USER 10001
# No server here: nothing to probe (the job's exit status is its health).
HEALTHCHECK NONE
# Exports go to /models/trained/<method>-<timestamp>/ (a volume the service reads), runs to /data/runs.
CMD ["make", "train-export", "METHOD=cosent", "ARGS=--set models_dir=/models/trained runs_dir=/data/runs"]

# ---- the CPU service (the last stage: `docker build .` builds it) -------------------------------------------------------------------------
FROM python:3.11.14-slim-trixie AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TMPDIR=/tmp \
    SEMBED_MODEL_DIR=/models/default SEMBED_MODELS_ROOT=/models/trained SEMBED_PORT=8080 SEMBED_DATA_DIR=/data \
    SEMBED_GRPC_PORT=50051
WORKDIR /app
RUN useradd --system --uid 10001 --user-group --no-create-home sembed \
    && mkdir -p /data /models/trained && chown 10001:10001 /data /models/trained
COPY --from=build-cpu /opt/venv /opt/venv
# Serve your own export: mount it over the default (docker run -v "$PWD/models/mine:/models/default:ro" ...);
# exports the reload route may load go under /models/trained (SEMBED_MODELS_ROOT).
COPY --from=export --chown=10001:10001 /models /models
USER 10001
EXPOSE 8080 50051
VOLUME ["/data"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('SEMBED_PORT', '8080'), timeout=2)"]
CMD ["python", "-m", "service"]
