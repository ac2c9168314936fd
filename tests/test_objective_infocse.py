"""InfoCSE: the auxiliary network's inputs, stage-2 freezing/detaching, BERT masking, the losses
against numpy, stage-1 pre-training, the MLM head's source and the exported encoder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from numpy_reference import np_info_nce

from core.encoder import SentenceEncoder
from training.loop import run_stages
from training.objectives import get_objective
from training.objectives.infocse import InfoCSE, InfoCSESettings

TEXTS = [
    "A man is playing a guitar.",
    "The cat sleeps on the warm mat.",
    "Stocks fell sharply on Monday morning.",
    "She baked bread for the whole family.",
]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matmuls on a shared 2-core machine: one thread avoids the spin-wait contention that makes
    them ~100x slower under load; restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def np_masked_ce(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy over rows with a label != -100; logits [N, V], labels [N]."""
    keep = labels != -100
    z = logits[keep] - logits[keep].max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-np.mean(log_p[np.arange(keep.sum()), labels[keep]]))


def stage2(encoder, **kw) -> InfoCSE:
    """An objective past its stages without stage-1 training (stage1_steps=0)."""
    obj = InfoCSE(encoder, InfoCSESettings(stage1_steps=0, **kw))
    run_stages(obj, TEXTS, CPU)
    return obj


def test_registry_and_paper_defaults(tiny_encoder):
    assert get_objective("infocse") is InfoCSE
    assert InfoCSE.data_kind == "unlabeled"
    obj = InfoCSE(tiny_encoder)
    assert (obj.temperature, obj.aux_weight, obj.mask_rate) == (0.05, 1e-5, 0.4)
    s = obj.settings
    assert (s.stage1_mask_rate, s.stage1_lr, s.stage1_batch_size, s.stage1_epochs, s.stage1_mlm_weight) == (
        0.15, 1e-4, 1024, 8, 1.0)
    assert tiny_encoder.pooling == "cls"
    assert obj.tap_layer == 1  # 2 layers: the middle one (the paper's 6 of 12)
    assert len(obj.extra_layers.layers) == 2
    assert InfoCSE(tiny_encoder, InfoCSESettings(tap_layer=2)).tap_layer == 2
    for bad in (0, 3):
        with pytest.raises(ValueError):
            InfoCSE(tiny_encoder, InfoCSESettings(tap_layer=bad))


def test_aux_input_is_top_cls_then_tap_layer_states(tiny_encoder):
    obj = InfoCSE(tiny_encoder)
    obj.eval()
    torch.manual_seed(0)
    mlm = obj.collate_stage1(TEXTS)
    b, t = mlm["input_ids"].shape
    with torch.no_grad():
        top, h, tapped = obj.stage1_inputs(mlm)
        ref = tiny_encoder.transformer(
            input_ids=mlm["input_ids"],
            attention_mask=mlm["attention_mask"],
            token_type_ids=mlm["token_type_ids"],
            output_hidden_states=True,
        )
        c = obj.aux_input(h, tapped)
    assert top.shape == tapped.shape == c.shape == (b, t, 32) and h.shape == (b, 32)
    torch.testing.assert_close(h, ref.last_hidden_state[:, 0])  # 12-cls: the top layer's [CLS]
    torch.testing.assert_close(tapped, ref.hidden_states[1])  # 6-hiddens: the first of two layers
    torch.testing.assert_close(c[:, 0], h)
    torch.testing.assert_close(c[:, 1:], ref.hidden_states[1][:, 1:])


