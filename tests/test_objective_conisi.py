"""ConIsI: losses against numpy, the three construction strategies, the pair inputs, training."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numpy_reference import np_info_nce

from training.augment.construct import _WORD, antonym_replace, other_indices, subword_replace
from training.augment.pos import candidates, guess_pos
from training.augment.wordnet import Antonyms, WordNetMissing, load_antonyms, load_lexicon
from training.objectives import get_objective
from training.objectives.conisi import ConIsI, ConIsISettings, default_interactive_weight

TEXTS = [
    "A man is playing a guitar.",
    "The cat sleeps on the warm mat.",
    "Stocks fell sharply on Monday morning.",
    "She baked bread for the whole family.",
]
TAU = 0.05


# ---------- independent numpy reference ----------
def np_g(h, w1, b1, gamma, beta, eps=1e-5):
    """ELU(BN(W1 h + b1)) with BN in training mode (batch mean, biased variance)."""
    a = h @ w1.T + b1
    a = (a - a.mean(0)) / np.sqrt(a.var(0) + eps) * gamma + beta
    return np.where(a > 0, a, np.exp(a) - 1)


def np_conisi(hx, hy, hz, p, batchnorm="joint"):
    n = len(hx)
    if batchnorm == "joint":
        g = np_g(np.concatenate([hx, hy, hz]), *p["g"])
        gx, gy, gz = g[:n], g[n : 2 * n], g[2 * n :]
    else:
        gx, gy, gz = (np_g(h, *p["g"]) for h in (hx, hy, hz))
    cl = np_info_nce(gx, gy, TAU)
    ry, rz = gy @ p["w3"].T + p["b3"], gz @ p["w3"].T + p["b3"]
    inter = float(np.mean(-np.log(np.exp(ry) / (np.exp(ry) + np.exp(rz)))))
    return cl, inter


def randomise_heads(obj, seed=0):
    """Non-trivial head weights (BN γ/β too), returned as numpy for the reference."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in list(obj.head.parameters()) + list(obj.classifier.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p is obj.head[1].weight else 0.0))
    lin, bn = obj.head[0], obj.head[1]
    as_np = lambda t: t.detach().double().numpy()  # noqa: E731
    return {
        "g": (as_np(lin.weight), as_np(lin.bias), as_np(bn.weight), as_np(bn.bias)),
        "w3": as_np(obj.classifier.weight),
        "b3": as_np(obj.classifier.bias),
    }


def test_registry_name():
    assert get_objective("conisi") is ConIsI
    assert ConIsI.data_kind == "unlabeled"


@pytest.mark.parametrize("batchnorm", ["joint", "separate"])
@pytest.mark.parametrize("logit_dim", [1, None])
def test_losses_match_numpy_and_weighting(tiny_encoder, batchnorm, logit_dim):
    obj = ConIsI(tiny_encoder, ConIsISettings(interactive_weight=0.3, batchnorm=batchnorm, logit_dim=logit_dim))
    obj.train()
    params = randomise_heads(obj)
    rng = np.random.default_rng(0)
    hx, hy, hz = (rng.normal(size=(5, 32)) for _ in range(3))
    out = obj.losses(*(torch.tensor(h, dtype=torch.float32) for h in (hx, hy, hz)))
    cl, inter = np_conisi(hx, hy, hz, params, batchnorm)
    assert out["loss_contrastive"].item() == pytest.approx(cl, rel=1e-4, abs=1e-5)
    assert out["loss_interactive"].item() == pytest.approx(inter, rel=1e-4, abs=1e-5)
    assert out["loss"].item() == pytest.approx(0.7 * cl + 0.3 * inter, rel=1e-4, abs=1e-5)
    assert obj.classifier.out_features == (32 if logit_dim is None else 1)


def test_default_lambda_follows_the_encoder():
    assert default_interactive_weight(SimpleNamespace(model_type="bert", hidden_size=768)) == 0.8
    assert default_interactive_weight(SimpleNamespace(model_type="roberta", hidden_size=768)) == 0.1
    assert default_interactive_weight(SimpleNamespace(model_type="bert", hidden_size=1024)) == 0.1


