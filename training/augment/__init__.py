"""Sentence-construction strategies for ConIsI's composed pairs (construct.py) and the offline
WordNet antonym table they use (wordnet.py)."""
