"""Tiny keras-hub models of seven families, random weights, with data made here (no downloads).

Each builder returns a compiled model and `(x, y)` NumPy training data shaped as `fit`
feeds it (dict inputs with dynamic sequence dimensions for the text models).
"""

from __future__ import annotations

import keras
import numpy as np

SEQUENCE = 16
VOCABULARY = 128
SAMPLES = 64


def _tokens(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "token_ids": rng.integers(1, VOCABULARY, (SAMPLES, SEQUENCE)).astype("int32"),
        "padding_mask": np.ones((SAMPLES, SEQUENCE), "int32"),
    }


def _images(seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(SAMPLES, 32, 32, 3)).astype("float32")
    return x, (x[:, :, :, 0].mean(axis=(1, 2)) > 0).astype("int32")


def _compile(model: keras.Model) -> keras.Model:
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def bert_classifier(seed: int = 0):
    """An encoder: keras-hub's BERT text classifier (2 blocks, width 32)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=SEQUENCE,
    )
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None)
    rng = np.random.default_rng(seed)
    x = _tokens(rng)
    x["segment_ids"] = np.zeros((SAMPLES, SEQUENCE), "int32")
    y = (x["token_ids"][:, 0] % 3).astype("int32")
    return _compile(model), (x, y)


def gpt2_causal_lm(seed: int = 0):
    """A decoder: keras-hub's GPT-2 causal language model (2 blocks, width 32)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=SEQUENCE,
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(seed)
    x = _tokens(rng)
    y = np.roll(x["token_ids"], -1, axis=1)
    return _compile(model), (x, y)


def vit_classifier(seed: int = 0):
    """An image backbone: keras-hub's ViT (2 blocks, 8x8 patches of 32x32 images)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    )
    model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=3, preprocessor=None)
    return _compile(model), _images(seed)


def bart_seq2seq(seed: int = 0):
    """An encoder-decoder: keras-hub's BART sequence-to-sequence model (1 block each)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BartBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=SEQUENCE,
    )
    model = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(seed)
    source, target = _tokens(rng), _tokens(rng)
    x = {
        "encoder_token_ids": source["token_ids"],
        "encoder_padding_mask": source["padding_mask"],
        "decoder_token_ids": target["token_ids"],
        "decoder_padding_mask": target["padding_mask"],
    }
    y = np.roll(target["token_ids"], -1, axis=1)
    return _compile(model), (x, y)


ZOO = {
    "bert": bert_classifier,
    "gpt2": gpt2_causal_lm,
    "vit": vit_classifier,
    "bart": bart_seq2seq,
}


def _causal_lm(backbone, task_class, seed: int):
    model = task_class(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(seed)
    x = _tokens(rng)
    y = np.roll(x["token_ids"], -1, axis=1)
    return _compile(model), (x, y)


def gemma_causal_lm(seed: int = 0):
    """A decoder with tied embeddings and RMS norms: keras-hub's Gemma (2 blocks, width 32)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=16,
    )
    return _causal_lm(backbone, keras_hub.models.GemmaCausalLM, seed)


def mixtral_causal_lm(seed: int = 0):
    """A mixture of experts: keras-hub's Mixtral (1 block, 2 experts, top 1, width 16)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.MixtralBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        num_experts=2,
        top_k=1,
    )
    return _causal_lm(backbone, keras_hub.models.MixtralCausalLM, seed)


def llama_causal_lm(seed: int = 0):
    """keras-hub 0.32's Llama (2 blocks, width 128), whose decoder's own `get_config` raises."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=128,
        intermediate_dim=256,
    )
    return _causal_lm(backbone, keras_hub.models.LlamaCausalLM, seed)


def resnet_classifier(seed: int = 0):
    """A convolutional image backbone: keras-hub's ResNet (2 stages of basic blocks, 32x32 images)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64, 32],
        stackwise_num_blocks=[1, 1],
        stackwise_num_strides=[1, 2],
        block_type="basic_block",
        image_shape=(32, 32, 3),
    )
    model = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=3, preprocessor=None
    )
    return _compile(model), _images(seed)


def swin_classifier(seed: int = 0):
    """A windowed-attention image backbone: keras-hub's Swin Transformer (2 stages of 2 blocks,
    width 32, 4x4 windows of 32x32 images)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.SwinTransformerBackbone(
        image_shape=(32, 32, 3), embed_dim=32, depths=(2, 2), num_heads=(2, 2), window_size=4
    )
    model = keras_hub.models.SwinTransformerImageClassifier(
        backbone=backbone, num_classes=3, preprocessor=None
    )
    return _compile(model), _images(seed)


def dinov2_classifier(seed: int = 0):
    """A backbone that puts its name before its sub-layers' at a reload: keras-hub's DINOV2
    (2 blocks, width 32, 8x8 patches of 32x32 images) under a pooled dense head."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.DINOV2Backbone(
        patch_size=8,
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        image_shape=(32, 32, 3),
        position_embedding_shape=(32, 32, 3),
    )
    # keras-hub makes these again from `position_embeddings` at a reload: trained, they would
    # not come back bitwise, whatever the dtypes.
    backbone.get_layer("embeddings").interpolated_position_embeddings.trainable = False
    images = keras.Input((32, 32, 3), name="images")
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(backbone({"images": images}))
    model = keras.Model(images, keras.layers.Dense(3, name="head")(pooled), name="dinov2")
    return _compile(model), _images(seed)


def rwkv7_causal_lm(seed: int = 0):
    """A recurrent language model: keras-hub's RWKV-7 (1 block, width 32)."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.RWKV7Backbone(
        hidden_size=32,
        head_size=16,
        num_layers=1,
        vocabulary_size=VOCABULARY,
        intermediate_dim=64,
        gate_lora=8,
        mv_lora=8,
        aaa_lora=8,
        decay_lora=8,
    )
    return _causal_lm(backbone, keras_hub.models.RWKV7CausalLM, seed)


#: Families `keras.models.load_model` is checked to reload exactly (tests/test_reload_keras_hub.py).
RELOAD_ZOO = {
    **ZOO,
    "gemma": gemma_causal_lm,
    "mixtral": mixtral_causal_lm,
    "resnet": resnet_classifier,
    "swin": swin_classifier,
    "dinov2": dinov2_classifier,
    "rwkv7": rwkv7_causal_lm,
}
