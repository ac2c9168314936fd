"""ConIsI's sentence-construction strategies for the composed pair Z_i = [x_i; c_i] (§3.2).

Each builds a sentence c_i "in a different semantic category" from x_i:

  o1  subword replacement (§3.2.1): choose a proportion of x's sub-word tokens; a chosen token is
      replaced by a random vocabulary token 80% of the time and left unchanged 20% of the time.
  o2  word replacement (§3.2.1): replace full words by a WordNet antonym, taken in the part of
      speech the word has in its sentence (training/augment/pos.py).
  s   other sentence (§3.2.2): c_i = x_k for a random k ≠ i of the same minibatch.

ℓII asks the classifier to tell [x; x] from [x; c]; a c equal to x is an unlearnable label. With
BERT's 15 % rate o1 leaves a short sentence unchanged often (all draws missed, or kept the token),
and o2 has nothing to replace in a sentence without an antonym (see ConIsI's `ensure_different`).
`subword_replace(at_least_one=True)` forces one real replacement, and ConIsI falls back to o1 for any c still
equal to x.

All randomness comes from an optional torch.Generator (tests pass a seeded one; training uses
torch's global RNG, which the DataLoader seeds differently in every worker).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

#: ConIsI says "a certain proportion" without a number; the 80%/20% rule is BERT's masked-LM
#: recipe (Devlin et al., 2019), whose masking proportion is 15%, so that is the default.
SUBWORD_PROPORTION = 0.15
#: share of chosen sub-words replaced by a random token (the rest stay unchanged), ConIsI §3.2.1
SUBWORD_RANDOM_SHARE = 0.8
#: ConIsI-o2 replaces "some full words" with antonyms, no rate given: each word that has an
#: antonym is replaced with this probability, and at least one is (see `antonym_replace`).
ANTONYM_PROBABILITY = 0.5

_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")


def subword_replace(
    input_ids: torch.Tensor,
    replaceable: torch.Tensor,
    vocab_ids: torch.Tensor,
    proportion: float = SUBWORD_PROPORTION,
    random_share: float = SUBWORD_RANDOM_SHARE,
    generator: torch.Generator | None = None,
    at_least_one: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Strategy o1 on token ids [..., T] (rows along the last dimension).

    replaceable: bool mask of the positions that hold the sentence's sub-words (never special
    tokens or padding). vocab_ids: the ids a replacement is drawn from, uniformly.
    Returns (new ids, chosen mask, replaced mask); replaced ⊆ chosen ⊆ replaceable. A replacement
    may draw the original id by chance (probability 1/|vocab|), as in BERT. With `at_least_one`, a
    row with a replaceable position whose ids came out unchanged gets one position, uniformly among
    its replaceable ones, replaced by a draw among the *other* vocabulary ids, so it always differs.
    """
    u = torch.rand(input_ids.shape, generator=generator)
    chosen = replaceable & (u < proportion)
    replaced = chosen & (torch.rand(input_ids.shape, generator=generator) < random_share)
    draws = vocab_ids[torch.randint(len(vocab_ids), input_ids.shape, generator=generator)]
    new = torch.where(replaced, draws.to(input_ids.dtype), input_ids)
    if at_least_one:
        unchanged = replaceable.any(-1) & ~((new != input_ids) & replaceable).any(-1)
        if unchanged.any():
            scores = torch.rand(input_ids.shape, generator=generator).masked_fill(~replaceable, -1.0)
            forced = torch.zeros_like(replaceable).scatter(-1, scores.argmax(-1, keepdim=True), True)
            forced &= unchanged.unsqueeze(-1)
            other = _draw_other(input_ids, vocab_ids, generator).to(input_ids.dtype)
            new = torch.where(forced, other, new)
            chosen, replaced = chosen | forced, replaced | forced
    return new, chosen, replaced


def _draw_other(ids: torch.Tensor, vocab_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """For each id, a uniform draw from vocab_ids without that id."""
    vocab = vocab_ids.sort().values
    k = torch.searchsorted(vocab, ids.to(vocab.dtype))
    present = vocab[k.clamp(max=len(vocab) - 1)] == ids
    r = (torch.rand(ids.shape, generator=generator) * (len(vocab) - present.long())).long()
    return vocab[r + (present & (r >= k)).long()]


def antonym_replace(
    text: str,
    antonyms: Callable[[list[str]], Sequence[Sequence[str]]],
    probability: float = ANTONYM_PROBABILITY,
    at_least_one: bool = True,
    generator: torch.Generator | None = None,
) -> str:
    """Strategy o2: replace words of `text` by their first antonym in context.

    antonyms(words) gives, for each word of the sentence, its antonyms in the part of speech it has
    there (`Antonyms.in_context`), best first. Every word with an antonym is replaced with
    `probability`; with `at_least_one`, a sentence where none was drawn still gets one (chosen
    uniformly), so c differs from x whenever it can. Words without antonyms, punctuation and spacing
    are kept as they are; a capitalised word gets a capitalised antonym. A sentence with no
    antonym-bearing word comes back unchanged (ConIsI then falls back to o1 for it).
    """
    found = list(_WORD.finditer(text))
    options = antonyms([m.group() for m in found])
    matches = [(m, opts[0]) for m, opts in zip(found, options) if opts]
    if not matches:
        return text
    pick = torch.rand(len(matches), generator=generator) < probability
    if at_least_one and not pick.any():
        pick[torch.randint(len(matches), (1,), generator=generator)] = True
    out, last = [], 0
    for (m, new), take in zip(matches, pick.tolist()):
        if not take:
            continue
        if m.group()[:1].isupper():
            new = new[:1].upper() + new[1:]
        out += [text[last : m.start()], new]
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def other_indices(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Strategy s: for each i a uniformly random k ∈ [0, n) with k ≠ i (needs n ≥ 2)."""
    if n < 2:
        raise ValueError("strategy 's' needs at least two sentences in a batch")
    shift = torch.randint(1, n, (n,), generator=generator)  # 1..n-1, so never i itself
    return (torch.arange(n) + shift) % n
