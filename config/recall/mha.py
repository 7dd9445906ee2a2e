# Softmax attention keeps every key: the recall study's anchor.
include("../mha.py")
include("base.py")
out_dir = "out-recall-mha"
