"""Experiments on the mechanism itself, outside the training pipeline: ``credit_sim`` (a tabular
model of sequential tool decisions, trained with the suite's own branching and credit)."""
