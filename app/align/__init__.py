"""Aligning a draft to its target: the target's own outputs as training data, a distillation loss,
the result saved as a new draft beside the original (reversible). Runs on PyTorch; its output
(safetensors) drafts on either backend. Qt-free."""
