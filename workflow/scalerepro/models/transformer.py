"""BERT-base (masked LM) and GPT-2 small (causal LM) on one transformer block.

Both models share the block: fused-QKV self-attention on ``F.scaled_dot_product_attention``
(a flash/memory-efficient kernel on GPUs) and a GELU MLP. They differ only in configuration
(post-LN vs pre-LN, bidirectional vs causal, exact vs tanh GELU, LayerNorm epsilon) and in their
embeddings and heads. Forward passes have no data-dependent Python control flow and static
shapes, so ``torch.compile`` traces each model as one graph.

The training FLOPs of each model are written as a closed form next to its class, PaLM/nanoGPT
style, counting 2 FLOPs per multiply-add and only matmuls (LayerNorm, GELU, softmax, adds are
bandwidth-bound and left out, as FlopCounterMode leaves them out too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# Vocabulary sizes are padded up to a multiple of this, as nanoGPT does for GPT-2 (50257 -> 50304):
# the output projection's matmul then tiles evenly on tensor cores (a sizeable speedup in
# nanoGPT). The padded ids never occur in the data; the softmax only pushes their logits down. For BERT it gives 30522 -> 30528, NVIDIA's padded BERT vocabulary.
VOCAB_PAD_MULTIPLE = 64

# BERT masks 15% of the tokens; its data pipeline stores a static number of masked positions per
# sequence (max_predictions_per_seq: 20 at seq 128), which keeps the MLM head's shapes static.
MASKED_FRACTION_PERCENT = 15
# [MASK] in BERT's uncased WordPiece vocabulary.
BERT_MASK_TOKEN_ID = 103
# BERT's learned position table has 512 rows whatever sequence length a phase trains at.
BERT_MAX_POSITIONS = 512

INIT_STD = 0.02  # normal(0, 0.02) for every Linear and Embedding, as in BERT and GPT-2


def padded_vocab_size(vocab_size: int) -> int:
    return math.ceil(vocab_size / VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE


def bert_num_masked(seq_len: int) -> int:
    """ceil(0.15 * seq_len), in integers (0.15 * 20 is 3.0000000000000004 in floats)."""
    return (MASKED_FRACTION_PERCENT * seq_len + 99) // 100


def bert_mask_token_id(vocab_size: int) -> int:
    """BERT's [MASK] id where the vocabulary has it, else 0 (small test vocabularies)."""
    return BERT_MASK_TOKEN_ID if vocab_size > BERT_MASK_TOKEN_ID else 0


@dataclass(frozen=True)
class TransformerConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_size: int
    vocab_size: int  # rows of the token embedding = columns of the logits (already padded)
    max_positions: int  # rows of the learned position table
    causal: bool  # each position attends only to itself and earlier positions
    pre_norm: bool  # LayerNorm before each sublayer (GPT-2) or after its residual add (BERT)
    gelu_approximate: Literal["none", "tanh"]
    layer_norm_eps: float
    dropout: float = 0.0


def bert_config(*, num_layers: int, hidden_size: int, num_heads: int, vocab_size: int, dropout: float) -> TransformerConfig:
    """BERT (Devlin et al. 2018): post-LN, exact (erf) GELU, LayerNorm eps 1e-12."""
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        ffn_size=4 * hidden_size,
        vocab_size=padded_vocab_size(vocab_size),
        max_positions=BERT_MAX_POSITIONS,
        causal=False,
        pre_norm=False,
        gelu_approximate="none",
        layer_norm_eps=1e-12,
        dropout=dropout,
    )