def test_lambda_default_and_override(tiny_encoder):
    assert ConIsI(tiny_encoder).interactive_weight == 0.8  # tiny BERT
    assert ConIsI(tiny_encoder, ConIsISettings(interactive_weight=0.25)).interactive_weight == 0.25


def test_forward_equals_numpy_on_independently_encoded_inputs(tiny_encoder):
    """Wiring: x single, Y = (x, x) and Z = (x, c) as real pairs, CLS states, heads, Eq. 10."""
    texts = ["It was a good day.", "The soup is hot.", "The dog is happy."]
    composed = ["It was a bad night.", "The soup is cold.", "The dog is unhappy."]
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="o2", antonym_probability=1.0))
    obj.train()
    tiny_encoder.eval()  # no dropout, so the reference sees the same network; BN stays in training mode
    params = randomise_heads(obj, seed=1)
    with torch.no_grad():
        out = obj(obj.collate(texts))
        tok, tf = tiny_encoder.tokenizer, tiny_encoder.transformer
        cls = lambda *a: tf(**tok(*a, padding=True, return_tensors="pt")).last_hidden_state[:, 0].double().numpy()  # noqa: E731
        hx, hy, hz = cls(texts), cls(texts, texts), cls(texts, composed)
    cl, inter = np_conisi(hx, hy, hz, params)
    assert out["loss_contrastive"].item() == pytest.approx(cl, rel=1e-4, abs=1e-5)
    assert out["loss_interactive"].item() == pytest.approx(inter, rel=1e-4, abs=1e-5)
    assert out["loss"].item() == pytest.approx(0.2 * cl + 0.8 * inter, rel=1e-4, abs=1e-5)


# ---------- pair inputs ----------
def test_pairs_carry_segments_and_identical_halves(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="s", max_length=8))
    texts = TEXTS + ["word " * 40]  # the last one is cut to L = 8 tokens
    batch = obj.collate(texts, generator=torch.Generator().manual_seed(0))
    single, pairs = batch["single"], batch["pairs"]
    assert single["input_ids"].shape[1] <= 8 and pairs["input_ids"].shape[1] <= 16
    n = len(texts)
    assert pairs["input_ids"].shape[0] == 2 * n
    cls_id, sep_id = tiny_encoder.tokenizer.cls_token_id, tiny_encoder.tokenizer.sep_token_id
    for i in range(2 * n):
        ids = pairs["input_ids"][i][pairs["attention_mask"][i].bool()].tolist()
        tt = pairs["token_type_ids"][i][pairs["attention_mask"][i].bool()].tolist()
        first_sep = ids.index(sep_id)
        x = single["input_ids"][i % n][single["attention_mask"][i % n].bool()].tolist()
        assert ids[0] == cls_id and ids[-1] == sep_id
        assert ids[: first_sep + 1] == x  # first segment: x exactly as the single input has it
        assert tt == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        assert pairs["token_type_ids"][i][~pairs["attention_mask"][i].bool()].eq(0).all()
        if i < n:  # Y = [x; x]: the second half repeats x's tokens
            assert ids[first_sep + 1 :] == x[1:]


def test_strategy_s_never_pairs_a_sentence_with_itself(tiny_encoder):
    gen = torch.Generator().manual_seed(0)
    n = 5
    seen = np.zeros((n, n), dtype=int)
    for _ in range(2000):
        k = other_indices(n, gen).numpy()
        seen[np.arange(n), k] += 1
    assert np.all(np.diag(seen) == 0)
    off = seen[~np.eye(n, dtype=bool)]
    assert off.min() > 0.7 * off.mean()  # every other sentence gets drawn, roughly uniformly
    with pytest.raises(ValueError):
        other_indices(1)

    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="s"))
    for seed in range(5):
        batch = obj.collate(TEXTS, generator=torch.Generator().manual_seed(seed))
        sep = tiny_encoder.tokenizer.sep_token_id
        xs = [r[m.bool()].tolist()[1:] for r, m in zip(batch["single"]["input_ids"], batch["single"]["attention_mask"])]
        for i in range(len(TEXTS)):
            row = batch["pairs"]["input_ids"][len(TEXTS) + i]
            ids = row[batch["pairs"]["attention_mask"][len(TEXTS) + i].bool()].tolist()
            c = ids[ids.index(sep) + 1 :]
            assert c in xs and c != xs[i]


