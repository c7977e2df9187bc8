#!/usr/bin/python3
"""A Kimi-K2.5-shaped checkpoint directory with no weights in it, for `kvrt capacity`.

Writes OUT/config.json (KimiK25ForConditionalGeneration with the language model in text_config,
its published shape: 61 layers, hidden 7168, 384 routed experts of 2048 and one shared, MLA 512 +
64, vocabulary 163,840, YaRN x64; the routed experts in compressed-tensors pack-quantized int4,
groups of 32, bf16 scales; bf16 elsewhere, per the published `ignore` list) and the safetensors
shards its index names, with every tensor's name, dtype and shape as Moonshot publishes them
(under "language_model.", the vision tower beside it) but sparse data: each file's header is
real and its data section a hole, so ~595 GB of checkpoint takes a few MB of disk. kvrt counts
the weights from the headers (docs/models.md), which is all this directory is for: loading it
would read zeros.

Run: /usr/bin/python3 scripts/kimi_k25_shape.py /tmp/kimi-k25-shape
then: ./build/bin/kvrt capacity --model /tmp/kimi-k25-shape --tp 8 --gpu-memory 96GB
"""

import json
import os
import struct
import sys

TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
    "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
    "bos_token_id": 163584, "eos_token_id": 163585, "tie_word_embeddings": False,
    "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "attention_bias": False, "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"type": "int", "num_bits": 4, "group_size": 32, "strategy": "group",
                        "symmetric": True, "dynamic": False, "observer": "minmax"}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                   "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*vision_tower.*",
                   "re:.*mm_projector.*"]},
}
CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
          "torch_dtype": "bfloat16", "tie_word_embeddings": False, "text_config": TEXT}
SIZE = {"BF16": 2, "F32": 4, "I32": 4}


def tensors():
    """(name, dtype, shape) of every tensor, in the published layout."""
    t = TEXT
    H, V, L, Lq = t["hidden_size"], t["vocab_size"], t["kv_lora_rank"], t["q_lora_rank"]
    n, N, R, Vh = t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    E, Ie, I = t["n_routed_experts"], t["moe_intermediate_size"], t["intermediate_size"]
    lm = "language_model."
    yield lm + "model.embed_tokens.weight", "BF16", [V, H]
    yield lm + "model.norm.weight", "BF16", [H]
    yield lm + "lm_head.weight", "BF16", [V, H]
    for i in range(t["num_hidden_layers"]):
        p = lm + "model.layers.%d." % i
        a = p + "self_attn."
        yield p + "input_layernorm.weight", "BF16", [H]
        yield p + "post_attention_layernorm.weight", "BF16", [H]
        yield a + "q_a_proj.weight", "BF16", [Lq, H]
        yield a + "q_a_layernorm.weight", "BF16", [Lq]
        yield a + "q_b_proj.weight", "BF16", [n * (N + R), Lq]
        yield a + "kv_a_proj_with_mqa.weight", "BF16", [L + R, H]
        yield a + "kv_a_layernorm.weight", "BF16", [L]
        yield a + "kv_b_proj.weight", "BF16", [n * (N + Vh), L]
        yield a + "o_proj.weight", "BF16", [H, n * Vh]
        if i < t["first_k_dense_replace"]:
            for proj, shape in (("gate", [I, H]), ("up", [I, H]), ("down", [H, I])):
                yield p + "mlp.%s_proj.weight" % proj, "BF16", shape
            continue
        yield p + "mlp.gate.weight", "BF16", [E, H]
        yield p + "mlp.gate.e_score_correction_bias", "F32", [E]
        for proj, shape in (("gate", [Ie, H]), ("up", [Ie, H]), ("down", [H, Ie])):
            yield p + "mlp.shared_experts.%s_proj.weight" % proj, "BF16", shape
        for e in range(E):
            for proj, (rows, cols) in (("gate", (Ie, H)), ("up", (Ie, H)), ("down", (H, Ie))):
                m = p + "mlp.experts.%d.%s_proj." % (e, proj)
                yield m + "weight_packed", "I32", [rows, cols // 8]
                yield m + "weight_scale", "BF16", [rows, cols // 32]
                yield m + "weight_shape", "I32", [2]
    # MoonViT beside it (about 0.4 B parameters), which kvrt does not load.
    W, F = 1152, 4304
    for b in range(27):
        v = "vision_tower.encoder.blocks.%d." % b
        for name, shape in (("wqkv.weight", [3 * W, W]), ("wo.weight", [W, W]),
                            ("mlp.fc0.weight", [F, W]), ("mlp.fc1.weight", [W, F])):
            yield v + name, "BF16", shape
    yield "mm_projector.proj.0.weight", "BF16", [4 * W, 4 * W]
    yield "mm_projector.proj.2.weight", "BF16", [H, 4 * W]


def write_shard(path, entries):
    header, offset = {}, 0
    for name, dtype, shape in entries:
        count = 1
        for d in shape:
            count *= d
        size = count * SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)  # a hole: no data is written
    return offset


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: kimi_k25_shape.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    everything = list(tensors())
    shards, per = 64, (len(everything) + 63) // 64
    weight_map, total = {}, 0
    for s in range(shards):
        part = everything[s * per:(s + 1) * per]
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        total += write_shard(os.path.join(out, name), part)
        weight_map.update({t[0]: name for t in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    print("%s: %d tensors, %.1f GB (%.1f GiB) of weights, as sparse files" %
          (out, len(everything), total / 1e9, total / 2**30))


if __name__ == "__main__":
    main()
