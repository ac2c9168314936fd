"""A light part-of-speech guess for ConIsI-o2's antonym replacement (§3.2.1).

WordNet's antonymy links words of one part of speech: "close" the verb ↔ "open", "close" the
adjective ↔ "distant". The antonym must be taken in the part of speech the word has in its
sentence. No trained tagger installs offline (NLTK's needs a data download that is not on PyPI),
so this is a rule over WordNet's own lexicon (training/augment/wordnet.py `load_lexicon`):

- Candidates: the parts of speech WordNet lists for the word; for an inflected form, those of the
  exception lists or of the base left by stripping -s/-es/-ies/-ed/-ing/-er/-est. Closed-class
  words (determiners, pronouns, prepositions, conjunctions, auxiliaries) have none.
- One candidate: that one. Otherwise the first rule that fits the neighbours (a preceding "not",
  "never", ... is skipped): an -ly word that can be an adverb → adverb; after a modal or "do" →
  verb; after "to" and before a determiner or pronoun → verb; after a subject pronoun → verb; after
  "be", a linking verb or an intensifier → adjective; after a determiner, an adjective or a
  preposition → adjective if a possible noun follows, else noun; before a possible noun →
  adjective; after a noun and before a determiner, pronoun, preposition, -ly word or the end →
  verb; first word (imperatives, WordNet glosses) before the same → verb.
- Else the part of speech whose senses WordNet's semantic concordance tagged most often
  (tagsense_cnt), then the one with most senses.

A preposition that can be a particle (up, down, off, out, ...) is a content word only with no noun
phrase after it (last word, or before a conjunction): an adjective after "be", else an adverb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

NOUN, VERB, ADJ, ADV = "noun", "verb", "adj", "adv"

DETERMINERS = frozenset(
    "a an the this that these those my your his her its our their whose each every either neither another "
    "no some any all both".split()
)
SUBJECT_PRONOUNS = frozenset("i you he she we they".split())
PRONOUNS = SUBJECT_PRONOUNS | frozenset(
    "it me him us them myself yourself himself herself itself ourselves yourselves themselves who whom what "
    "which someone something somebody anyone anything anybody everyone everything everybody nobody nothing "
    "none".split()
)
PREPOSITIONS = frozenset(
    "of in on at by for with from to into onto about above below over under between among through throughout "
    "during before after against without within along across behind beyond toward towards upon off out up "
    "down near around since until via per than as like".split()
)
CONJUNCTIONS = frozenset("and or but nor yet if because although though while whereas whether".split())
BE = frozenset("be is are was were been being am".split())
#: followed by a verb's base form
MODALS = frozenset("will would can could shall should may might must do does did".split())
LINKING = BE | frozenset(
    "seem seems seemed become becomes became remain remains remained stay stays stayed look looks looked "
    "feel feels felt sound sounds sounded appear appears appeared grow grows grew get gets got".split()
)
INTENSIFIERS = frozenset("very too so quite rather extremely really fairly somewhat highly".split())
#: looked past when reading the previous word ("is not good", "will never close")
SKIPPED = frozenset("not never also always often still just".split())
FUNCTION_WORDS = (
    DETERMINERS | PRONOUNS | PREPOSITIONS | CONJUNCTIONS | BE | MODALS | SKIPPED
    | frozenset("have has had having there here so".split())
)
# what may follow a verb that is not a noun ("that", "which", "who" after a noun start a relative clause)
_CLAUSE_NEXT = (DETERMINERS | PRONOUNS | PREPOSITIONS) - {"that", "which", "who", "whom"}
_SUFFIXES = (
    ("ies", "y", (NOUN, VERB)),
    ("es", "", (NOUN, VERB)),
    ("s", "", (NOUN, VERB)),
    ("ed", "", (VERB,)),
    ("ed", "e", (VERB,)),
    ("ing", "", (VERB,)),
    ("ing", "e", (VERB,)),
    ("er", "", (ADJ,)),
    ("est", "", (ADJ,)),
)

Lexicon = Mapping[str, Mapping[str, tuple[int, int]]]


def candidates(word: str, lexicon: Lexicon) -> dict[str, tuple[int, int]]:
    """The parts of speech `word` (lower case) can have, each with WordNet's (tagsense_cnt, synset_cnt)."""
    if word in FUNCTION_WORDS:
        return {}
    found = dict(lexicon.get(word, {}))
    for suffix, repl, parts in _SUFFIXES:
        if word.endswith(suffix) and len(word) > len(suffix) + 1:
            base = lexicon.get(word[: -len(suffix)] + repl, {})
            for pos in parts:
                if pos in base:
                    found.setdefault(pos, base[pos])
    return found


def guess_pos(words: Sequence[str], lexicon: Lexicon) -> list[str | None]:
    """One of "noun", "verb", "adj", "adv" per word of a sentence, or None (closed class / unknown)."""
    low = [w.lower() for w in words]
    cands = [candidates(w, lexicon) for w in low]
    tags: list[str | None] = []
    for i, word in enumerate(low):
        j = i - 1
        while j >= 0 and low[j] in SKIPPED:
            j -= 1
        prev, prev_tag = (low[j], tags[j]) if j >= 0 else (None, None)
        nxt = low[i + 1] if i + 1 < len(low) else None
        if word in PREPOSITIONS:
            tags.append(_particle(lexicon.get(word, {}), prev, nxt))
        else:
            tags.append(_choose(word, cands[i], i, prev, prev_tag, nxt, cands[i + 1] if nxt else {}))
    return tags


def _particle(parts: Mapping[str, tuple[int, int]], prev: str | None, nxt: str | None) -> str | None:
    if nxt is not None and nxt not in CONJUNCTIONS:
        return None  # a noun phrase follows: a preposition
    if prev in LINKING and ADJ in parts:
        return ADJ
    return ADV if ADV in parts else None


def _choose(word, c, i, prev, prev_tag, nxt, next_c) -> str | None:
    if len(c) <= 1:
        return next(iter(c), None)
    noun_next = nxt is not None and NOUN in next_c
    clause_next = nxt is None or nxt in _CLAUSE_NEXT or nxt.endswith("ly")
    if word.endswith("ly") and ADV in c:
        return ADV
    if VERB in c and (
        prev in MODALS
        or (prev == "to" and nxt in DETERMINERS | PRONOUNS)
        or prev in SUBJECT_PRONOUNS
        or (prev_tag == NOUN and clause_next)
        or (i == 0 and clause_next)
    ):
        return VERB
    if (prev in LINKING or prev in INTENSIFIERS) and ADJ in c:
        return ADJ
    if prev in DETERMINERS or prev in PREPOSITIONS or prev_tag == ADJ:
        if ADJ in c and noun_next:
            return ADJ
        if NOUN in c:
            return NOUN
    if ADJ in c and noun_next:
        return ADJ
    return max(c, key=lambda p: c[p])