def test_strategy_s_with_one_sentence_falls_back(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="s", subword_proportion=1.0, subword_random_share=1.0))
    obj.train()
    batch = obj.collate(["Just one sentence here."])
    y, z = batch["pairs"]["input_ids"]
    assert not torch.equal(y, z)  # o1 corrupted c instead
    assert torch.isfinite(obj(batch)["loss"])


# ---------- o1: sub-word replacement ----------
def test_subword_replacement_rates_and_specials():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (2000, 100), generator=gen)
    replaceable = torch.rand(ids.shape, generator=gen) < 0.9
    vocab = torch.arange(999, 30522)  # ids below 999 play the role of special tokens here
    new, chosen, replaced = subword_replace(ids, replaceable, vocab, generator=gen)
    n_rep = replaceable.sum().item()
    assert chosen.sum().item() / n_rep == pytest.approx(0.15, abs=0.005)
    assert replaced.sum().item() / chosen.sum().item() == pytest.approx(0.8, abs=0.015)
    assert not (chosen & ~replaceable).any() and not (replaced & ~chosen).any()
    assert torch.equal(new[~replaced], ids[~replaced])  # kept 20%, unchosen and specials untouched
    changed = new != ids
    assert changed[replaced].float().mean() > 0.999  # a random draw hits the original ~1/30k
    assert new[replaced].min() >= 999


def test_o1_collate_only_touches_the_composed_sentence(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="o1", subword_proportion=0.5))
    special = set(tiny_encoder.tokenizer.all_special_ids)
    assert not special & set(obj.vocab_ids.tolist())
    batch = obj.collate(TEXTS * 5, generator=torch.Generator().manual_seed(0))
    ids, tt = batch["pairs"]["input_ids"], batch["pairs"]["token_type_ids"]
    n = len(TEXTS) * 5
    ref = tiny_encoder.tokenizer(TEXTS * 5, TEXTS * 5, padding=True, return_tensors="pt")["input_ids"]
    assert torch.equal(ids[:n], ref)  # Y untouched
    diff = ids[n:] != ref
    assert diff.any()
    assert not diff[tt[n:] == 0].any()  # x, [CLS], the first [SEP] and padding never change
    is_special = torch.isin(ref, torch.tensor(sorted(special)))
    assert torch.equal(ids[n:][is_special], ref[is_special])  # [SEP]s (and [PAD]s) stay
    rate = diff[tt[n:] == 1].float().mean().item()  # the final [SEP] (type 1) is never replaced
    assert 0.2 < rate < 0.5


# ---------- o2: WordNet antonyms ----------
def test_antonym_table_from_the_debian_wordnet():
    table = load_antonyms()
    assert table["good"]["adj"][0] == "bad" and table["hot"]["adj"][0] == "cold"
    assert table["close"] == {"adj": ("distant",), "verb": ("open",)}  # one entry per part of speech
    for word in ("dog", "the", "guitar"):
        assert word not in table
    # WordNet antonymy never crosses parts of speech: every antonym is a lemma of its entry's POS
    lexicon = load_lexicon()
    for word, by_pos in table.items():
        for pos, ants in by_pos.items():
            assert all(pos in lexicon[a.lower()] for a in ants), (word, pos, ants)


