"""tensorrt_llm/_utils.py ``pad_vocab_size``: round the vocabulary up to a multiple of tp."""


def pad_vocab_size(vocab_size, tp_size):
    return -(-int(vocab_size) // int(tp_size)) * int(tp_size)
