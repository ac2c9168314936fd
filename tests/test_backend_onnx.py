"""The onnxruntime backend on the real default export: bit-exact batching, device choice, memory options."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.backends import padded_length
from service.engine.backends.onnx import OnnxBackend
from service.hardware import cpu_flags, cpu_quota, cpuinfo_field, physical_cores, usable_cpus


@pytest.fixture(scope="module")
def backend(default_export):
    return OnnxBackend(default_export)


def test_a_text_gets_the_same_bits_alone_and_in_any_batch(backend):
    rng = np.random.default_rng(1)
    words = "the cat sat on a mat while dogs bark loudly at night near old houses in quiet towns".split()
    texts = [" ".join(rng.choice(words, int(n))) for n in rng.integers(1, 90, 40)]
    items = backend._tokenize(texts)
    m = backend.pad_to_multiple_of
    alone = [backend.run(items.slice(i, i + 1), padded_length(int(items.lengths[i]), m))[0][0]
             for i in range(len(items))]
    for _ in range(12):
        idx = rng.choice(len(items), int(rng.integers(2, 12)), replace=False)
        batch = items.take(idx)
        seq_len = padded_length(int(batch.lengths.max()), m) + m * int(rng.integers(0, 3))
        got = backend.run(batch, seq_len)[0]
        for row, i in enumerate(idx):
            assert np.array_equal(got[row], alone[i]), (texts[i], seq_len)


def test_spinning_threads_give_the_same_bits(backend, default_export):
    """SEMBED_INTRA_OP_SPINNING changes how onnxruntime's threads wait, never what they compute."""
    spinning = OnnxBackend(default_export, pad_to_multiple_of=backend.pad_to_multiple_of, spin=True)
    texts = ["A man is playing a guitar.", "Heavy rain is expected in the north tomorrow, say forecasters."]
    assert np.array_equal(spinning.encode(texts), backend.encode(texts))


def test_the_thread_count_is_explicit_so_no_worker_is_pinned(backend):
    """Left at 0, onnxruntime pins its workers to cores; an explicit count (its own default) pins none."""
    assert backend.session.get_session_options().intra_op_num_threads == physical_cores() >= 1


def test_physical_cores_counts_hyperthreads_once(tmp_path, monkeypatch):
    for cpu, core in enumerate([0, 1, 0, 1, 2]):  # cpus 0/2 and 1/3 are siblings; cpu 4 is not ours
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "core_id").write_text(f"{core}\n")
        (tmp_path / f"cpu{cpu}" / "topology" / "physical_package_id").write_text("0\n")
    none = {"cgroup": tmp_path / "no-cgroup", "self_cgroup": tmp_path / "no-self-cgroup"}  # no quota to read
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert physical_cores(tmp_path, **none) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 2, 4}, raising=False)
    assert physical_cores(tmp_path, **none) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {7}, raising=False)  # no topology: one core
    assert physical_cores(tmp_path, **none) == 1


