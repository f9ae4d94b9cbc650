"""Export (docs/export.md): to Hugging Face transformers (hf.py) and to llama.cpp's GGUF (gguf.py)."""