def test_antonym_replacement():
    ant = Antonyms().in_context
    gen = torch.Generator().manual_seed(0)
    assert antonym_replace("good", ant, generator=gen) == "bad"  # one candidate: always replaced
    assert antonym_replace("The soup is hot.", ant, generator=gen) == "The soup is cold."
    assert antonym_replace("Good soup, hot tea!", ant, probability=1.0) == "Bad soup, cold tea!"
    assert antonym_replace("The dog barked at the cat.", ant, generator=gen) == "The dog barked at the cat."
    # probability: over many draws each of two antonym-bearing words flips about half the time
    outs = [antonym_replace("good and hot", ant, probability=0.5, generator=gen) for _ in range(400)]
    assert all(o != "good and hot" for o in outs)  # at least one always replaced
    assert 0.55 < np.mean(["bad" in o for o in outs]) < 0.8  # 0.5 + 0.5·0.5·0.5 = 0.625 expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("He will close the door.", "He will open the door."),  # verb
        ("The house is close to the river.", "The house is distant to the river."),  # adjective
        ("She carried a light bag.", "She carried a heavy bag."),  # adjective
        ("Turn on the light.", "Turn on the dark."),  # noun: not "heavy"
        ("Prices rise sharply.", "Prices fall sharply."),  # verb
        ("The fall of the empire.", "The rise of the empire."),  # noun
        ("They left the room.", "They left the room."),  # "leave" in the past: no adjective "right"
        ("He is not happy.", "He is not unhappy."),
    ],
)
def test_antonyms_are_taken_in_the_words_part_of_speech(text, expected):
    assert antonym_replace(text, Antonyms().in_context, probability=1.0) == expected


def test_pos_guess_on_hand_tagged_sentences():
    lexicon = load_lexicon()
    cases = {
        "He will close the door": [None, None, "verb", None, "noun"],
        "A close friend came back": [None, "adj", "noun", "verb", "adv"],
        "The light is too bright": [None, "noun", None, "adv", "adj"],
        "Fall vertically or sharply": ["verb", "adv", None, "adv"],
        "The lights are off": [None, "noun", None, "adj"],
    }
    for sentence, tags in cases.items():
        assert guess_pos(sentence.split(), lexicon) == tags, sentence


def _content(sentence: str, lexicon) -> bool:
    return any(candidates(m.group().lower(), lexicon) for m in _WORD.finditer(sentence))


@pytest.fixture(scope="module")
def corpus_sample(shared_data):
    return (shared_data / "corpus" / "wordnet-sentences.txt").read_text().splitlines()[:512]


def _same_rate(obj, texts, seed=0):
    gen, same = torch.Generator().manual_seed(seed), 0
    for i in range(0, len(texts), 64):
        ids = obj.collate(texts[i : i + 64], generator=gen)["pairs"]["input_ids"]
        n = len(ids) // 2
        same += (ids[:n] == ids[n:]).all(1).sum().item()
    return same / len(texts)


@pytest.mark.parametrize("strategy", ["o1", "o2", "s"])
def test_composed_sentence_never_equals_x_on_the_corpus(tiny_encoder, corpus_sample, strategy):
    """ℓII needs c ≠ x; without the guarantee well over 10 % of the pairs have c == x (ConIsI's
    docstring gives the rates on 2048 corpus sentences)."""
    texts = [t for t in corpus_sample if _content(t, load_lexicon())]
    assert len(texts) > 500
    assert _same_rate(ConIsI(tiny_encoder, ConIsISettings(strategy=strategy)), texts) == 0.0
    if strategy != "s":
        assert _same_rate(ConIsI(tiny_encoder, ConIsISettings(strategy=strategy, ensure_different=False)), texts) > 0.1


def test_o2_replacements_on_the_corpus_share_the_words_part_of_speech(corpus_sample):
    ant, lexicon = Antonyms(), load_lexicon()
    replaced = 0
    for sentence in corpus_sample:
        words = [m.group() for m in _WORD.finditer(sentence)]
        for word, tag, options in zip(words, guess_pos(words, lexicon), ant.in_context(words)):
            if options:
                replaced += 1
                assert tag in lexicon[word.lower()]  # the word is a WordNet lemma of that part of speech
                assert all(tag in lexicon[a.lower()] for a in options), (sentence, word, tag, options)
                assert options == load_antonyms()[word.lower()][tag]
    assert replaced > 300  # most sentences have a word with an antonym in its part of speech


