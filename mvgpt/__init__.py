"""mvGPT: a minimum viable GPT, built from scratch in PyTorch, one episode at a time."""
