"""What "correct" means, the same for training's reward (cbpo/reward.py) and for evaluation: the
answer extracted from the model's own text, scored by the metric its benchmark asks for. The
lowest floor of ``eval``: it imports nothing of the evaluation loop or publishing."""
