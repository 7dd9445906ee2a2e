# Zoology's MQAR model (Arora et al. 2023; HazyResearch/zoology's MQAR configs), included by every
# config here after the variant's recall config (config/recall/<v>.py: the data, the recipe, the
# variant's own keys); each then names its plan (attention="conv,<v>"):
#   layer 0 a BaseConv (attention/conv.py: a gated depthwise causal convolution of 3 taps),
#   layer 1 the mixer under test (a hybrid: one layer each), no MLP (Zoology's state mixer is an
#   Identity); LayerNorm and projections with biases; learned positions (Zoology's token and position
#   embeddings) where the mixer takes them, else none (the linear family and the delta rule refuse
#   learned positions, which cannot decode past block_size).
# Where it differs from Zoology: its embedding dropout of 0.1 is 0 here (the recall recipe has no
# dropout), and its Identity state mixer still adds a LayerNorm of the residual to the stream.
attention = "conv,mha"
n_layer = 2
mlp = False
conv_taps = 3
bias = True
pos_encoding = "learned"
out_dir = "out-zoology"