@pytest.mark.parametrize(
    "strategy, texts",
    [("s", ["The same sentence twice.", "The same sentence twice."]), ("o2", ["The dog barked at the cat."])],
)
def test_identical_c_falls_back_to_subword_replacement(tiny_encoder, strategy, texts):
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy=strategy))
    for seed in range(5):
        batch = obj.collate(texts, generator=torch.Generator().manual_seed(seed))
        ids, tt = batch["pairs"]["input_ids"], batch["pairs"]["token_type_ids"]
        n = len(texts)
        ref = tiny_encoder.tokenizer(texts, texts, padding=True, return_tensors="pt")["input_ids"]
        assert torch.equal(ids[:n], ref)  # Y untouched
        diff = ids[n:] != ref
        assert diff.any(1).all()  # every c differs from its x ...
        assert not diff[tt[n:] == 0].any()  # ... in c's own sub-words only
    off = ConIsI(tiny_encoder, ConIsISettings(strategy=strategy, ensure_different=False))
    with_off = off.collate(texts)["pairs"]["input_ids"]
    assert torch.equal(with_off[: len(texts)], with_off[len(texts) :])


def test_forced_subword_replacement_changes_every_row():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 1010, (3000, 12), generator=gen)  # a small vocabulary: draws often repeat
    replaceable = torch.rand(ids.shape, generator=gen) < 0.5
    replaceable[:10] = False  # rows with nothing replaceable stay as they are
    vocab = torch.arange(1000, 1010)
    new, chosen, replaced = subword_replace(ids, replaceable, vocab, proportion=0.0, generator=gen, at_least_one=True)
    has = replaceable.any(1)
    changed = new != ids
    assert torch.equal(changed.sum(1), has.long())  # exactly one changed position per such row
    assert not (changed & ~replaceable).any() and torch.equal(changed, replaced) and torch.equal(changed, chosen)
    assert torch.equal(new[:10], ids[:10])
    assert new[changed].min() >= 1000 and new[changed].max() <= 1009
    # the forced position is uniform among the row's replaceable ones
    first = replaceable.float().argmax(1)
    hit_first = changed[torch.arange(len(ids)), first][has].float().mean().item()
    assert hit_first == pytest.approx((1 / replaceable.sum(1)[has].float()).mean().item(), abs=0.03)
    # at the paper's rate, rows that changed by themselves keep their draws
    free, _, _ = subword_replace(ids, replaceable, vocab, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(1)
    forced, _, _ = subword_replace(ids, replaceable, vocab, generator=gen, at_least_one=True)
    moved = (free != ids).any(1)
    assert torch.equal(forced[moved], free[moved]) and (forced[has] != ids[has]).any(1).all()


def test_o2_collate_composes_antonym_pairs(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(strategy="o2", antonym_probability=1.0))
    batch = obj.collate(["It is hot.", "A good man."])
    decoded = [tiny_encoder.tokenizer.decode(r, skip_special_tokens=True) for r in batch["pairs"]["input_ids"][2:]]
    assert decoded == ["it is hot. it is cold.", "a good man. a bad woman."]


def test_missing_wordnet_names_the_apt_package(tiny_encoder, tmp_path):
    with pytest.raises(WordNetMissing, match="wordnet-base"):
        ConIsI(tiny_encoder, ConIsISettings(strategy="o2", wordnet_dir=tmp_path))
    ConIsI(tiny_encoder, ConIsISettings(strategy="s", wordnet_dir=tmp_path))  # only o2 needs WordNet
    with pytest.raises(ValueError):
        ConIsI(tiny_encoder, ConIsISettings(strategy="x"))


# ---------- training behaviour ----------
def test_gradients_reach_encoder_and_heads(tiny_encoder):
    obj = ConIsI(tiny_encoder)
    obj.train()
    obj(obj.collate(TEXTS))["loss"].backward()
    named = dict(obj.named_parameters())
    for name in (
        "encoder.transformer.embeddings.word_embeddings.weight",
        "encoder.transformer.embeddings.token_type_embeddings.weight",
        "head.0.weight",
        "head.1.weight",
        "classifier.weight",
    ):
        assert named[name].grad is not None and named[name].grad.abs().sum() > 0, name


def test_a_few_steps_lower_the_loss(tiny_encoder):
    obj = ConIsI(tiny_encoder)
    obj.train()
    batch = obj.collate(TEXTS, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam([p for p in obj.parameters() if p.requires_grad], lr=1e-3)

    def loss():
        torch.manual_seed(123)  # the same dropout masks at every evaluation
        return obj(batch)["loss"]

    start = loss().item()
    for _ in range(2):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < start


def test_inference_encoder_is_cls_without_heads(tiny_encoder):
    obj = ConIsI(tiny_encoder)
    enc = obj.inference_encoder()
    assert enc is tiny_encoder and enc.head is None and enc.pooling == "cls"
    assert not any(
        p is q for p in enc.parameters() for q in list(obj.head.parameters()) + list(obj.classifier.parameters())
    )
    feats = tiny_encoder.tokenize(TEXTS)
    enc.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            enc(feats["input_ids"], feats["attention_mask"], feats["token_type_ids"]),
            enc.transformer(**feats).last_hidden_state[:, 0],
        )


@pytest.fixture(scope="module")
def tiny_roberta_dir(tmp_path_factory):
    """A random 2-layer RoBERTa with a byte-level BPE tokenizer trained on a few sentences."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    out = tmp_path_factory.mktemp("tiny-roberta")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 5, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(out))
    tok = RobertaTokenizerFast(vocab=str(out / "vocab.json"), merges=str(out / "merges.txt"))
    assert len(tok) > 100  # the trained vocabulary was really loaded
    tok.save_pretrained(out)
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=tok.pad_token_id,
    )
    RobertaModel(config, add_pooling_layer=False).save_pretrained(out)
    return out


def test_roberta_pairs_use_double_separator(tiny_roberta_dir):
    from core.encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(tiny_roberta_dir, max_seq_length=32)
    obj = ConIsI(enc, ConIsISettings(strategy="o1"))
    assert obj.interactive_weight == 0.1
    batch = obj.collate(TEXTS[:2], generator=torch.Generator().manual_seed(0))
    assert "token_type_ids" not in batch["pairs"]
    tok = enc.tokenizer
    y = batch["pairs"]["input_ids"][0][batch["pairs"]["attention_mask"][0].bool()].tolist()
    x = batch["single"]["input_ids"][0][batch["single"]["attention_mask"][0].bool()].tolist()
    s, e = tok.bos_token_id, tok.eos_token_id
    assert x[0] == s and x[-1] == e
    assert y == x + [e] + x[1:]  # <s> x </s></s> x </s>
    obj.train()
    out = obj(batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and obj.classifier.weight.grad.abs().sum() > 0


# ---------- ablation switches (issue 23) ----------
def test_lambda_zero_is_the_contrastive_loss_alone_and_never_encodes_z(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(interactive_weight=0.0))
    obj.train()
    tiny_encoder.eval()
    batch = obj.collate(TEXTS, generator=torch.Generator().manual_seed(0))
    rows = []
    hook = tiny_encoder.register_forward_hook(lambda m, a, kw, out: rows.append(len(out)), with_kwargs=True)
    try:
        out = obj(batch)
    finally:
        hook.remove()
    assert rows == [len(TEXTS), len(TEXTS)]  # x, then Y only
    assert set(out) == {"loss", "loss_contrastive"} and out["loss"].item() == pytest.approx(
        out["loss_contrastive"].item())
    separate = ConIsI(tiny_encoder, ConIsISettings(interactive_weight=0.0, batchnorm="separate"))
    separate.train()
    h = torch.randn(4, tiny_encoder.dim)
    assert separate.losses(h, h + 0.1, h[:0])["loss"].item() == pytest.approx(  # Z plays no part
        separate.losses(h, h + 0.1, torch.randn(4, tiny_encoder.dim))["loss"].item())


def test_dropout_positive_is_x_again_and_the_classifier_still_sees_y_and_z(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(positive="dropout", interactive_weight=0.3, batchnorm="separate"))
    obj.train()
    params = randomise_heads(obj)
    rng = np.random.default_rng(0)
    hx, hplus, hy, hz = (rng.normal(size=(5, 32)) for _ in range(4))
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    out = obj.losses(t(hx), t(hy), t(hz), positive=t(hplus))
    cl, _ = np_conisi(hx, hplus, hz, params, "separate")  # ℓI against x⁺ ...
    _, inter_y = np_conisi(hx, hy, hz, params, "separate")  # ... ℓII on Y and Z
    assert out["loss_contrastive"].item() == pytest.approx(cl, rel=1e-4, abs=1e-5)
    assert out["loss_interactive"].item() == pytest.approx(inter_y, rel=1e-4, abs=1e-5)
    assert out["loss"].item() == pytest.approx(0.7 * cl + 0.3 * inter_y, rel=1e-4, abs=1e-5)
    obj(obj.collate(TEXTS))["loss"].backward()  # the whole path runs and reaches the encoder
    assert tiny_encoder.transformer.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="positive"):
        ConIsI(tiny_encoder, ConIsISettings(positive="other"))


def test_dropout_positive_without_the_classifier_encodes_no_pair(tiny_encoder):
    obj = ConIsI(tiny_encoder, ConIsISettings(positive="dropout", interactive_weight=0.0))
    obj.train()
    rows = []
    hook = tiny_encoder.register_forward_hook(lambda m, a, kw, out: rows.append(len(out)), with_kwargs=True)
    try:
        out = obj(obj.collate(TEXTS))
    finally:
        hook.remove()
    assert rows == [2 * len(TEXTS)] and set(out) == {"loss", "loss_contrastive"}  # x twice, one pass
    out["loss"].backward()


@pytest.mark.parametrize("batchnorm", ["joint", "separate"])
def test_tanh_head_is_simcses_head_under_both_losses(tiny_encoder, batchnorm):
    obj = ConIsI(tiny_encoder, ConIsISettings(head="tanh", interactive_weight=0.3, batchnorm=batchnorm))
    obj.train()
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in obj.modules())
    assert [type(m) for m in obj.head] == [torch.nn.Linear, torch.nn.Tanh]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in list(obj.head.parameters()) + list(obj.classifier.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    as_np = lambda t: t.detach().double().numpy()  # noqa: E731
    w1, b1 = as_np(obj.head[0].weight), as_np(obj.head[0].bias)
    w3, b3 = as_np(obj.classifier.weight), as_np(obj.classifier.bias)
    rng = np.random.default_rng(0)
    hx, hy, hz = (rng.normal(size=(5, 32)) for _ in range(3))
    gx, gy, gz = (np.tanh(h @ w1.T + b1) for h in (hx, hy, hz))  # SimCSE's MLP, no batch statistics
    cl = np_info_nce(gx, gy, TAU)
    ry, rz = gy @ w3.T + b3, gz @ w3.T + b3
    inter = float(np.mean(np.log1p(np.exp(rz - ry))))
    out = obj.losses(*(torch.tensor(h, dtype=torch.float32) for h in (hx, hy, hz)))
    assert out["loss_contrastive"].item() == pytest.approx(cl, rel=1e-4, abs=1e-5)
    assert out["loss_interactive"].item() == pytest.approx(inter, rel=1e-4, abs=1e-5)
    assert out["loss"].item() == pytest.approx(0.7 * cl + 0.3 * inter, rel=1e-4, abs=1e-5)
    obj(obj.collate(TEXTS))["loss"].backward()  # the whole path runs and reaches the encoder and both heads
    assert tiny_encoder.transformer.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert obj.head[0].weight.grad.abs().sum() > 0 and obj.classifier.weight.grad.abs().sum() > 0
    assert ConIsI(tiny_encoder, ConIsISettings()).head[1].__class__ is torch.nn.BatchNorm1d  # the paper's default
    with pytest.raises(ValueError, match="head"):
        ConIsI(tiny_encoder, ConIsISettings(head="relu"))