def test_a_cgroup_cpu_quota_bounds_the_cores_counted(tmp_path, monkeypatch):
    """Kubernetes' limits.cpu on a bigger node: onnxruntime threads and API processes for the quota, not the node."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    sysfs, cgroup, own = tmp_path / "sys", tmp_path / "cg", tmp_path / "self"

    def files(tree: dict[str, str], self_cgroup: str) -> None:
        import shutil

        shutil.rmtree(cgroup, ignore_errors=True)
        for name, text in tree.items():
            (cgroup / name).parent.mkdir(parents=True, exist_ok=True)
            (cgroup / name).write_text(text)
        own.write_text(self_cgroup)

    # cgroup v2 on the host: the pod's limit sits above the container's own (unlimited) cgroup
    files({"kubepods/pod1/cpu.max": "400000 100000\n", "kubepods/pod1/c1/cpu.max": "max 100000\n"},
          "0::/kubepods/pod1/c1\n")
    assert cpu_quota(cgroup, own) == 4.0
    assert physical_cores(sysfs, cgroup, own) == 4 and usable_cpus(cgroup, own) == 4
    # v2 in a container (its own cgroup at the mount's root), a fractional quota: rounded down, at least 1
    files({"cpu.max": "150000 100000\n"}, "0::/\n")
    assert cpu_quota(cgroup, own) == 1.5 and physical_cores(sysfs, cgroup, own) == 1
    files({"cpu.max": "50000 100000\n"}, "0::/\n")
    assert physical_cores(sysfs, cgroup, own) == 1
    # v1 (docker on an older host): the cpu controller's mount
    files({"cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
          "4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n")
    assert cpu_quota(cgroup, own) == 2.0 and usable_cpus(cgroup, own) == 2
    # no quota: the affinity's count
    files({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n")
    assert cpu_quota(cgroup, own) is None and usable_cpus(cgroup, own) == 16
    files({}, "0::/\n")
    assert cpu_quota(cgroup, own) is None and cpu_quota(cgroup, tmp_path / "absent") is None
    # what cannot be read is passed over, not a failed start: a line that is no cgroup's, a period of 0
    files({"cpu.max": "100000 0\n", "a/cpu.max": "200000 100000\n"}, "garbage\n0::/a\n")
    assert cpu_quota(cgroup, own) == 2.0


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    (tmp_path / "x86").write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n"
                                  "flags\t\t: fpu sse2 avx2 fma avx512_vnni\n\nprocessor\t: 1\nmodel name\t: another\n")
    assert cpuinfo_field(("model name",), tmp_path / "x86") == "AMD EPYC 9R14"  # the first CPU's
    assert cpuinfo_field(("model name",), tmp_path / "absent") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd asimddp\n")
    assert cpu_flags(tmp_path / "x86") == {"fpu", "sse2", "avx2", "fma", "avx512_vnni"}
    assert cpu_flags(tmp_path / "arm") == {"fp", "asimd", "asimddp"}
    assert cpu_flags(tmp_path / "absent") is None  # not Linux: the system does not say


def test_tokenize_gives_the_tokenizers_ids(backend, default_export):
    texts = ["A man is playing a guitar.", "naïve café — 東京", "x " * 400]
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(default_export / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(256)
    batch, original = backend.tokenizer.encode(texts)
    assert [batch.row(i).tolist() for i in range(len(texts))] == [e.ids for e in reference.encode_batch(texts)]
    assert original.tolist()[2] == 402 and batch.ids.dtype == np.int32


def test_padding_multiple_is_calibrated_for_this_cpu(backend, default_export):
    assert backend.pad_to_multiple_of in (1, 2, 4, 8, 16, 32)
    fixed = OnnxBackend(default_export, pad_to_multiple_of=16)  # a setting skips the calibration
    assert fixed.pad_to_multiple_of == 16


def test_a_graph_is_calibrated_once_per_process_and_thread_count(backend, default_export, tmp_path, monkeypatch):
    """Loading the same graph again (a reload, a copy under another name) reuses the multiple measured for it; other
    intra-op threads measure again."""
    import shutil

    import service.engine.backends.onnx as onnx_backend

    monkeypatch.setattr(onnx_backend, "_CALIBRATED", dict(onnx_backend._CALIBRATED))
    measured = []
    monkeypatch.setattr(OnnxBackend, "calibrate_padding", lambda self: measured.append(self) or 32)
    copy = shutil.copytree(default_export, tmp_path / "copy")
    assert OnnxBackend(copy).pad_to_multiple_of == backend.pad_to_multiple_of and measured == []
    more_threads = OnnxBackend(default_export, intra_op_threads=physical_cores() + 1)
    assert more_threads.pad_to_multiple_of == 32 and measured == [more_threads]


def test_cuda_asked_for_and_absent_fails_loudly(default_export):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="device=cuda but onnxruntime offers only"):
        OnnxBackend(default_export, device="cuda")


def test_truncation_is_reported_with_the_original_token_count(backend):
    batch, original = backend.tokenizer.encode(["word " * 300, "a short one"])
    assert batch.lengths.tolist() == [256, 5] and original.tolist() == [302, 5]


def test_health_runs_a_real_forward_pass(backend):
    backend.health()
    backend.warmup()


def test_an_export_must_give_back_its_recorded_golden_vectors(default_export, tmp_path):
    import json
    import shutil

    from service.engine.backends.onnx import IntegrityError
    from service.manifest import Manifest

    manifest = Manifest.load(default_export)
    assert manifest.golden and len(manifest.golden["embeddings"]) == 3
    OnnxBackend(default_export).self_check()  # the real export passes

    tampered = tmp_path / "tampered"
    shutil.copytree(default_export, tampered)
    data = json.loads((tampered / "manifest.json").read_text())
    data["golden"]["embeddings"][1][0] += 0.01  # as if another model had been recorded
    (tampered / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="golden vectors differ"):
        OnnxBackend(tampered).self_check()

    other_tokenizer = tmp_path / "other-tokenizer"  # same graph, a tokenizer that splits differently
    shutil.copytree(default_export, other_tokenizer)
    tok = json.loads((other_tokenizer / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "Replace", "pattern": {"String": "a"}, "content": "x"}
    (other_tokenizer / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(IntegrityError, match="golden check"):
        OnnxBackend(other_tokenizer).self_check()


def test_cuda_loads_the_fp16_graph_with_a_wider_golden_tolerance(default_export, monkeypatch):
    """No GPU here: onnxruntime is told it has CUDA, and the session it is asked for is recorded, not run."""
    import onnxruntime as ort

    from service.engine.backends.onnx import GOLDEN_TOLERANCE, OTHER_DEVICE_GOLDEN_TOLERANCE

    asked = {}

    class Session:
        def __init__(self, path, options, providers, enable_fallback):
            asked.update(path=path, providers=providers, enable_fallback=enable_fallback)
            self.providers = [p if isinstance(p, str) else p[0] for p in providers]

        def get_providers(self):
            return self.providers

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Session)
    monkeypatch.setattr(ort, "preload_dlls", lambda: None, raising=False)
    backend = OnnxBackend(default_export, device="cuda", variant="fp16")
    assert asked["path"].endswith("model.fp16.onnx") and asked["providers"][0][0] == "CUDAExecutionProvider"
    assert asked["enable_fallback"] == 0  # a provider that fails to load is an error, not a quiet fallback
    assert backend.info.variant == "fp16" and backend.pad_to_multiple_of == 8
    # its golden vectors were recorded on the export's CPU: a GPU's float16 kernels round differently
    assert backend._golden_tolerance == OTHER_DEVICE_GOLDEN_TOLERANCE > GOLDEN_TOLERANCE
    assert OnnxBackend(default_export, variant="fp16", pad_to_multiple_of=1)._golden_tolerance == GOLDEN_TOLERANCE


def test_on_cuda_a_pass_runs_with_its_row_count_padded_to_a_bucket(default_export, monkeypatch):
    """CUDA kernels plan once per input shape: single-text load must not make every pass a new shape. No GPU
    here: a recording session stands in for onnxruntime's CUDA one (IO binding), answering one row per input."""
    import onnxruntime as ort

    from service.engine.backends.base import bucketed_rows
    from service.engine.backends.onnx import CUDA_ROW_BUCKETS
    from service.ipc.messages import TokenBatch

    def row_bucket(rows):
        return bucketed_rows(rows, CUDA_ROW_BUCKETS)

    assert OnnxBackend(default_export, pad_to_multiple_of=1).row_buckets == ()  # a CPU has no shape planning to avoid
    shapes = []

    class Binding:
        def __init__(self):
            self.inputs = {}

        def bind_cpu_input(self, name, array):
            self.inputs[name] = array

        def bind_output(self, name, device):
            assert device == "cuda"

        def get_outputs(self):
            ids = self.inputs["input_ids"]
            shapes.append(ids.shape)
            out = np.repeat(ids[:, :1].astype(np.float32), 384, axis=1)  # row i carries its first token id
            return [type("Value", (), {"numpy": lambda self, a=out: a})()] * 2

    class Session:
        def __init__(self, path, options, providers, enable_fallback):
            pass

        def get_providers(self):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

        def io_binding(self):
            return Binding()

        def run_with_iobinding(self, binding, options):
            pass

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Session)
    monkeypatch.setattr(ort, "preload_dlls", lambda: None, raising=False)
    backend = OnnxBackend(default_export, device="cuda")
    for rows in (1, 3, 9, 200, 1000):
        items = TokenBatch.from_rows([[101 + i, 7, 102] for i in range(rows)])
        normalized, raw = backend.run(items, 8)
        assert shapes[-1] == (row_bucket(rows), 8) and row_bucket(rows) in CUDA_ROW_BUCKETS
        assert normalized.shape == raw.shape == (rows, 384) and list(normalized[:, 0]) == [101 + i for i in range(rows)]
    assert [row_bucket(n) for n in (1, 2, 3, 17, 25, 100, 1024, 1025)] == [1, 2, 4, 24, 32, 128, 1024, 2048]
    assert OnnxBackend(default_export, device="cuda", row_buckets=False).run(items.slice(0, 9), 8)[0].shape == (9, 384)
    assert shapes[-1] == (9, 8)
    # warm-up: every bucket at 16 and 32 tokens that the queue can form, no larger pass
    shapes.clear()
    backend.warmup(max_batch_tokens=16384, max_batch_requests=1000)
    assert set(shapes) == {(n, length) for n in CUDA_ROW_BUCKETS for length in (16, 32) if n * length <= 16384}
    assert (512, 32) in shapes and (1024, 16) in shapes and (768, 32) not in shapes
    shapes.clear()
    backend.warmup(max_batch_tokens=4096, max_batch_requests=40)
    assert {n for n, _ in shapes} == {1, 2, 4, 8, 16, 24, 32, 48} and max(n * t for n, t in shapes) <= 4096


