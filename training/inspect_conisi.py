"""What ConIsI's sentence construction makes of your text, before you train on it (issue 23).

    python -m training.inspect_conisi --text data/domain/verb-contact/text --strategy s o1 o2

For each strategy it collates the text in training batches (ConIsI.collate, the exact pairs the
loss sees), prints a sample of x, its positive pair Y = [x; x] and its composed pair Z = [x; c] as
the tokenizer decodes them, and measures how hard ℓII (Eq. 8) is before any training:
- `halves equal`: the rule "Y's halves are the same tokens, Z's are not" (no model at all);
- `BoW logistic`: logistic regressions on bags of words, 5-fold cross-validated: on the pair read as
  one bag (`bow_pair`), and on the difference of its two halves' bags (`bow_halves_diff`), the
  weakest model that compares the two sentences word by word;
- the share of c's tokens that occur in the domain text anywhere else (in-domain-ness), and the
  share of c's words that are dictionary words (WordNet lemmas or stop words: grammaticality proxy).
A task that these separate at accuracy ≈ 1.0 teaches the encoder nothing it did not know.

With --gradients it also compares, on a few training batches of the base model, the encoder
gradients of ConIsI's terms: ℓI with the pair positive Y (Eq. 3), ℓII (Eq. 8) and, for reference,
ℓI with SimCSE's positive (x again, another dropout mask): their norms and cosines, and the cosine of
Eq. 10's weighted sum with SimCSE's gradient (Adam follows the direction, whatever the scale).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from core.data import load_examples
from core.default_model import resolve_model
from core.encoder import SentenceEncoder


def _halves(tok, ids: list[int]) -> tuple[list[int], list[int]]:
    special = set(tok.all_special_ids)
    sep = tok.sep_token_id
    first = ids.index(sep)
    a = [t for t in ids[:first] if t not in special]
    b = [t for t in ids[first + 1:] if t not in special]
    return a, b


def inspect(encoder: SentenceEncoder, texts: list[str], strategy: str, batch_size: int = 64, show: int = 8,
            seed: int = 0) -> dict[str, float]:
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    from training.objectives.conisi import ConIsI, ConIsISettings

    objective = ConIsI(encoder, ConIsISettings(strategy=strategy, pooling=None))
    tok = encoder.tokenizer
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(texts), generator=gen).tolist()
    pairs_text, halves, labels, equal_rule, in_domain, words_ok = [], [], [], [], [], []
    vocab = {t for text in texts for t in tok(text, add_special_tokens=False)["input_ids"]}
    lemmas = _dictionary()
    shown = 0
    for start in range(0, len(order), batch_size):
        batch = [texts[i] for i in order[start:start + batch_size]]
        ids = objective.collate(batch, gen)["pairs"]["input_ids"]
        n = len(batch)
        for i in range(n):
            y = [t for t in ids[i].tolist() if t != tok.pad_token_id]
            z = [t for t in ids[n + i].tolist() if t != tok.pad_token_id]
            (ya, yb), (za, zb) = _halves(tok, y), _halves(tok, z)
            equal_rule += [ya == yb, za != zb]
            pairs_text += [" ".join(map(str, ya + yb)), " ".join(map(str, za + zb))]
            halves += [(ya, yb), (za, zb)]
            labels += [1, 0]
            changed = zb if strategy == "s" else [t for t, o in zip(zb, za) if t != o]
            in_domain += [t in vocab for t in changed]
            words = tok.decode(zb).split()
            words_ok += [w.strip(".,;:()'\"").lower() in lemmas for w in words]
            if shown < show:
                print(f"  x : {tok.decode(ya)}\n  Y : {tok.decode(y[1:-1])}\n  Z : {tok.decode(z[1:-1])}\n")
                shown += 1
    vec = CountVectorizer(token_pattern=r"\S+").fit(pairs_text)
    bow = cross_val_score(LogisticRegression(max_iter=2000), vec.transform(pairs_text), labels, cv=5).mean()
    diff = abs(vec.transform([" ".join(map(str, a)) for a, _ in halves])
               - vec.transform([" ".join(map(str, b)) for _, b in halves]))
    bow_diff = cross_val_score(LogisticRegression(max_iter=2000), diff, labels, cv=5).mean()
    return {
        "pairs": len(labels),
        "halves_equal_rule_acc": sum(equal_rule) / len(equal_rule),
        "bow_pair_acc": float(bow),
        "bow_halves_diff_acc": float(bow_diff),
        "c_tokens_in_domain": sum(in_domain) / max(1, len(in_domain)),
        "c_words_in_dictionary": sum(words_ok) / max(1, len(words_ok)),
    }


def gradients(encoder: SentenceEncoder, texts: list[str], batches: int = 3, batch_size: int = 64,
              lam: float = 0.8, seed: int = 0) -> dict[str, float]:
    """Mean over `batches` of the gradient norms and cosines described in the module docstring."""
    from training.objectives.conisi import ConIsI, ConIsISettings

    pair = ConIsI(encoder, ConIsISettings(pooling=None, interactive_weight=lam))
    params = [p for p in encoder.parameters() if p.requires_grad]

    def grad(loss: torch.Tensor) -> torch.Tensor:
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True)])

    cos = torch.nn.functional.cosine_similarity
    rows = []
    gen = torch.Generator().manual_seed(seed)
    pair.train()
    for b in range(batches):
        batch = pair.collate(texts[b * batch_size:(b + 1) * batch_size], gen)
        torch.manual_seed(seed + b)
        h_x2 = encoder(**{k: torch.cat([v, v]) for k, v in batch["single"].items()})
        h_x, h_plus = h_x2.chunk(2)
        h_y, h_z = encoder(**batch["pairs"]).chunk(2)
        contrastive, interactive, margin = pair.terms(h_x, h_y, h_z)
        g_pair, g_inter = grad(contrastive), grad(interactive)
        g_simcse = grad(pair.terms(h_x, h_y, h_z, positive=h_plus)[0])
        total = (1 - lam) * g_pair + lam * g_inter
        rows.append({
            "norm_pair_positive": g_pair.norm().item(), "norm_interactive": g_inter.norm().item(),
            "norm_simcse_positive": g_simcse.norm().item(),
            "cos_pair_vs_simcse": cos(g_pair, g_simcse, 0).item(),
            "cos_interactive_vs_simcse": cos(g_inter, g_simcse, 0).item(),
            "cos_eq10_vs_simcse": cos(total, g_simcse, 0).item(),
            "interactive_acc": (margin > 0).float().mean().item(),
        })
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def _dictionary() -> set[str]:
    from training.augment.wordnet import DEFAULT_WORDNET_DIR

    words = {"a", "an", "the", "of", "to", "in", "on", "with", "by", "for", "from", "or", "and", "as", "at", "into",
             "something", "someone", "one", "be", "is", "that", "it", "its", "so", "up", "out", "off", "down"}
    for pos in ("noun", "verb", "adj", "adv"):
        path = Path(DEFAULT_WORDNET_DIR) / f"index.{pos}"
        if path.is_file():
            with open(path, encoding="utf-8", errors="replace") as f:
                words.update(line.split(" ", 1)[0].replace("_", " ") for line in f if not line.startswith(" "))
    return words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", required=True, help="a text file or folder of *.txt (core.data text: source)")
    parser.add_argument("--base", default="default")
    parser.add_argument("--strategy", nargs="+", default=["s", "o1", "o2"])
    parser.add_argument("--show", type=int, default=6)
    parser.add_argument("--gradients", action="store_true", help="also compare the loss terms' gradients")
    args = parser.parse_args(argv)
    texts = list(load_examples("unlabeled", f"text:{args.text}"))
    random.Random(0).shuffle(texts)
    encoder = SentenceEncoder.from_pretrained(resolve_model(args.base))
    for strategy in args.strategy:
        print(f"== strategy {strategy}")
        stats = inspect(encoder, texts, strategy, show=args.show)
        print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()))
        if args.gradients:
            stats = gradients(encoder, texts)
            print("  gradients: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