def test_stage2_freezes_and_detaches_the_lower_layers(tiny_encoder):
    obj = stage2(tiny_encoder)
    lower = obj.aux_lower
    assert len(lower.encoder.layer) == 1 and len(tiny_encoder.transformer.encoder.layer) == 2
    # a separate copy, equal to the encoder's lower layers when stage 2 starts
    for (name, p), q in zip(
        lower.encoder.layer[0].named_parameters(), tiny_encoder.transformer.encoder.layer[0].parameters()
    ):
        assert p.data_ptr() != q.data_ptr() and torch.equal(p, q), name
    assert obj.mlm_head.decoder.weight is not tiny_encoder.transformer.embeddings.word_embeddings.weight

    obj.train()
    batch = obj.collate(TEXTS)
    tapped = obj.tapped_states(batch["mlm"])
    assert not tapped.requires_grad and tapped.grad_fn is None
    obj(batch)["loss"].backward()

    params = dict(obj.named_parameters())
    assert all(not p.requires_grad and p.grad is None for p in lower.parameters())
    assert not any(n.startswith("aux_lower.") for n, p in params.items() if p.requires_grad)  # not optimised
    for name in (
        "encoder.transformer.embeddings.word_embeddings.weight",
        "encoder.transformer.encoder.layer.0.attention.self.query.weight",
        "encoder.transformer.encoder.layer.1.output.dense.weight",
        "extra_layers.layers.0.attention.self.query.weight",
        "extra_layers.layers.1.output.dense.weight",
        "mlm_head.transform.dense.weight",
        "mlm_head.decoder.weight",
        "mlp.0.weight",
    ):
        assert params[name].grad is not None and params[name].grad.abs().sum() > 0, name


def test_aux_loss_reaches_the_encoder_only_through_h(tiny_encoder):
    obj = stage2(tiny_encoder)
    obj.train()
    mlm = obj.collate(TEXTS)["mlm"]
    top, h, _ = obj.stage1_inputs(mlm)
    obj.aux_loss(h.detach(), obj.tapped_states(mlm), mlm["attention_mask"], mlm["labels"]).backward()
    assert all(p.grad is None for p in tiny_encoder.parameters())
    assert obj.extra_layers.layers[0].attention.self.query.weight.grad is not None
    obj.zero_grad(set_to_none=True)
    obj.aux_loss(h, obj.tapped_states(mlm), mlm["attention_mask"], mlm["labels"]).backward()
    assert tiny_encoder.transformer.encoder.layer[1].output.dense.weight.grad.abs().sum() > 0