def gpt2_config(*, num_layers: int, hidden_size: int, num_heads: int, vocab_size: int, seq_len: int, dropout: float) -> TransformerConfig:
    """GPT-2 (Radford et al. 2019): pre-LN, tanh GELU, LayerNorm eps 1e-5, positions = seq_len."""
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        ffn_size=4 * hidden_size,
        vocab_size=padded_vocab_size(vocab_size),
        max_positions=seq_len,
        causal=True,
        pre_norm=True,
        gelu_approximate="tanh",
        layer_norm_eps=1e-5,
        dropout=dropout,
    )


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        assert config.hidden_size % config.num_heads == 0
        self.num_heads = config.num_heads
        self.causal = config.causal
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # one matmul for q, k, v
        self.out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, 3C) -> 3 x (B, heads, T, C / heads): q, k, v in the layout SDPA expects.
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        # No padding mask: every benchmark sequence is full length.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal)
        return self.out(y.transpose(1, 2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, config.ffn_size)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.proj = nn.Linear(config.ffn_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = SelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)  # on each sublayer's output, before the add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A config constant, not data: torch.compile specializes on it.
        if self.pre_norm:  # GPT-2: x + f(LN(x)); the residual stream itself is never normalized
            x = x + self.dropout(self.attention(self.attention_norm(x)))
            x = x + self.dropout(self.mlp(self.mlp_norm(x)))
        else:  # BERT, as the original transformer: LN(x + f(x))
            x = self.attention_norm(x + self.dropout(self.attention(x)))
            x = self.mlp_norm(x + self.dropout(self.mlp(x)))
        return x


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def _encoder_train_flops_per_token(config: TransformerConfig, seq_len: int) -> int:
    """Training FLOPs per token of the stack of blocks, at sequence length ``seq_len``.

    Weights: per layer, a token passes through qkv (3 d^2), out (d^2), fc (d f) and proj (f d)
    weights, one multiply-add each: 2 (4 d^2 + 2 d f) FLOPs forward.
    Attention: per layer, the token's query is dotted with all T keys (Q K^T), then its output
    sums T value rows (P V), each over d = heads x head_dim: 2 x 2 T d FLOPs forward. The full
    T x T is counted for causal attention too, as nanoGPT and PaLM count it (flash attention
    skips the masked half, so MFU from this count is slightly optimistic for GPT).
    Training: backward computes two matmuls per forward matmul (gradients of both operands), so
    training = 3 x forward: 6 L (4 d^2 + 2 d f) + 12 L d T.
    """
    d, f, L, T = config.hidden_size, config.ffn_size, config.num_layers, seq_len
    matmul_weights = L * (4 * d * d + 2 * d * f)
    return 6 * matmul_weights + 12 * L * d * T


class BertForMaskedLM(nn.Module):
    """BERT with its masked-LM head, run only at the masked positions (as NVIDIA's BERT does).

    ``forward(tokens (B, T), masked_positions (B, M)) -> logits (B, M, padded vocab)``.
    No pooler or next-sentence head: the benchmark trains masked LM only.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        assert not config.causal and not config.pre_norm
        self.config = config
        d = config.hidden_size
        self.word_embedding = nn.Embedding(config.vocab_size, d)
        self.position_embedding = nn.Embedding(config.max_positions, d)
        self.token_type_embedding = nn.Embedding(2, d)  # sentence A / B
        self.embedding_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        # Masked-LM head: a transform (dense, GELU, LayerNorm), then the decoder, whose weight is
        # the word embedding (tied) and which has its own per-token bias.
        self.head_dense = nn.Linear(d, d)
        self.head_gelu = nn.GELU(approximate=config.gelu_approximate)
        self.head_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(d, config.vocab_size)
        self.decoder.weight = self.word_embedding.weight
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor, masked_positions: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        # Every sequence is one segment (type 0): there is no next-sentence task. The table keeps
        # BERT's two rows so that the parameter count and checkpoint layout match BERT's.
        x = self.word_embedding(tokens) + self.position_embedding(positions) + self.token_type_embedding.weight[0]
        x = self.dropout(self.embedding_norm(x))
        for block in self.blocks:
            x = block(x)
        # (B, T, d) -> (B, M, d): the head's matmuls, the biggest of which is d x vocab, run on
        # M ~ 0.15 T rows instead of T.
        x = x.gather(1, masked_positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        return self.decoder(self.head_norm(self.head_gelu(self.head_dense(x))))


BERT_FLOPS_SOURCE = "closed form per sequence: T*(6*L*(4d^2+2d*f) + 12*L*d*T) + 6*M*(d^2 + d*V_padded), M = masked positions (MLM head only there)"


def bert_train_flops_per_sequence(config: TransformerConfig, seq_len: int, num_masked: int) -> int:
    """Every token goes through the encoder; only the M masked positions go through the head.

    Head, per masked position: the transform's d x d weights and the decoder's d x V_padded
    weights, 6 FLOPs per weight in training (2 forward, 4 backward). The embedding lookups and
    the gather are indexing, not matmuls.
    """
    d, V = config.hidden_size, config.vocab_size
    head_train_flops_per_masked_position = 6 * (d * d + d * V)
    return seq_len * _encoder_train_flops_per_token(config, seq_len) + num_masked * head_train_flops_per_masked_position


class GPT(nn.Module):
    """GPT-2: ``forward(tokens (B, T)) -> logits (B, T, padded vocab)``, next-token prediction."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        assert config.causal and config.pre_norm
        self.config = config
        d = config.hidden_size
        self.token_embedding = nn.Embedding(config.vocab_size, d)
        self.position_embedding = nn.Embedding(config.max_positions, d)
        self.dropout = nn.Dropout(config.dropout)
        blocks = [Block(config) for _ in range(config.num_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)  # pre-LN needs one at the end
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # tied, as in GPT-2
        self.apply(_init_weights)
        # GPT-2 scales the init of the two projections per block that write into the residual
        # stream by 1/sqrt(2 L), so that the stream's variance does not grow with depth.
        for block in blocks:
            for projection in (block.attention.out, block.mlp.proj):
                nn.init.normal_(projection.weight, mean=0.0, std=INIT_STD / math.sqrt(2 * config.num_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))


GPT_FLOPS_SOURCE = "closed form per token (nanoGPT/PaLM): 6*N_matmul + 12*L*d*T, N_matmul = L*(4d^2+2d*f) + d*V_padded (lm_head); x T per sequence"


def gpt_train_flops_per_sequence(config: TransformerConfig, seq_len: int) -> int:
    """Every token goes through the encoder and the d x V_padded lm_head (6 FLOPs per weight)."""
    lm_head_train_flops_per_token = 6 * config.hidden_size * config.vocab_size
    return seq_len * (_encoder_train_flops_per_token(config, seq_len) + lm_head_train_flops_per_token)
