# Softmax over every key, 4 heads (the 1-head anchor is mha.py).
include("../mha.py")
include("study.py")
out_dir = "out-recall-mha4"
