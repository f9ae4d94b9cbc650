"""Reading past the training context (docs/context-extension.md): scaled rotary angles, caches with sinks,
dynamic NTK, and the flags that choose them."""
