"""Operations: liveness, readiness, health, metrics and what is being served."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.errors import ApiError
from service.api.registry import ModelRegistry, ServedModel
from service.api.routes.common import model, settings
from service.api.routes.index import default_documents
from service.settings import Settings

router = APIRouter(tags=["ops"])


def _registry(request: Request):
    registry = getattr(request.app.state, "registry", None)
    if registry is None or not registry.ready:
        raise ApiError(503, "model not loaded", "Unhealthy", headers={"Retry-After": "1"})
    return registry


@router.get("/healthz")
async def healthz():
    """The process answers (liveness)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request):
    """Every model is loaded and its engine running, and the server is not shutting down (readiness)."""
    if getattr(request.app.state, "draining", False):
        raise ApiError(503, "shutting down", "Unhealthy", headers={"Retry-After": "1"})
    _registry(request)
    return {"status": "ready"}


@router.get("/health")
async def health(request: Request):
    """TEI's health: a real forward pass on every model."""
    registry = _registry(request)
    for name in registry.names():
        try:
            await registry.get(name).client.health()
        except Exception as e:
            raise ApiError(503, f"model {name} failed its health check: {e}", "Unhealthy") from e
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(request: Request):
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _model_type(info) -> dict:
    """TEI's: a reranker is a one-label sequence classifier, a classifier names its labels, an embedder says its
    pooling."""
    if info.is_cross_encoder:
        return {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    if info.is_classifier:
        id2label = info.manifest.get("id2label") or {}
        return {"classifier": {"id2label": id2label, "label2id": {label: int(i) for i, label in id2label.items()}}}
    return {"embedding": {"pooling": info.manifest.get("pooling", "mean")}}


def _summary(manifest: dict) -> dict:
    """The manifest without its recorded vectors and calibration ranges (the engine reads those from the export):
    /info is what clients and dashboards poll, and they would make it tens of KB. The calibration is summed up as
    its source, its size and the dimensions it covers."""
    out = {k: v for k, v in manifest.items() if k != "golden"}
    if isinstance(out.get("calibration"), dict):
        calibration = out["calibration"]
        out["calibration"] = {"source": calibration.get("source"), "sentences": calibration.get("sentences"),
                              "dimensions": sorted(int(d) for d in calibration.get("ranges", {}))}
    if isinstance(out.get("variants"), dict):
        out["variants"] = {name: {k: v for k, v in entry.items() if k != "quality"} | (
            {"quality": {k: v for k, v in entry["quality"].items() if k != "golden_embeddings"}}
            if isinstance(entry.get("quality"), dict) else {}) for name, entry in out["variants"].items()}
    return out


def tei_info(registry: ModelRegistry, served: ServedModel, s: Settings) -> dict:
    """TEI's /info fields for a served model (TEI's gRPC Info answers them too)."""
    return {
        "model_id": served.info.manifest.get("base_model", served.info.model),
        "served_model_name": registry.name_of(served),  # what `model` fields name it by
        "model_sha": served.info.manifest.get("onnx_sha256"),
        "model_dtype": {"fp32": "float32", "int8": "int8", "fp16": "float16"}[served.info.variant.split("-")[0]],
        "model_type": _model_type(served.info),
        "max_concurrent_requests": s.max_queued_inputs,
        "max_input_length": served.info.max_seq_length,
        "max_batch_tokens": served.info.max_batch_tokens,
        "max_batch_requests": s.batch_row_cap(),
        "max_client_batch_size": s.max_client_batch_size,
        "auto_truncate": s.auto_truncate,
        "tokenization_workers": s.api_worker_count(),
        "sha": None,
        "docker_label": None,
    }


@router.get("/info")
async def info(request: Request):
    """TEI's fields for the model the URL names (/models/{name}/info) or the default, then its manifest, the models
    served, the index and the limits."""
    registry = _registry(request)
    s = settings(request)
    served = model(request)
    manifest = served.info.manifest
    return {
        **tei_info(registry, served, s),
        "version": request.app.version,
        "manifest": _summary(served.info.manifest),
        "models": registry.names(),
        "device": served.info.device,
        "variant": served.info.variant,  # which graph of the export: fp32, int8, fp16
        # what prompt_name may name, and what applies where a request names none (sentence-transformers')
        "prompts": manifest.get("prompts") or {},
        "default_prompt_name": manifest.get("default_prompt_name"),
        "index_documents": default_documents(request.app.state.index),
        "limits": {
            "max_client_batch_size": s.max_client_batch_size,
            "max_input_tokens": served.info.max_seq_length,
            "max_request_bytes": s.max_request_bytes,
            "max_batch_tokens": served.info.max_batch_tokens,
            "max_concurrent_requests": s.max_queued_inputs,
            "max_search_k": s.max_search_k,
            "auto_truncate": s.auto_truncate,
        },
    }
