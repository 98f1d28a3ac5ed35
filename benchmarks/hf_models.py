"""Third-party models through ``from_torch``: Hugging Face transformers architectures built from small configs.

Not a test and not a dependency: it needs ``transformers`` (and torch and
jax), which the project does not install.  Each model is built from its
config with random initialisation (nothing is downloaded): 2 layers, hidden
size 32 to 64, a vocabulary of 96, 32x32 images, 400 samples of audio, 32
steps of a 3-channel series.  It is put in train mode
(dropout and BatchNorm batch statistics on), called as a user calls it
(``model(input_ids)`` or ``model(pixel_values)``, the output's
``last_hidden_state``), and checked by ``gradcheck.from_torch`` and the
runner on the tape, torch and jax.  Each (model, seed) runs in a fresh
process with a time limit; one JSON line per run goes to ``--out``:
verdict, leaves compared and agreeing, unavailable backends, errors, notes,
time.  The seed is both torch's initialisation seed and the case seed
(cotangent, dropout masks, referee directions).

    python benchmarks/hf_models.py --seeds 0 1 2 --out hf_models.jsonl
    python benchmarks/hf_models.py --models gpt2 bart --seeds 0      # some of them
    python benchmarks/hf_models.py --table hf_models.jsonl           # the table of a finished run
    python benchmarks/hf_models.py --table benchmarks/results/hf_models.json   # the kept one
    python benchmarks/hf_models.py --checkpointing reentrant   # gradient_checkpointing_enable() on each model

``--checkpointing plain|reentrant`` turns on transformers' gradient
checkpointing (``use_reentrant`` False or True) in every model that supports
it: torch then recomputes each layer's forward, its dropout draws included,
inside the backward.  A model that does not support it is run without.

A run is "clean" as ``third_party.py`` says (the harness this script shares
with ``timm_models.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time

import third_party

VOCAB, SEQ, BATCH, IMAGE = 96, 8, 2, 32
# The networks that downsample 32 times see 64x64: at 32x32 their last stages are 1x1, where a BatchNorm over a
# batch of 2 normalises two values to +-1 whatever they are, and every gradient before it vanishes (vacuous).
IMAGE_32X = 64


def _ids(seed, vocab=VOCAB, seq=SEQ):
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    # Token 0 and 1 are pad/bos ids in several configs; ids from 2 keep every position a real token.
    return torch.randint(2, vocab, (BATCH, seq), generator=g)


def _pixels(seed, size=IMAGE):
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(BATCH, 3, size, size, generator=g)


def _text(cls_name, config_name, **config):
    def build(seed):
        import transformers

        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
        return model, (_ids(seed),), lambda m, ids: m(input_ids=ids).last_hidden_state

    return build


def _image(cls_name, config_name, out="last_hidden_state", after=None, **config):
    def build(seed):
        import transformers

        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
        if after is not None:
            after(model)
        return model, (_pixels(seed, config.get("image_size", IMAGE)),), lambda m, x: getattr(m(pixel_values=x), out)

    return build


def _unit_batch_norms(model):
    """BatchNorm weights 1 and biases 0, torch's own initialisation.

    transformers' EfficientNet initialises BatchNorm weights like its convolutions, normal(0, 0.02): each of
    its 20 normalisations then scales the activations by about 0.02, the output is about 1e-33 and every
    parameter's gradient 1e-31 or less, so every leaf but the output would be vacuous (a pretrained
    checkpoint has weights near 1).
    """
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_parameters()


def _t5(seed):
    import transformers

    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5Model(config)
    dec = _ids(seed + 500)
    return model, (_ids(seed), dec), lambda m, ids, d: m(input_ids=ids, decoder_input_ids=d).last_hidden_state


def _floats(seed, shape):
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(*shape, generator=g)


def _series(cls_name, config_name, **config):
    """A time-series model called on ``past_values`` of shape (batch, context, channels)."""
    def build(seed):
        import transformers

        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
        x = _floats(seed, (BATCH, config["context_length"], config["num_input_channels"]))
        return model, (x,), lambda m, v: m(past_values=v).last_hidden_state

    return build


def _speech(cls_name, config_name):
    """A speech encoder on raw audio (400 samples): its convolutional feature encoder, masks and LayerDrop."""
    def build(seed):
        import transformers

        config = getattr(transformers, config_name)(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        model = getattr(transformers, cls_name)(config)
        return model, (_floats(seed, (BATCH, 400)),), lambda m, x: m(input_values=x).last_hidden_state

    return build


def _whisper(seed):
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=1)
    model = transformers.WhisperModel(config)
    return model, (_floats(seed, (BATCH, 8, 32)), _ids(seed + 500)), (
        lambda m, f, d: m(input_features=f, decoder_input_ids=d).last_hidden_state)


DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
ENCODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64)

MODELS = {
    "gpt2": _text("GPT2Model", "GPT2Config", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                  bos_token_id=1, eos_token_id=1),
    "llama": _text("LlamaModel", "LlamaConfig", **DECODER),
    "mistral": _text("MistralModel", "MistralConfig", **DECODER, sliding_window=4),
    "qwen2": _text("Qwen2Model", "Qwen2Config", **DECODER),
    "gemma": _text("GemmaModel", "GemmaConfig", **DECODER, head_dim=8),
    "phi": _text("PhiModel", "PhiConfig", **DECODER),
    "gpt_neox": _text("GPTNeoXModel", "GPTNeoXConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
    "bert": _text("BertModel", "BertConfig", **ENCODER),
    "roberta": _text("RobertaModel", "RobertaConfig", **ENCODER, pad_token_id=1),
    "bart": _text("BartModel", "BartConfig", vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_position_embeddings=64),
    "t5": _t5,
    "vit": _image("ViTModel", "ViTConfig", image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64),
    "swin": _image("SwinModel", "SwinConfig", image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                   num_heads=[2, 4], window_size=4),
    "segformer": _image("SegformerModel", "SegformerConfig", image_size=IMAGE, num_encoder_blocks=2, depths=[1, 1],
                        sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                        num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
    "convnext": _image("ConvNextModel", "ConvNextConfig", image_size=IMAGE, num_stages=2, hidden_sizes=[16, 32],
                       depths=[1, 1], patch_size=4),
    "mobilevit": _image("MobileViTModel", "MobileViTConfig", image_size=IMAGE_32X, hidden_sizes=[32, 40, 48],
                        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2, patch_size=2),
    "mobilenet_v2": _image("MobileNetV2Model", "MobileNetV2Config", image_size=IMAGE_32X, depth_multiplier=0.25,
                           finegrained_output=False),
    "efficientnet": _image("EfficientNetModel", "EfficientNetConfig", after=_unit_batch_norms, image_size=IMAGE_32X, width_coefficient=0.25,
                           depth_coefficient=0.25, hidden_dim=320),
    # -- a second sweep: more encoders, decoders, speech, time series, mixture of experts
    "distilbert": _text("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                        hidden_dim=64, max_position_embeddings=64),
    "albert": _text("AlbertModel", "AlbertConfig", **ENCODER, embedding_size=16),
    "deberta_v2": _text("DebertaV2Model", "DebertaV2Config", **ENCODER, relative_attention=True,
                        pos_att_type=["p2c", "c2p"], max_relative_positions=16, position_buckets=8),
    "electra": _text("ElectraModel", "ElectraConfig", **ENCODER, embedding_size=16),
    "opt": _text("OPTModel", "OPTConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                 num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32),
    "bloom": _text("BloomModel", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4),
    "falcon": _text("FalconModel", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4),
    "gptj": _text("GPTJModel", "GPTJConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                  n_positions=64),
    "codegen": _text("CodeGenModel", "CodeGenConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                     n_positions=64, n_ctx=64),
    "mamba": _text("MambaModel", "MambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=4, num_hidden_layers=2,
                   expand=2, conv_kernel=4),
    "rwkv": _text("RwkvModel", "RwkvConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                  attention_hidden_size=32, intermediate_size=64, context_length=64),
    "fnet": _text("FNetModel", "FNetConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                  intermediate_size=64, max_position_embeddings=64),
    "clip_vision": _image("CLIPVisionModel", "CLIPVisionConfig", image_size=IMAGE, patch_size=8, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
    "clip_text": _text("CLIPTextModel", "CLIPTextConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
    "whisper": _whisper,
    "wav2vec2": _speech("Wav2Vec2Model", "Wav2Vec2Config"),
    "hubert": _speech("HubertModel", "HubertConfig"),
    "dinov2": _image("Dinov2Model", "Dinov2Config", image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, mlp_ratio=2),
    "convnextv2": _image("ConvNextV2Model", "ConvNextV2Config", image_size=IMAGE, num_stages=2, hidden_sizes=[16, 32],
                         depths=[1, 1], patch_size=4),
    "regnet": _image("RegNetModel", "RegNetConfig", image_size=IMAGE_32X, embedding_size=16, hidden_sizes=[16, 32],
                     depths=[1, 1], groups_width=8),
    "resnet": _image("ResNetModel", "ResNetConfig", image_size=IMAGE_32X, embedding_size=16, hidden_sizes=[16, 32],
                     depths=[1, 1], layer_type="bottleneck"),
    "funnel": _text("FunnelModel", "FunnelConfig", vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=4,
                    d_head=8, d_inner=64),
    "squeezebert": _text("SqueezeBertModel", "SqueezeBertConfig", **ENCODER, embedding_size=32, q_groups=2, k_groups=2,
                         v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2),
    "longformer": _text("LongformerModel", "LongformerConfig", **ENCODER, attention_window=4, pad_token_id=1),
    "xlnet": _text("XLNetModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64),
    # transformers' default experts kernel (grouped matmul) has no float64; its eager loop is the one checked
    "mixtral": _text("MixtralModel", "MixtralConfig", **DECODER, num_local_experts=4, num_experts_per_tok=2,
                     experts_implementation="eager"),
    "gemma2": _text("Gemma2Model", "Gemma2Config", **DECODER, head_dim=8, sliding_window=4),
    "olmo": _text("OlmoModel", "OlmoConfig", **DECODER),
    "cohere": _text("CohereModel", "CohereConfig", **DECODER),
    "gpt_bigcode": _text("GPTBigCodeModel", "GPTBigCodeConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                         n_positions=64, multi_query=True),
    "mpnet": _text("MPNetModel", "MPNetConfig", **ENCODER),
    "nystromformer": _text("NystromformerModel", "NystromformerConfig", **ENCODER, num_landmarks=4,
                           segment_means_seq_len=8),
    "canine": _text("CanineModel", "CanineConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, num_hash_functions=2, num_hash_buckets=64, downsampling_rate=2),
    "patchtst": _series("PatchTSTModel", "PatchTSTConfig", num_input_channels=3, context_length=32, patch_length=8,
                        patch_stride=8, d_model=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64),
    "mobilebert": _text("MobileBertModel", "MobileBertConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, embedding_size=16, intra_bottleneck_size=16,
                        true_hidden_size=16, num_feedforward_networks=2),
    "reformer": _text("ReformerModel", "ReformerConfig", vocab_size=VOCAB, hidden_size=32, attention_head_size=8,
                      num_attention_heads=4, attn_layers=["local", "lsh"], feed_forward_size=64, axial_pos_embds=False,
                      local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, max_position_embeddings=64,
                      is_decoder=True),
}


def child(name: str, seed: int, checkpointing: str = "off", fault: str | None = None) -> dict:
    """One model at one seed, in this process: built, captured, checked (with ``fault`` while it runs)."""
    import torch

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model, inputs, forward = MODELS[name](seed)
    checkpointed = checkpointing != "off" and getattr(model, "supports_gradient_checkpointing", False)
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
    model.train()
    row = {"model": name, "seed": seed, "class": type(model).__name__,
           "checkpointing": checkpointing if checkpointed else "off", "fault": fault}
    third_party.check(model, inputs, forward, name=name, seed=seed, row=row, fault=fault)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def main(argv=None):
    p = third_party.parser(__doc__.split("\n\n")[0], MODELS, "hf_models.jsonl")
    p.add_argument("--checkpointing", choices=("off", "plain", "reentrant"), default="off",
                   help="turn on gradient checkpointing (use_reentrant False or True) where a model supports it")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.checkpointing, args.fault), default=str), flush=True)
        return 0
    if args.table:
        third_party.print_table(args.table)
        return 0
    return third_party.sweep(os.path.abspath(__file__), args, ["--checkpointing", args.checkpointing])


if __name__ == "__main__":
    sys.exit(main())
