"""The API processes' tokenizer: BERT's ASCII fast path gives exactly tokenizers' ids and counts."""

from __future__ import annotations

import json
import random
import shutil
import string

import numpy as np
import pytest

from service.tokenization import BertWordPiece, Tokenizer


def sentences(shared_data, limit: int = 30000) -> list[str]:
    out = []
    for path in sorted((shared_data / "senteval").rglob("*")):
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as f:
                out += [t for line in f for t in line.rstrip("\n").split("\t") if t and not t.isdigit()]
    return random.Random(0).sample(out, min(limit, len(out)))


def tricky(n: int = 3000) -> list[str]:
    """Random ASCII with control characters, and what only tokenizers gets right: added tokens written in
    the text, words over WordPiece's 100 characters, non-ASCII letters."""
    rnd = random.Random(1)
    alphabet = string.printable + "\x00\x01\x07\x0b\x0c\x1f\x7f"
    out = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 300))) for _ in range(n)]
    return out + ["x [SEP] y", "[CLS]", "[UNK] [PAD] [MASK]", "hello[SEP]", "a" * 100, "a" * 101, "b" * 300,
                  "", " ", "\t\n", "Café déjà vu", "naïve 北京 Ελλάδα", "emoji 🎉 end", "ﬁne ligature"]


@pytest.fixture(scope="module")
def tokenizers_pair(default_export):
    fast, reference = Tokenizer(default_export), Tokenizer(default_export)
    assert fast.wordpiece is not None, "the default model is BERT: the fast path must be on"
    reference.wordpiece = None
    return fast, reference


# 33,000 texts through both tokenizers each: the truncations past the default are slow (`make test` runs them)
@pytest.mark.parametrize("limit,direction", [
    (256, "right"),
    pytest.param(8, "right", marks=pytest.mark.slow),
    pytest.param(8, "left", marks=pytest.mark.slow),
    pytest.param(3, "left", marks=pytest.mark.slow),
])
def test_fast_path_gives_the_ids_and_counts_of_tokenizers(tokenizers_pair, shared_data, limit, direction):
    fast, reference = tokenizers_pair
    for tok in (fast, reference):
        tok.max_seq_length = limit
        tok._right.enable_truncation(limit)
        tok._left.enable_truncation(limit, direction="left")
    texts = sentences(shared_data) + tricky()
    random.Random(2).shuffle(texts)
    on_fast_path = 0
    for start in range(0, len(texts), 256):
        batch = texts[start:start + 256]
        on_fast_path += len(batch) - len(fast.wordpiece.refused(batch))
        got, got_counts = fast.encode(batch, direction)
        want, want_counts = reference.encode(batch, direction)
        assert np.array_equal(got.offsets, want.offsets), batch
        assert np.array_equal(got.ids, want.ids), batch
        assert np.array_equal(got_counts, want_counts), batch
    assert on_fast_path > 0.9 * len(texts)  # the check refuses little real text


def test_what_only_tokenizers_gets_right_is_refused(tokenizers_pair):
    fast, _ = tokenizers_pair
    texts = ["plain text.", "x [SEP] y", "a" * 100, "a" * 101, "Café", "tab\tand\nnewline", "bell\x07", "fine"]
    assert fast.wordpiece.refused(texts) == [1, 3, 4, 6]
    assert fast.wordpiece.refused(["ok"] * 3) == []


def test_fast_path_with_type_ids(default_export, tmp_path):
    export = tmp_path / "with-type-ids"
    shutil.copytree(default_export, export)
    manifest = json.loads((export / "manifest.json").read_text())
    if "token_type_ids" not in manifest["inputs"]:
        manifest["inputs"].append("token_type_ids")
    (export / "manifest.json").write_text(json.dumps(manifest))
    batch, _ = Tokenizer(export).encode(["a man plays", "Café au lait"])
    assert batch.type_ids is not None and batch.type_ids.dtype == np.int8
    assert len(batch.type_ids) == len(batch.ids) and not batch.type_ids.any()


def test_only_bert_pipelines_take_the_fast_path(default_export, tmp_path):
    spec = json.loads((default_export / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Whitespace"}  # no longer BERT's: tokenizers alone
    export = tmp_path / "other"
    shutil.copytree(default_export, export)
    (export / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = Tokenizer(export)
    assert tokenizer.wordpiece is None and tokenizer.inline_chars == 4096
    batch, counts = tokenizer.encode(["a man plays"])
    assert len(batch) == 1 and counts[0] == 5


def test_a_fast_path_that_differs_on_the_probe_is_not_used(default_export, monkeypatch, caplog):
    monkeypatch.setattr(BertWordPiece, "PROBE", ("a man plays", "hello [world]"))
    original = BertWordPiece.encode

    def off_by_one(self, texts, limit, direction):
        rows, counts = original(self, texts, limit, direction)
        return [[*row[:-1], 0, row[-1]] for row in rows], counts

    monkeypatch.setattr(BertWordPiece, "encode", off_by_one)
    with caplog.at_level("WARNING", logger="sembed.tokenization"):
        assert Tokenizer(default_export).wordpiece is None
    assert "differs from tokenizers" in caplog.text


def test_the_fake_backends_tokenizer_decodes_the_words_it_gave_ids():
    from service.tokenization import WordTokenizer

    tokenizer = WordTokenizer()
    batch, _ = tokenizer.encode(["a cat sat", "FAIL here"])
    rows = [batch.row(i).tolist() for i in range(len(batch))]
    assert tokenizer.decode(rows) == ["a cat sat", "FAIL here"]
    assert tokenizer.decode([rows[0], [5]], skip_special_tokens=False) == ["[CLS] a cat sat [SEP]", "[UNK]"]
