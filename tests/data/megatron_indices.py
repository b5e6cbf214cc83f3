#!/usr/bin/python3
"""Megatron-LM v1.1.5's GPT index building (megatron/data/gpt2_dataset.py),
written from its description with NumPy's legacy RandomState, as the oracle
of data/megatron_data.h (data_megatron_test).

usage: megatron_indices.py SIZES_FILE FIRST END NUM_SAMPLES SEQ_LEN SEED
  SIZES_FILE  one sequence length a line (the .idx's sizes)
  FIRST, END  the split part's sequences [FIRST, END)
Prints three lines of space-separated integers: the doc index, the sample
index (pairs flattened) and the shuffle index.
"""
import sys

import numpy as np


def main():
    sizes = np.array([int(x) for x in open(sys.argv[1]).read().split()], dtype=np.int64)
    first, end, num_samples, seq_len, seed = (int(a) for a in sys.argv[2:7])
    documents = np.arange(first, end, dtype=np.int32)
    tokens_per_epoch = int(sizes[documents].sum())
    # Epochs until (epochs x tokens - 1) // seq_len covers num_samples.
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_len >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    doc_idx = np.tile(documents, epochs).astype(np.int32)
    rng.shuffle(doc_idx)
    samples = (epochs * tokens_per_epoch - 1) // seq_len
    sample_idx = np.zeros((samples + 1, 2), dtype=np.int64)
    pos, offset = 0, 0
    for i in range(1, samples + 1):
        remaining = seq_len + 1
        while remaining != 0:
            length = int(sizes[doc_idx[pos]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                pos += 1
                offset = 0
        sample_idx[i] = (pos, offset)
    shuffle_idx = np.arange(samples, dtype=np.uint32)
    rng.shuffle(shuffle_idx)
    for row in (doc_idx, sample_idx.reshape(-1), shuffle_idx):
        print(" ".join(str(int(x)) for x in row))


if __name__ == "__main__":
    main()
