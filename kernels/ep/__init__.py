"""Intranode MoE expert-parallel dispatch / combine over PyTorch symmetric memory (Triton), its PyTorch
reference (all_to_all_single), and the multi-GPU verify sweep."""