def _sentences(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    words = "the a cat dog sat on mat quickly house river green bright music runs under over".split()
    return [" ".join(rng.choice(words, size=rng.integers(3, 15))) for _ in range(n)]


def test_masking_rate_and_specials(tiny_encoder):
    obj = InfoCSE(tiny_encoder)
    tok = tiny_encoder.tokenizer
    texts = _sentences(600)
    torch.manual_seed(0)
    batch = obj.collate(texts)
    feats, mlm = batch["features"], batch["mlm"]
    assert feats["input_ids"].shape[0] == 2 * len(texts) and mlm["input_ids"].shape[0] == len(texts)
    orig = feats["input_ids"][: len(texts)]
    torch.testing.assert_close(feats["input_ids"][len(texts) :], orig)  # the two contrastive copies
    special = ~mlm["attention_mask"].bool() | torch.isin(orig, torch.tensor(tok.all_special_ids))
    assert special.sum() > 3 * len(texts)  # [CLS], [SEP] and padding are there
    masked = mlm["labels"] != -100
    assert not (masked & special).any()
    assert torch.equal(mlm["input_ids"][special], orig[special])
    assert torch.equal(mlm["labels"][masked], orig[masked])
    assert torch.equal(mlm["input_ids"][~masked], orig[~masked])
    rate = masked.sum().item() / (~special).sum().item()
    assert rate == pytest.approx(0.4, abs=0.03), rate
    n = masked.sum().item()
    to_mask = (mlm["input_ids"][masked] == tok.mask_token_id).sum().item() / n
    kept = (mlm["input_ids"][masked] == orig[masked]).sum().item() / n
    assert to_mask == pytest.approx(0.8, abs=0.03) and kept == pytest.approx(0.1, abs=0.03)
    # the same seed gives the same masks; stage 1 masks at its own rate
    torch.manual_seed(0)
    assert torch.equal(obj.collate(texts)["mlm"]["input_ids"], mlm["input_ids"])
    s1 = obj.collate_stage1(texts)
    s1_rate = (s1["labels"] != -100).sum().item() / (~special).sum().item()
    assert s1_rate == pytest.approx(0.15, abs=0.02), s1_rate


def test_contrastive_part_matches_numpy(tiny_encoder):
    obj = InfoCSE(tiny_encoder)
    rng = np.random.default_rng(1)
    z1, z2 = rng.normal(size=(4, 32)).astype(np.float32), rng.normal(size=(4, 32)).astype(np.float32)
    w, b = obj.mlp[0].weight.detach().numpy(), obj.mlp[0].bias.detach().numpy()
    want = np_info_nce(np.tanh(z1 @ w.T + b), np.tanh(z2 @ w.T + b), 0.05)
    assert obj.loss_from_embeddings(torch.tensor(z1), torch.tensor(z2)).item() == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("weight", [1e-5, 1000.0])
def test_total_is_contrastive_plus_lambda_aux(tiny_encoder, weight):
    """Dropout off: loss = InfoNCE(MLP(cls), MLP(cls)) + λ·CE(head(Extra([cls ; M1>0(x̂)])))."""
    obj = stage2(tiny_encoder, aux_weight=weight)
    obj.eval()
    torch.manual_seed(0)
    batch = obj.collate(TEXTS)
    mlm = batch["mlm"]
    with torch.no_grad():
        out = obj(batch)
        feats = tiny_encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
        cls = tiny_encoder.transformer(**feats).last_hidden_state[:, 0].numpy()
        inputs = {k: mlm[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        tap = tiny_encoder.transformer(**inputs, output_hidden_states=True).hidden_states[1].numpy()
        c = np.concatenate([cls[:, None], tap[:, 1:]], axis=1)
        hidden = obj.extra_layers(torch.tensor(c), mlm["attention_mask"])
        logits = obj.mlm_head(hidden).numpy()
    w, b = obj.mlp[0].weight.detach().numpy(), obj.mlp[0].bias.detach().numpy()
    z = np.tanh(cls @ w.T + b)
    cl = np_info_nce(z, z, 0.05)
    aux = np_masked_ce(logits.reshape(-1, logits.shape[-1]), mlm["labels"].reshape(-1).numpy())
    assert out["loss_cl"].item() == pytest.approx(cl, rel=1e-4)
    assert out["loss_aux"].item() == pytest.approx(aux, rel=1e-4)
    assert out["loss"].item() == pytest.approx(cl + weight * aux, rel=1e-4)
    assert aux > 5.0  # an untrained 30k-way head: the aux term matters once λ is large


def test_stage1_lowers_the_pretraining_loss(tiny_encoder):
    obj = InfoCSE(tiny_encoder, InfoCSESettings(stage1_steps=6, stage1_batch_size=8, stage1_lr=3e-3,
                                                stage1_warmup_ratio=0.0))
    torch.manual_seed(0)
    fixed = obj.collate_stage1(TEXTS)
    assert (fixed["labels"] != -100).sum() > 0
    obj.eval()
    with torch.no_grad():
        before = {k: v.item() for k, v in obj.stage1_losses(fixed).items()}
    assert before["loss"] == pytest.approx(before["loss_aux"] + before["loss_mlm"])  # Eq. 6, λ_mlm = 1
    layer0 = tiny_encoder.transformer.encoder.layer[0].attention.self.query.weight.detach().clone()
    extra = obj.extra_layers.layers[0].attention.self.query.weight.detach().clone()
    stages = obj.stages(TEXTS * 2, CPU)
    first = next(stages)
    assert (first.name, first.steps, first.micro_batches) == ("infocse stage 1 (aux pre-training)", 6, 1)
    stages.close()  # not trained: stage 2 is entered only after the loop has run stage 1 and asks for more
    assert obj.aux_lower is None
    run_stages(obj, TEXTS * 2, CPU)
    assert not obj.training  # the loop leaves the mode as it found it
    with torch.no_grad():
        # the stage-1 loss as it was during stage 1: W tied to the encoder's embeddings again
        obj.mlm_head.decoder.weight = tiny_encoder.transformer.embeddings.word_embeddings.weight
        after = {k: v.item() for k, v in obj.stage1_losses(fixed).items()}
    for k in ("loss", "loss_aux", "loss_mlm"):
        assert after[k] < before[k] - 0.1, (k, before, after)
    # the shared lower layers and the extra layers were trained; stage 2's frozen copy starts from them
    new_layer0 = tiny_encoder.transformer.encoder.layer[0].attention.self.query.weight
    assert not torch.equal(new_layer0, layer0)
    assert not torch.equal(obj.extra_layers.layers[0].attention.self.query.weight, extra)
    torch.testing.assert_close(obj.aux_lower.encoder.layer[0].attention.self.query.weight, new_layer0)
    assert list(obj.stages(TEXTS, CPU)) == []  # stage 2 already: nothing to run again
    torch.testing.assert_close(tiny_encoder.transformer.encoder.layer[0].attention.self.query.weight, new_layer0)


def test_stage1_can_leave_the_encoder_alone(tiny_encoder):
    obj = InfoCSE(tiny_encoder, InfoCSESettings(stage1_train_encoder=False, stage1_steps=2, stage1_batch_size=8,
                                                stage1_lr=3e-3, stage1_warmup_ratio=0.0))
    before = {k: v.detach().clone() for k, v in tiny_encoder.state_dict().items()}
    extra = obj.extra_layers.layers[0].attention.self.query.weight.detach().clone()
    transform = obj.mlm_head.transform.dense.weight.detach().clone()
    run_stages(obj, TEXTS * 2, CPU)
    for k, v in tiny_encoder.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.requires_grad for p in tiny_encoder.parameters())  # trainable again for stage 2
    assert not torch.equal(obj.extra_layers.layers[0].attention.self.query.weight, extra)
    assert not torch.equal(obj.mlm_head.transform.dense.weight, transform)


def test_forward_needs_the_stages_run(tiny_encoder):
    obj = InfoCSE(tiny_encoder)
    with pytest.raises(RuntimeError, match="stages"):
        obj(obj.collate(TEXTS))


def test_fresh_mlm_head_tied_to_word_embeddings(tiny_encoder):
    obj = InfoCSE(tiny_encoder)
    assert obj.mlm_head_source == "fresh"
    assert obj.mlm_head.decoder.weight is tiny_encoder.transformer.embeddings.word_embeddings.weight
    assert torch.equal(obj.mlm_head.bias, torch.zeros(30522))
    assert torch.equal(obj.mlm_head.transform.LayerNorm.weight, torch.ones(32))


def test_mlm_head_loaded_from_a_masked_lm_checkpoint(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(1)
    config = BertConfig.from_pretrained(tiny_model_dir)
    mlm_model = BertForMaskedLM(config)
    with torch.no_grad():
        mlm_model.cls.predictions.transform.dense.weight.normal_()
        mlm_model.cls.predictions.bias.uniform_()
    mlm_model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)

    encoder = SentenceEncoder.from_pretrained(tmp_path, max_seq_length=32)
    obj = InfoCSE(encoder)
    assert obj.mlm_head_source == str(tmp_path)
    torch.testing.assert_close(obj.mlm_head.transform.dense.weight, mlm_model.cls.predictions.transform.dense.weight)
    torch.testing.assert_close(obj.mlm_head.bias, mlm_model.cls.predictions.bias)
    assert obj.mlm_head.decoder.weight is encoder.transformer.embeddings.word_embeddings.weight
    # the same head as BertForMaskedLM's: equal logits on the same hidden states
    hidden = torch.randn(3, 32)
    mlm_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(obj.mlm_head(hidden), mlm_model.cls(hidden), rtol=1e-5, atol=1e-5)


def test_inference_encoder_is_the_encoder_alone(tiny_encoder):
    obj = stage2(tiny_encoder)
    enc = obj.inference_encoder()
    assert enc is tiny_encoder and enc.head is None and enc.pooling == "cls"
    own = {id(p) for p in enc.parameters()}
    for part in (obj.aux_lower, obj.extra_layers, obj.mlm_head, obj.mlp):
        assert not any(id(p) in own for p in part.parameters())
    feats = tiny_encoder.tokenize(TEXTS)
    enc.eval()
    with torch.no_grad():
        emb = enc(feats["input_ids"], feats["attention_mask"], feats["token_type_ids"])
        cls = enc.transformer(**feats).last_hidden_state[:, 0]
    torch.testing.assert_close(emb, cls)


def test_keywords(tiny_encoder):
    settings = InfoCSESettings(pooling="mean", max_length=8, projection="bn_mlp", extra_layers_init="top",
                               stage1_steps=0)
    obj = InfoCSE(tiny_encoder, settings)
    assert tiny_encoder.pooling == "mean"
    batch = obj.collate(["word " * 50, "short one"])
    assert batch["features"]["input_ids"].shape == (4, 8) and batch["mlm"]["input_ids"].shape == (2, 8)
    # "top" keeps the encoder's top layers' weights in the extra layers
    torch.testing.assert_close(
        obj.extra_layers.layers[1].output.dense.weight, tiny_encoder.transformer.encoder.layer[1].output.dense.weight
    )
    run_stages(obj, TEXTS, CPU)
    obj.train()
    out = obj(obj.collate(TEXTS))
    assert torch.isfinite(out["loss"])


# ---------- starting from a Condenser checkpoint ----------
@pytest.fixture
def condenser_dir(tiny_model_dir, tmp_path):
    """A checkpoint saved the way Condenser's CondenserForPretraining.save_pretrained saves one: the
    *ForMaskedLM model as an HF directory, and model.pt with every non-"lm." tensor ("c_head.*")."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM
    from transformers.models.bert.modeling_bert import BertLayer

    class Condenser(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.lm = BertForMaskedLM(config)
            self.c_head = torch.nn.ModuleList([BertLayer(config) for _ in range(2)])

    torch.manual_seed(3)
    config = BertConfig.from_pretrained(tiny_model_dir)
    model = Condenser(config)
    with torch.no_grad():  # trained-looking weights, far from any fresh initialisation
        for p in list(model.c_head.parameters()) + list(model.lm.cls.predictions.transform.parameters()):
            p.normal_(0.0, 0.3)
    out = tmp_path / "condenser"
    model.lm.save_pretrained(out)
    torch.save({k: v for k, v in model.state_dict().items() if not k.startswith("lm")}, out / "model.pt")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    model.eval()
    return out, model


def test_condenser_checkpoint_becomes_the_auxiliary_network(condenser_dir):
    path, condenser = condenser_dir
    encoder = SentenceEncoder.from_pretrained(path, max_seq_length=32)
    obj = InfoCSE(encoder, InfoCSESettings(stage1_steps=0))
    assert obj.aux_source == str(path) and obj.mlm_head_source == str(path)
    for (name, p), (_, q) in zip(obj.extra_layers.layers.named_parameters(), condenser.c_head.named_parameters()):
        assert torch.equal(p, q), name
    # the same auxiliary network as Condenser's forward: c_head over [top CLS ; skip-layer states], lm.cls
    obj.eval()
    torch.manual_seed(0)
    mlm = obj.collate_stage1(["A man is playing a guitar.", "Stocks fell."])  # padded: the mask matters
    with torch.no_grad():
        _, h, tapped = obj.stage1_inputs(mlm)
        ours = obj.mlm_head(obj.extra_layers(obj.aux_input(h, tapped), mlm["attention_mask"]))
        inputs = {k: v for k, v in mlm.items() if k != "labels"}
        lm_out = condenser.lm(**inputs, output_hidden_states=True)
        hiddens = torch.cat([lm_out.hidden_states[-1][:, :1], lm_out.hidden_states[obj.tap_layer][:, 1:]], dim=1)
        # Condenser's get_extended_attention_mask: 0 where attended, a large negative at padding
        mask = (1.0 - mlm["attention_mask"][:, None, None, :].float()) * -10000.0
        for layer in condenser.c_head:
            out = layer(hiddens, mask)
            hiddens = out[0] if isinstance(out, tuple) else out
        theirs = condenser.lm.cls(hiddens)
    keep = mlm["attention_mask"].bool()
    torch.testing.assert_close(ours[keep], theirs[keep], rtol=1e-4, atol=1e-4)
    run_stages(obj, TEXTS, CPU)  # the official recipe: no further stage 1
    torch.testing.assert_close(obj.extra_layers.layers[1].output.dense.weight, condenser.c_head[1].output.dense.weight)


def test_condenser_head_from_another_directory_and_mismatches(tiny_encoder, condenser_dir):
    path, condenser = condenser_dir
    obj = InfoCSE(tiny_encoder, InfoCSESettings(aux_from=str(path)))
    assert obj.aux_source == str(path) and obj.mlm_head_source == "fresh"
    torch.testing.assert_close(obj.extra_layers.layers[0].attention.self.query.weight,
                               condenser.c_head[0].attention.self.query.weight)
    with pytest.raises(ValueError, match="2 head layers"):
        InfoCSE(tiny_encoder, InfoCSESettings(aux_from=str(path), num_extra_layers=1))
    assert InfoCSE(tiny_encoder).aux_source == "random"  # no model.pt: fresh extra layers
    with pytest.raises(FileNotFoundError, match="Condenser"):  # asked for by name: must be there
        InfoCSE(tiny_encoder, InfoCSESettings(aux_from=str(path.parent)))


# ---------- the official stage-2 recipe ----------
def test_bn_mlp_is_the_official_projection_over_both_views(tiny_encoder):
    obj = InfoCSE(tiny_encoder, InfoCSESettings(projection="bn_mlp"))
    lin1, bn1, act, lin2, bn2 = obj.mlp
    assert (lin1.in_features, lin1.out_features, lin1.bias) == (32, 64, None)
    assert bn1.num_features == 64 and bn1.affine and isinstance(act, torch.nn.ReLU)
    assert (lin2.in_features, lin2.out_features, lin2.bias) == (64, 32, None)
    assert bn2.num_features == 32 and not bn2.affine
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        bn1.weight.copy_(torch.rand(64, generator=gen) + 0.5)
        bn1.bias.copy_(torch.randn(64, generator=gen))
    obj.train()
    z1, z2 = torch.randn(6, 32, generator=gen), torch.randn(6, 32, generator=gen) + 2.0
    out = obj.mlp(torch.cat([z1, z2]))
    assert out.shape == (12, 32)
    torch.testing.assert_close(out.mean(0), torch.zeros(32), atol=1e-5, rtol=0)  # the last BN, no affine
    torch.testing.assert_close(out.var(0, unbiased=False), torch.ones(32), atol=1e-3, rtol=0)

    def bn(a, gamma=1.0, beta=0.0):
        return (a - a.mean(0)) / np.sqrt(a.var(0) + 1e-5) * gamma + beta

    w1, w2 = lin1.weight.detach().double().numpy(), lin2.weight.detach().double().numpy()
    z = np.concatenate([z1.double().numpy(), z2.double().numpy()])  # one batch: the official flattening
    a = np.maximum(bn(z @ w1.T, bn1.weight.detach().double().numpy(), bn1.bias.detach().double().numpy()), 0)
    g = bn(a @ w2.T)
    want = np_info_nce(g[:6], g[6:], 0.05)
    assert obj.loss_from_embeddings(z1, z2).item() == pytest.approx(want, rel=1e-4)
    obj.eval()  # at inference, running statistics: a row does not depend on the rest of the batch
    torch.testing.assert_close(obj.mlp(z1)[:1], obj.mlp(z1[:1]))


def test_official_recipe_preset_resolves(tiny_encoder):
    from training.config import PRESETS, make_config

    cfg = make_config("infocse", "paper-official")
    assert (cfg.lr, cfg.epochs, cfg.batch_size, cfg.precision, cfg.eval_every) == (7e-6, 2, 64, "fp16", 125)
    assert cfg.base_model == "Luyu/condenser"
    official = {"pooling": "cls", "projection": "bn_mlp", "stage1_steps": 0, "aux_from": "Luyu/condenser",
                "aux_lower_dropout": False}
    assert cfg.objective == InfoCSESettings(**official)  # the rest: the paper's defaults
    paper_simcse = dataclasses.replace(make_config("simcse", "paper"), preset="paper-official")
    assert make_config("simcse", "paper-official") == paper_simcse  # other methods: their paper's
    assert PRESETS["paper"]["infocse"]["lr"] == 3e-5  # the paper's text stays the `paper` preset

    obj = InfoCSE(tiny_encoder, dataclasses.replace(cfg.objective, aux_from=None))  # no hub here: the tiny model
    assert isinstance(obj.mlp[1], torch.nn.BatchNorm1d) and obj.settings.stage1_steps == 0
    run_stages(obj, TEXTS, CPU)
    obj.train()
    assert tiny_encoder.training and not obj.aux_lower.training  # --mlm_eval: no dropout in the frozen copy
    mlm = obj.collate(TEXTS)["mlm"]
    torch.testing.assert_close(obj.tapped_states(mlm), obj.tapped_states(mlm), rtol=0, atol=0)
    out = obj(obj.collate(TEXTS))
    assert torch.isfinite(out["loss"])

    default = stage2(tiny_encoder)
    default.train()
    assert default.aux_lower.training  # aux_lower_dropout=True: dropout follows the objective's mode
