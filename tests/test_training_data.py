"""Training data readers (real files and small fixtures) and the mixed-label batch sampler."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from torch.utils.data import DataLoader

from core import data
from core.data import PairExample, ScoredPair, load_examples
from training.sampling import MixedLabelBatchSampler, make_batch_sampler

# --- real files (row counts from the data folder's README) -------------------------------------


@pytest.mark.parametrize("split,rows", [("train", 5749), ("dev", 1500), ("test", 1379)])
def test_stsb_rows(shared_data, split, rows):
    pairs = load_examples("scored", f"stsb:{split}", shared_data)
    assert len(pairs) == rows and all(isinstance(p, ScoredPair) for p in pairs)
    assert all(0.0 <= p.label <= 5.0 and p.sentence1 and p.sentence2 for p in pairs)
    first = (shared_data / f"senteval/STS/STSBenchmark/sts-{split}.csv").read_text().split("\n", 1)[0].split("\t")
    assert pairs[0] == ScoredPair(first[5], first[6], float(first[4]))


@pytest.mark.parametrize("split,rows", [("train", 4500), ("trial", 500), ("test", 4927)])
def test_sick_rows(shared_data, split, rows):
    pairs = load_examples("scored", "sick", shared_data, split=split)
    assert len(pairs) == rows
    assert all(1.0 <= p.label <= 5.0 for p in pairs)
    nli = load_examples("scored", f"sick-nli:{split}", shared_data)
    assert len(nli) == rows and {p.label for p in nli} == {0.0, 1.0, 2.0}


def test_snli_scored_and_pairs(shared_data):
    scored = load_examples("scored", "snli:dev", shared_data)
    assert len(scored) == 9842 and len(load_examples("scored", "snli:test", shared_data)) == 9824
    labels = (shared_data / "senteval/SNLI/labels.dev").read_text().split()
    assert Counter(p.label for p in scored) == {
        2.0: labels.count("entailment"),
        1.0: labels.count("neutral"),
        0.0: labels.count("contradiction"),
    }
    pairs = load_examples("pairs", "snli:dev", shared_data)
    assert len(pairs) == labels.count("entailment")
    contradictions = {(p.sentence1, p.sentence2) for p in scored if p.label == 0.0}
    entailments = {(p.sentence1, p.sentence2) for p in scored if p.label == 2.0}
    for p in pairs:
        assert (p.anchor, p.positive) in entailments
        if p.negative is not None:  # a contradiction of the same premise
            assert (p.anchor, p.negative) in contradictions
    premises_with_contra = {a for a, _ in contradictions}
    assert all((p.negative is not None) == (p.anchor in premises_with_contra) for p in pairs)


def test_stsb_positive_pairs_for_clsr(shared_data):
    raw = (shared_data / "senteval/STS/STSBenchmark/sts-train.csv").read_text().splitlines()
    expected = sum(float(line.split("\t")[4]) > 4 for line in raw)
    pairs = load_examples("pairs", "stsb", shared_data)
    assert len(pairs) == expected and all(isinstance(p, PairExample) and p.negative is None for p in pairs)
    every_split = load_examples("pairs", "stsb:train+dev+test", shared_data)
    assert len(every_split) > len(pairs)


def test_unlabeled_text_and_limit(shared_data):
    assert len(load_examples("unlabeled", "text:corpus/wordnet-sentences.txt", shared_data)) == 135398
    few = load_examples("unlabeled", f"text:{shared_data / 'corpus/wordnet-sentences.txt'}", limit=5)
    assert len(few) == 5 and all(isinstance(s, str) and s == s.strip() and s for s in few)
    sents = load_examples("unlabeled", "stsb:dev", shared_data)
    assert len(sents) == len(set(sents)) and "a man with a hard hat is dancing ." in sents


# --- fixture files ----------------------------------------------------------------------------


def test_text_reader_skips_blank_lines(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("first sentence .\n\n   \n  second sentence .  \nthird .\n")
    assert data.read_text(f) == ["first sentence .", "second sentence .", "third ."]
    assert data.read_text(f, limit=2) == ["first sentence .", "second sentence ."]


def test_stsb_reader_quote_none_and_extra_columns(tmp_path):
    (tmp_path / "sts-dev.csv").write_text(
        'main-news\theadlines\t2013\t0001\t3.400\tHe said "we won\'t stop\tHe "said\n'
        "main-forums\tdeft\t2014\t0002\t0.000\tone\ttwo\tsource-a\tsource-b\n"
    )
    pairs = data.read_stsb(tmp_path, "dev")
    assert pairs == [
        ScoredPair("He said \"we won't stop", 'He "said', 3.4),
        ScoredPair("one", "two", 0.0),
    ]
    (tmp_path / "sts-test.csv").write_text("a\tb\tc\n")
    with pytest.raises(ValueError, match="7 tab-separated"):
        data.read_stsb(tmp_path, "test")


def test_simcse_nli_csv(tmp_path):
    f = tmp_path / "nli_for_simcse.csv"
    f.write_text(
        "sent0,sent1,hard_neg\n"
        '"A man, in a hat, sings.",A man sings.,A woman dances.\n'
        'Two dogs play.,"Dogs play, happily.",\n'
    )
    pairs = load_examples("pairs", f"nli-csv:{f}")
    assert pairs == [
        PairExample("A man, in a hat, sings.", "A man sings.", "A woman dances."),
        PairExample("Two dogs play.", "Dogs play, happily.", None),
    ]
    scored = load_examples("scored", "nli-csv:nli_for_simcse.csv", tmp_path)  # path under data_dir
    assert scored == [
        ScoredPair("A man, in a hat, sings.", "A man sings.", 2.0),
        ScoredPair("A man, in a hat, sings.", "A woman dances.", 0.0),
        ScoredPair("Two dogs play.", "Dogs play, happily.", 2.0),
    ]
    assert len(load_examples("unlabeled", f"nli-csv:{f}")) == 5
    (tmp_path / "wiki.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match="sent0,sent1"):
        data.read_nli_csv_pairs(tmp_path / "wiki.csv")


def test_senteval_snli_layout_fixture(tmp_path):
    snli = tmp_path / "SNLI"
    snli.mkdir()
    rows = [
        ("P1 .", "e1 .", "entailment"),
        ("P1 .", "c1 .", "contradiction"),
        ("P1 .", "e2 .", "entailment"),
        ("P1 .", "n1 .", "neutral"),
        ("P2 .", "e3 .", "entailment"),
        ("P2 .", "x .", "-"),
        ("P3 .", "c3 .", "contradiction"),
        ("P3 .", "c4 .", "contradiction"),
        ("P3 .", "e4 .", "entailment"),
        ("P3 .", "e5 .", "entailment"),
    ]
    for i, name in enumerate(("s1", "s2", "labels")):
        (snli / f"{name}.train").write_text("".join(f"{r[i]} \n" for r in rows))
    assert load_examples("pairs", "snli", tmp_path) == [
        PairExample("P1 .", "e1 .", "c1 ."),
        PairExample("P1 .", "e2 .", "c1 ."),
        PairExample("P2 .", "e3 .", None),
        PairExample("P3 .", "e4 .", "c3 ."),
        PairExample("P3 .", "e5 .", "c4 ."),
    ]
    scored = load_examples("scored", "snli", tmp_path)
    assert [p.label for p in scored] == [2.0, 0.0, 2.0, 1.0, 2.0, 0.0, 0.0, 2.0, 2.0]  # "-" dropped
    (snli / "labels.train").write_text("entailment\n")
    with pytest.raises(ValueError, match="lines"):
        load_examples("pairs", "snli", tmp_path)


def test_load_examples_rejects_bad_names(tmp_path):
    with pytest.raises(ValueError, match="unknown source"):
        load_examples("scored", "mnli", tmp_path)
    with pytest.raises(ValueError, match="unknown data kind"):
        load_examples("triples", "stsb", tmp_path)
    with pytest.raises(ValueError, match="only gives unlabeled"):
        load_examples("pairs", "text:x.txt", tmp_path)
    with pytest.raises(FileNotFoundError, match="no stsb data"):
        load_examples("scored", "stsb", tmp_path)


# --- sampler ----------------------------------------------------------------------------------


def _mixed(batches, labels):
    return [len({labels[i] for i in b}) >= 2 for b in batches]


def test_sampler_mixes_a_skewed_dataset():
    labels = [0.0] * 170 + [1.0] * 30  # 30 minority items, 25 batches: enough for every batch
    sampler = MixedLabelBatchSampler(labels, batch_size=8, seed=3, oversample=False)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 25
    assert all(_mixed(batches, labels))
    assert sorted(i for b in batches for i in b) == list(range(200))  # a permutation: each once
    assert all(len(b) == 8 for b in batches)
    # a plain shuffle of the same data leaves many batches with one label
    order = np.random.default_rng(3).permutation(200)
    plain = [order[i : i + 8].tolist() for i in range(0, 200, 8)]
    assert not all(_mixed(plain, labels))


def test_sampler_scarce_minority_oversamples():
    labels = [1.0] * 195 + [0.0] * 5  # fewer minority items than batches
    batches = list(MixedLabelBatchSampler(labels, batch_size=10, seed=0))
    assert all(_mixed(batches, labels))
    counts = Counter(i for b in batches for i in b)
    assert set(range(200)) == set(counts)  # every item still seen
    assert all(counts[i] == 1 for i in range(195))  # only minority items are duplicated
    without = list(MixedLabelBatchSampler(labels, batch_size=10, seed=0, oversample=False))
    assert sum(_mixed(without, labels)) == 5  # the best possible with each item used once


def test_sampler_continuous_scores_span_the_range():
    rng = np.random.default_rng(0)
    labels = rng.uniform(0, 5, size=320).round(1).tolist()
    batches = list(MixedLabelBatchSampler(labels, batch_size=16, seed=1))
    for b in batches:  # stratified: every batch has low and high scores
        ys = [labels[i] for i in b]
        assert min(ys) < 1.0 and max(ys) > 4.0


def test_sampler_epochs_drop_last_and_ranks():
    labels = [i % 3 for i in range(103)]
    s = MixedLabelBatchSampler(labels, batch_size=10, drop_last=True, seed=7)
    first = list(s)
    assert len(first) == 10 and all(len(b) == 10 for b in first)
    assert first == list(s)  # same epoch, same order
    s.set_epoch(1)
    assert first != list(s)
    ranks = [MixedLabelBatchSampler(labels, batch_size=10, seed=7, num_replicas=2, rank=r) for r in (0, 1)]
    got = [list(r) for r in ranks]
    assert len(got[0]) == len(got[1]) == len(ranks[0]) == 5  # 11 global batches → 5 each
    assert not set().union(*got[0]) & set().union(*got[1])


def test_make_batch_sampler_with_dataloader():
    assert make_batch_sampler(None, [], 4) is None
    with pytest.raises(ValueError, match="unknown batch sampler"):
        make_batch_sampler("nope", [], 4)
    examples = [ScoredPair(f"a{i}", f"b{i}", float(i >= 18)) for i in range(20)]
    sampler = make_batch_sampler("mixed_labels", examples, 5, seed=0)
    loader = DataLoader(examples, batch_sampler=sampler, collate_fn=lambda xs: [x.label for x in xs])
    batches = list(loader)
    assert len(batches) == 4 and all(len(set(b)) == 2 for b in batches)


# --- NLI train sets (SNLI + MultiNLI), as distributed ------------------------------------------

# (premise, hypothesis, gold label) in file order; "-" is SNLI's "no gold label" (dropped)
SNLI_ROWS = {
    "train": [
        ("A man plays a guitar.", "A man makes music.", "entailment"),
        ("A man plays a guitar.", "A man sleeps.", "contradiction"),
        ("A man plays a guitar.", "A man plays on stage.", "neutral"),
        ("Two dogs run.", "Animals move.", "entailment"),
        ("Two dogs run.", "Dogs are \"fast\", very.", "-"),
    ],
    "dev": [("A child reads.", "A kid reads.", "entailment")],
    "test": [("A cat sits.", "A cat stands.", "contradiction")],
}
MNLI_ROWS = {
    "train": [
        ("Conceptually cream skimming has two basic dimensions.", "Product and geography are what make cream "
         "skimming work.", "neutral"),
        ("you know during the season and i guess", "You lose the things to the following level.", "entailment"),
        ("you know during the season and i guess", "You never lose anything.", "contradiction"),
    ],
    "dev_matched": [("The new rights are nice enough", "Everyone really likes the newest benefits", "neutral")],
    "dev_mismatched": [("Your gift is appreciated.", "Hundreds of students benefit.", "neutral")],
}


def _snli_line(i, premise, hypothesis, label):
    import json

    return json.dumps({
        "annotator_labels": [label if label != "-" else "neutral"], "captionID": f"{i}.jpg#0", "gold_label": label,
        "pairID": f"{i}.jpg#0r1n", "sentence1": premise, "sentence1_binary_parse": "( ( A man ) ... )",
        "sentence1_parse": "(ROOT (S ...))", "sentence2": hypothesis, "sentence2_binary_parse": "( ... )",
        "sentence2_parse": "(ROOT (S ...))",
    })


def _mnli_line(i, premise, hypothesis, label):
    import json

    return json.dumps({
        "annotator_labels": [label], "genre": "government", "gold_label": label, "pairID": f"{i}n",
        "promptID": str(i), "sentence1": premise, "sentence1_binary_parse": "( ... )",
        "sentence1_parse": "(ROOT ...)", "sentence2": hypothesis, "sentence2_binary_parse": "( ... )",
        "sentence2_parse": "(ROOT ...)",
    })


def _write_nli_jsonl(root):
    (root / "snli_1.0").mkdir(parents=True)
    (root / "multinli_1.0").mkdir(parents=True)
    for split, rows in SNLI_ROWS.items():
        (root / "snli_1.0" / f"snli_1.0_{split}.jsonl").write_text(
            "".join(_snli_line(i, *r) + "\n" for i, r in enumerate(rows)))
    for split, rows in MNLI_ROWS.items():
        (root / "multinli_1.0" / f"multinli_1.0_{split}.jsonl").write_text(
            "".join(_mnli_line(i, *r) + "\n" for i, r in enumerate(rows)))


def _write_allnli_tsv(root):
    """sentence-transformers' AllNLI.tsv.gz: split, dataset, filename, sentence1, sentence2, label."""
    import gzip

    lines = ["split\tdataset\tfilename\tsentence1\tsentence2\tlabel"]
    for dataset, rows, files in (("SNLI", SNLI_ROWS, {"train": "train", "dev": "dev", "test": "test"}),
                                 ("MNLI", MNLI_ROWS, {"train": "train", "dev": "dev_matched",
                                                      "test": "dev_mismatched"})):
        for split, name in files.items():
            file = f"{dataset.lower()}_1.0_{name}.jsonl"
            lines += [f"{split}\t{dataset}\t{file}\t{p}\t{h}\t{y}" for p, h, y in rows[name]]
    root.mkdir(parents=True, exist_ok=True)
    with gzip.open(root / "AllNLI.tsv.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def test_nli_train_from_snli_and_multinli_jsonl(tmp_path):
    _write_nli_jsonl(tmp_path)
    pairs = load_examples("pairs", "nli", tmp_path)
    # every entailment pair of both sets (CLSR §4.1), a contradiction of its premise as hard negative
    assert pairs == [
        PairExample("A man plays a guitar.", "A man makes music.", "A man sleeps."),
        PairExample("Two dogs run.", "Animals move.", None),
        PairExample("you know during the season and i guess", "You lose the things to the following level.",
                    "You never lose anything."),
    ]
    scored = load_examples("scored", "nli:train", tmp_path)
    # CoSENT Table II: NLI keeps all three classes, contradiction 0 < neutral 1 < entailment 2
    assert [p.label for p in scored] == [2.0, 0.0, 1.0, 2.0, 1.0, 2.0, 0.0]
    assert scored[2] == ScoredPair("A man plays a guitar.", "A man plays on stage.", 1.0)
    # dev = SNLI dev + MultiNLI dev-matched, test = SNLI test + MultiNLI dev-mismatched (CoSENT Table II)
    assert [p.sentence1 for p in load_examples("scored", "nli:dev", tmp_path)] == [
        "A child reads.", "The new rights are nice enough"]
    assert [p.label for p in load_examples("scored", "nli:test", tmp_path)] == [0.0, 1.0]
    assert len(load_examples("scored", "nli:train+dev", tmp_path)) == 9
    one_file = load_examples("scored", "nli-jsonl:snli_1.0/snli_1.0_train.jsonl", tmp_path)
    assert [p.label for p in one_file] == [2.0, 0.0, 1.0, 2.0]


def test_nli_train_from_allnli_tsv_matches_the_jsonl(tmp_path):
    _write_nli_jsonl(tmp_path / "jsonl")
    _write_allnli_tsv(tmp_path / "tsv")
    for kind in ("pairs", "scored", "unlabeled"):
        for source in ("nli", "nli:dev", "nli:test+train"):
            assert load_examples(kind, source, tmp_path / "tsv") == load_examples(kind, source, tmp_path / "jsonl")
    assert load_examples("scored", "allnli-tsv:AllNLI.tsv.gz", tmp_path / "tsv", split="dev") == (
        load_examples("scored", "nli:dev", tmp_path / "jsonl"))
    assert 'Dogs are "fast", very.' not in load_examples("unlabeled", "nli", tmp_path / "tsv")  # "-" dropped


def test_nli_source_needs_both_sets(tmp_path):
    _write_nli_jsonl(tmp_path)
    (tmp_path / "multinli_1.0" / "multinli_1.0_train.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="multinli_1.0_train.jsonl"):
        load_examples("pairs", "nli", tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_examples("pairs", "nli:validation", tmp_path)


# --- binary-label sets (CoSENT Table IV: PAWS, MRPC; and QQP) -----------------------------------


def test_paws_mrpc_qqp_readers(tmp_path):
    paws = tmp_path / "paws" / "final"
    paws.mkdir(parents=True)
    (paws / "train.tsv").write_text(
        "id\tsentence1\tsentence2\tlabel\n"
        "1\tIn Paris , in October 1560 , he met the ambassador .\tIn October 1560 , he met the ambassador in Paris ."
        "\t1\n"
        "2\tThe NBA season of 1975 -- 76 was the 30th \" season .\tThe 1975 -- 76 season was the 30th .\t0\n"
    )
    assert load_examples("scored", "paws", tmp_path) == [
        ScoredPair("In Paris , in October 1560 , he met the ambassador .",
                   "In October 1560 , he met the ambassador in Paris .", 1.0),
        ScoredPair('The NBA season of 1975 -- 76 was the 30th " season .', "The 1975 -- 76 season was the 30th .", 0.0),
    ]
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    (mrpc / "msr_paraphrase_train.txt").write_text(
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " .\t'
        'Referring to him as only " the witness " , Amrozi accused his brother .\n'
        "0\t2108705\t2108831\tYucaipa owned Dominick 's before selling it .\tYucaipa bought Dominick 's in 1995 .\n",
        encoding="utf-8",
    )
    got = load_examples("scored", "mrpc:train", tmp_path)
    assert [p.label for p in got] == [1.0, 0.0]
    assert got[0].sentence1.startswith("Amrozi") and got[0].sentence2.startswith('Referring to him as only " the')
    qqp = tmp_path / "QQP"
    qqp.mkdir()
    (qqp / "dev.tsv").write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        '201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0\n'
        '263843\t69383\t380476\t"Lost" or "Breaking Bad"?\tWhich is better, Lost or Breaking Bad?\t1\n'
    )
    got = load_examples("scored", "qqp:dev", tmp_path)
    assert got[1] == ScoredPair('"Lost" or "Breaking Bad"?', "Which is better, Lost or Breaking Bad?", 1.0)
    assert {p.label for p in got} == {0.0, 1.0}
    assert len(load_examples("unlabeled", "qqp:dev", tmp_path)) == 4
    # GLUE's QQP test.tsv has no labels: refused, not read as label-less pairs
    (qqp / "test.tsv").write_text("id\tquestion1\tquestion2\n0\tA?\tB?\n")
    with pytest.raises(ValueError, match="is_duplicate"):
        load_examples("scored", "qqp:test", tmp_path)
    (paws / "dev.tsv").write_text("id\tsentence1\tsentence2\tlabel\n3\tonly one sentence\n")
    with pytest.raises(ValueError, match="dev.tsv:2"):
        load_examples("scored", "paws:dev", tmp_path)
    with pytest.raises(ValueError, match="scored pairs"):
        load_examples("pairs", "paws", tmp_path)
