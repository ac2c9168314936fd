"""The layer training, evaluation and benchmarks share: the torch sentence encoder and the embedded default
model, the dataset readers, and the measures both model selection and the evaluation harness report (STS
Spearman, exact retrieval and its metrics). It imports none of our other packages (pyproject.toml's import
contracts); mypy checks it (tests/test_types.py).
"""