def test_on_cuda_the_fp16_variant_is_chosen_when_the_export_has_one(default_export, tmp_path):
    import json
    import shutil

    from service.engine.socket_server import choose_variant
    from service.settings import Settings

    assert choose_variant(Settings(model_dir=default_export), default_export) == "fp32"
    assert choose_variant(Settings(model_dir=default_export, device="cuda"), default_export) == "fp16"
    assert choose_variant(Settings(model_dir=default_export, device="cuda", variant="fp32"), default_export) == "fp32"
    shutil.copytree(default_export, tmp_path / "e")  # an export whose fp16 failed its gate lists none
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    del manifest["variants"]["fp16"]
    (tmp_path / "e" / "manifest.json").write_text(json.dumps(manifest))
    assert choose_variant(Settings(model_dir=tmp_path / "e", device="cuda"), tmp_path / "e") == "fp32"


def test_int8_asked_for_serves_the_exports_one_int8_graph_and_refuses_the_retired_pair(default_export, tmp_path):
    """SEMBED_VARIANT=int8: the export's one int8 graph; an export with the retired per-CPU pair (a by-blocks int8
    beside int8-avx2) is refused, saying to export it again. int8-avx2 is not a setting."""
    import json

    from pydantic import ValidationError

    from service.engine.socket_server import choose_variant
    from service.manifest import StaleExport
    from service.settings import Settings

    assert choose_variant(Settings(model_dir=default_export, variant="int8"), default_export) == "int8"
    older = tmp_path / "older"
    older.mkdir()
    record = json.loads((default_export / "manifest.json").read_text())
    record["variants"]["int8-avx2"] = {**record["variants"]["int8"], "file": "model.int8-avx2.onnx"}
    (older / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(StaleExport, match=r"int8 by blocks beside int8-avx2.*export again: python -m export"):
        choose_variant(Settings(model_dir=older, variant="int8"), older)
    with pytest.raises(ValidationError):
        Settings(variant="int8-avx2")


def test_tensorrt_asked_for_and_absent_fails_loudly(default_export, monkeypatch):
    import onnxruntime as ort

    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has TensorRT")
    # past the CUDA check (a CPU machine has none): TensorRT's own check must speak
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda: None, raising=False)
    with pytest.raises(RuntimeError, match="tensorrt asked for but onnxruntime offers only"):
        OnnxBackend(default_export, device="cuda", tensorrt=True)


def test_a_provider_onnxruntime_drops_fails_loudly(default_export, monkeypatch):
    """onnxruntime leaves out, with a warning only, a provider its build lacks (and falls back past one that
    fails to load): the backend checks what the session really runs on. Here the CPU build's real session
    drops CUDA and TensorRT, which the availability check was told were there."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(ort, "preload_dlls", lambda: None, raising=False)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    cuda = r"did not load CUDAExecutionProvider \(the session runs on CPUExecutionProvider\)"
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=cuda):
        OnnxBackend(default_export, device="cuda")
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    both = "did not load TensorrtExecutionProvider, CUDAExecutionProvider"
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=both):
        OnnxBackend(default_export, device="cuda", tensorrt=True)
    assert OnnxBackend(default_export).session.get_providers() == ["CPUExecutionProvider"]  # asked for, got
