"""The recipe's in-domain set (evaluation/build_domain.py) and a folder of the user's text as training data."""

from pathlib import Path

import pytest

from core import beir
from core.data import load_examples
from evaluation.build_domain import main, read_synsets

WORDNET = Path("/usr/share/wordnet")


@pytest.fixture(scope="module")
def domain(tmp_path_factory):
    if not (WORDNET / "data.verb").is_file():
        pytest.skip("WordNet (wordnet-base) is not installed")
    out = tmp_path_factory.mktemp("domain") / "verb-contact"
    assert main(["--lexfiles", "verb.contact", "--dev", "20", "--test", "30", "--out", str(out)]) == 0
    return out


def test_the_set_asks_for_a_synsets_definition_from_its_usage_example(domain):
    synsets = {sid: (words, definition, examples) for sid, words, definition, examples
               in read_synsets(WORDNET, ["verb.contact"])}
    dev, test = beir.load(domain, "dev"), beir.load(domain, "test")
    assert len(dev.queries) == 20 and len(test.queries) == 30
    assert set(dev.corpus) == set(test.corpus) == set(synsets)
    assert not {d for q in dev.qrels.values() for d in q} & {d for q in test.qrels.values() for d in q}
    for qid, judged in test.qrels.items():
        (sid, grade), = judged.items()
        words, definition, examples = synsets[sid]
        assert grade == 1 and test.queries[qid] == examples[0]
        assert test.corpus[sid] == {"title": " ".join(words), "text": definition}
        assert '"' not in definition and examples[0] not in definition  # the example is never in the document
    # "strike" alone has many senses in the domain: the task is telling them apart
    assert sum("strike" in doc["title"].split() for doc in test.corpus.values()) >= 5


def test_the_users_text_folder_is_the_documents_without_their_examples(domain):
    lines = load_examples("unlabeled", f"text:{domain / 'text'}")
    corpus = beir.load(domain, "test").corpus
    assert lines == [beir.BeirSet.document_text(doc) for doc in corpus.values()]
    queries = set(beir.load(domain, "dev").queries.values())
    assert not any(q in line for q in queries for line in lines)


def test_a_text_folder_reads_every_txt_file_in_order(tmp_path):
    folder = tmp_path / "my-notes"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("first line\n\nsecond line\n")
    (folder / "b" / "c.txt").write_text("third line\n")
    (folder / "readme.md").write_text("not text data\n")
    assert load_examples("unlabeled", f"text:{folder}") == ["first line", "second line", "third line"]
    assert load_examples("unlabeled", "text:my-notes", data_dir=tmp_path, limit=2) == ["first line", "second line"]


def test_the_supervised_twin_holds_only_synsets_outside_dev_and_test(domain):
    from core.data import PairExample

    pairs = load_examples("pairs", f"nli-csv:{domain / 'pairs' / 'train.csv'}")
    assert pairs and all(isinstance(p, PairExample) and p.negative for p in pairs)
    synsets = read_synsets(WORDNET, ["verb.contact"])
    held = {sid for split in ("dev", "test") for q in beir.load(domain, split).qrels.values() for sid in q}
    corpus = beir.load(domain, "test").corpus
    doc = {sid: beir.BeirSet.document_text(corpus[sid]) for sid in corpus}
    by_doc = {text: sid for sid, text in doc.items()}
    examples: dict[str, set[str]] = {}  # WordNet repeats a few usage examples under several synsets
    for sid, _, _, exs in synsets:
        for ex in exs:
            examples.setdefault(ex, set()).add(sid)
    words = {sid: {w.lower() for w in ws} for sid, ws, _, _ in synsets}
    for p in pairs:
        positive, negative = by_doc[p.positive], by_doc[p.negative]
        assert positive in examples[p.anchor]  # the example's own sense
        assert not {positive, negative} & held and positive != negative
        assert words[positive] & words[negative]  # another sense of a shared headword
    queries = set(beir.load(domain, "dev").queries.values()) | set(beir.load(domain, "test").queries.values())
    assert not queries & {p.anchor for p in pairs}
