# The RoPE base study (docs/rope.md): config/mha.py at rope_base = 100000.
include("../mha.py")
rope_base = 100000.0
