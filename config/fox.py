# The Forgetting Transformer (attention/fox.py; Lin et al. 2025): softmax attention whose scores add
# sum_{l=j+1..i} log f_l, a forget gate f_t = sigmoid(x_t w_f + b_f) per head, ALiBi with a slope learned
# per token. No position encoding, as the paper trains it: the gate alone orders the tokens.
include("base_shakespeare_char.py")
out_dir = "out-fox"
attention = "fox"
pos_encoding = "none"
