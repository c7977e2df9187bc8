#!/usr/bin/python3
"""A GGUF of one of kvrt's benchmark shapes, for running llama.cpp beside e2e_bench.

usage: PYTHONPATH=LLAMA_CPP/gguf-py /usr/bin/python3 scripts/gguf_preset.py SHAPE OUT.gguf
  SHAPE  synth-76m           768 hidden, 12 layers, 12 heads over 4 KV heads of 64, 2048
                             intermediate, a 512-piece vocabulary (unk, bos, eos, the 256 bytes,
                             then plain pieces), tied embeddings, rope theta 10000
         llama-3.2-1b-shape  Llama-3.2-1B's shape and Llama-3's tokenizer (from
                             ../shared/tokenizers/llama-3.1), its llama3 rope scaling

Weights: seeded normal values of standard deviation 0.02, norms 1, in bf16 -- the distribution
kvrt's presets draw (not the same values: the speed, not the tokens, is compared). Quantize with
llama.cpp's own tool (`llama-quantize OUT.gguf OUT-Q4_0.gguf Q4_0`). gguf-py (and numpy) come
from a llama.cpp checkout (`fetch`), not from this repository. docs/performance.md has the runs.
"""
import json
import math
import sys
import zlib
from pathlib import Path

import gguf
import numpy as np

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, rope theta
    "synth-76m": (768, 12, 12, 4, 64, 2048, 512, 10000.0),
    "llama-3.2-1b-shape": (2048, 16, 32, 8, 64, 8192, 128256, 500000.0),
}
SEED = 1234


def spm_vocab(w, n_vocab):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    while len(tokens) < n_vocab:
        tokens.append("\u2581t%d" % len(tokens))
        types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def llama3_vocab(w, n_vocab):
    # As convert_hf_to_gguf.py's Llama-3 path: gpt2-style BPE, added tokens as control.
    tokdir = Path(__file__).resolve().parent.parent.parent / "shared/tokenizers/llama-3.1"
    tj = json.load(open(tokdir / "tokenizer.json", encoding="utf-8"))
    reverse = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {t["content"] for t in tj["added_tokens"]}
    for t in tj["added_tokens"]:
        reverse[t["id"]] = t["content"]
    tokens, types = [], []
    for i in range(n_vocab):
        tok = reverse.get(i, "[PAD%d]" % i)
        tokens.append(tok)
        types.append(gguf.TokenType.UNUSED if i not in reverse else
                     gguf.TokenType.CONTROL if tok in added else gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(tokdir, load_merges=True, n_vocab=n_vocab)
    special.special_token_ids["bos"] = 128000
    special.special_token_ids["eos"] = 128001
    special.add_to_gguf(w)


def llama3_rope_factors(theta, head_dim):
    # Llama-3.2's rope_scaling (llama3, factor 32, low 1, high 4, original context 8192).
    factor, low, high, old = 32.0, 1.0, 4.0, 8192
    out = []
    for f in 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelength = 2 * math.pi / f
        if wavelength < old / high:
            out.append(1)
        elif wavelength > old / low:
            out.append(factor)
        else:
            s = (old / wavelength - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def main():
    shape, out = sys.argv[1], sys.argv[2]
    hidden, layers, heads, kv_heads, head_dim, ff, vocab, theta = SHAPES[shape]
    w = gguf.GGUFWriter(out, "llama")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("%s, seeded weights (seed %d)" % (shape, SEED))
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    (llama3_vocab if shape == "llama-3.2-1b-shape" else spm_vocab)(w, vocab)

    specs = [("token_embd.weight", (vocab, hidden), "w")]  # tied: no output.weight
    for b in range(layers):
        p = "blk.%d." % b
        specs += [(p + "attn_norm.weight", (hidden,), "one"),
                  (p + "attn_q.weight", (heads * head_dim, hidden), "w"),
                  (p + "attn_k.weight", (kv_heads * head_dim, hidden), "w"),
                  (p + "attn_v.weight", (kv_heads * head_dim, hidden), "w"),
                  (p + "attn_output.weight", (hidden, heads * head_dim), "w"),
                  (p + "ffn_norm.weight", (hidden,), "one"),
                  (p + "ffn_gate.weight", (ff, hidden), "w"),
                  (p + "ffn_up.weight", (ff, hidden), "w"),
                  (p + "ffn_down.weight", (hidden, ff), "w")]
    specs.append(("output_norm.weight", (hidden,), "one"))
    if shape == "llama-3.2-1b-shape":
        specs.append(("rope_freqs.weight", (head_dim // 2,), "rope"))

    def values(name, dims, how):
        if how == "one":
            return np.ones(dims, dtype=np.float32)
        if how == "rope":
            return llama3_rope_factors(theta, head_dim)
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
        a = rng.standard_normal(dims, dtype=np.float32) * 0.02
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.BF16)

    for name, dims, how in specs:
        if how == "w":  # bf16 as raw bytes: the last dimension counts bytes
            w.add_tensor_info(name, list(dims[:-1]) + [dims[-1] * 2], np.dtype(np.uint8),
                              int(np.prod(dims)) * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor_info(name, list(dims), np.dtype(np.float32), int(np.prod(dims)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims, how in specs:
        w.write_tensor_data(values(name, dims, how))
    w.close()
    print("wrote", out)


if __name__ == "__main__":
    main()
