"""ConIsI's sentence-construction strategies for the composed pair Z_i = [x_i; c_i] (§3.2).

Each builds a sentence c_i "in a different semantic category" from x_i:

  o1  subword replacement (§3.2.1): choose a proportion of x's sub-word tokens; a chosen token is
      replaced by a random vocabulary token 80% of the time and left unchanged 20% of the time.
  o2  word replacement (§3.2.1): replace full words by a WordNet antonym.
  s   other sentence (§3.2.2): c_i = x_k for a random k ≠ i of the same minibatch.

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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Strategy o1 on token ids of any shape.

    replaceable: bool mask of the positions that hold the sentence's sub-words (never special
    tokens or padding). vocab_ids: the ids a replacement is drawn from, uniformly.
    Returns (new ids, chosen mask, replaced mask); replaced ⊆ chosen ⊆ replaceable. A replacement
    may draw the original id by chance (probability 1/|vocab|), as in BERT.
    """
    u = torch.rand(input_ids.shape, generator=generator)
    chosen = replaceable & (u < proportion)
    replaced = chosen & (torch.rand(input_ids.shape, generator=generator) < random_share)
    draws = vocab_ids[torch.randint(len(vocab_ids), input_ids.shape, generator=generator)]
    return torch.where(replaced, draws.to(input_ids.dtype), input_ids), chosen, replaced


def antonym_replace(
    text: str,
    antonyms: Callable[[str], Sequence[str]],
    probability: float = ANTONYM_PROBABILITY,
    at_least_one: bool = True,
    generator: torch.Generator | None = None,
) -> str:
    """Strategy o2: replace words of `text` by their first antonym (`antonyms(word)[0]`).

    Every word with an antonym is replaced with `probability`; with `at_least_one`, a sentence
    where none was drawn still gets one (chosen uniformly), so c differs from x whenever it can.
    Words without antonyms, punctuation and spacing are kept as they are; a capitalised word gets a
    capitalised antonym. Sentences with no antonym-bearing word come back unchanged (the pair is then
    Y itself labelled "different": the same thing o1 does when all its draws keep the token).
    """
    matches = [m for m in _WORD.finditer(text) if antonyms(m.group())]
    if not matches:
        return text
    pick = torch.rand(len(matches), generator=generator) < probability
    if at_least_one and not pick.any():
        pick[torch.randint(len(matches), (1,), generator=generator)] = True
    out, last = [], 0
    for m, take in zip(matches, pick.tolist()):
        if not take:
            continue
        word, new = m.group(), antonyms(m.group())[0]
        if word[:1].isupper():
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
