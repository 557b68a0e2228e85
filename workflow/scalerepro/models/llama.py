"""A Llama 3 style decoder (causal LM) with torchtitan's module names.

RMSNorm (pre-norm), SwiGLU MLP, rotary position embeddings, grouped-query attention on
``F.scaled_dot_product_attention`` (is_causal), no biases. The module tree uses torchtitan's
names (``tok_embeddings``, ``layers[i].attention.wq``, ``feed_forward.w1``, ``norm``, ``output``),
so a tensor-parallel plan or a pipeline split written for torchtitan's Llama 3 applies here:

* ``layers`` is a ``ModuleDict`` keyed "0", "1", ...: a pipeline stage deletes the layers it does
  not own and keeps the others' fully qualified names (and checkpoint keys).
* ``tok_embeddings``, ``norm`` and ``output`` may be set to ``None`` by a pipeline split; forward
  then passes its input through (a structural choice fixed before tracing, not data-dependent
  control flow: ``torch.compile`` specialises on it).
* Attention reads its head counts from the local tensor shapes (``view(bsz, seqlen, -1,
  head_dim)``): with ``wq``/``wk``/``wv`` sharded column-wise over heads by tensor parallelism,
  each rank sees ``n_heads / tp`` query and ``n_kv_heads / tp`` key/value heads and the ratio
  ``n_rep`` stays the same.

Rotary frequencies live in a non-persistent float32 buffer ``rope_cos_sin`` (not in checkpoints;
recomputed by :meth:`Llama.init_weights`, which a model built on the ``meta`` device and
materialised with ``to_empty`` must call, as torchtitan does). They are stored as real (cos, sin)
pairs rather than torchtitan's complex ``freqs_cis`` (same rotation, interleaved pairs as Meta's
reference), so no complex tensors go through autograd, FSDP or inductor.

Embedding tying: Llama 3.2 1B ties its output projection to the token embedding (published
1.24B parameters counts the shared table once) and ``llama_1b`` does the same
(``LlamaConfig.tie_embeddings``). Llama 3 8B (and torchtitan's model) is untied. A tied model
cannot be split across pipeline stages (first and last stage would each hold the table) nor
sharded by a torchtitan TP plan (the embedding is row-sharded, the output column-sharded);
parallel code must reject ``tie_embeddings`` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from scalerepro.models.transformer import INIT_STD, padded_vocab_size

# torchtitan's llama3 defaults.
NORM_EPS = 1e-5
ROPE_THETA = 500_000.0


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int  # rows of tok_embeddings = columns of the logits (already padded)
    max_seq_len: int  # rows of the rotary table
    ffn_hidden_size: int
    tie_embeddings: bool
    rope_theta: float = ROPE_THETA
    norm_eps: float = NORM_EPS

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def ffn_hidden_size(dim: int, ffn_dim_multiplier: float, multiple_of: int) -> int:
    """SwiGLU hidden width as Meta's and torchtitan's Llama compute it: 2/3 of 4 * dim (three
    matrices instead of two keep the MLP's parameters at ~8 d^2), times a multiplier, rounded up
    to a multiple. Llama 3 8B: (4096, 1.3, 1024) -> 14336; Llama 3.2 1B: (2048, 1.5, 256) -> 8192."""
    hidden = int(2 * (4 * dim) / 3)
    hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama_config(
    *,
    dim: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    vocab_size: int,
    seq_len: int,
    ffn_dim_multiplier: float,
    multiple_of: int,
    tie_embeddings: bool,
) -> LlamaConfig:
    return LlamaConfig(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab_size=padded_vocab_size(vocab_size),  # 128256 is already a multiple of 64
        max_seq_len=seq_len,
        ffn_hidden_size=ffn_hidden_size(dim, ffn_dim_multiplier, multiple_of),
        tie_embeddings=tie_embeddings,
    )


def rope_cos_sin(head_dim: int, seq_len: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """(seq_len, head_dim / 2, 2) float32: cos and sin of position t times frequency
    theta^(-2i / head_dim), the angles of Meta's ``precompute_freqs_cis`` (no long-context scaling:
    Llama 3.2's rope scaling changes only positions past its original 8192 context)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rotary_emb(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of ``x`` (B, T, heads, head_dim) by the angle of
    its position and frequency; computed in float32 as torchtitan does, returned in x's dtype."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, T, H, hd/2, 2)
    real, imag = pairs.unbind(-1)
    cos_sin = cos_sin[: x.size(1)].unsqueeze(1)  # (T, 1, hd/2, 2): broadcast over batch and heads
    cos, sin = cos_sin.unbind(-1)
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, T, kv_heads, hd) -> (B, T, kv_heads * n_rep, hd): each key/value head serves n_rep
    consecutive query heads (torch.repeat_interleave on dim 2, as an expand + reshape)."""
    bsz, seqlen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:  # a config constant
        return x
    return x[:, :, :, None, :].expand(bsz, seqlen, n_kv_heads, n_rep, head_dim).reshape(bsz, seqlen, n_kv_heads * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.n_rep = config.n_heads // config.n_kv_heads  # unchanged when TP shards both head counts
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        # -1: the heads this rank holds (all of them without tensor parallelism).
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        q, k = apply_rotary_emb(q, cos_sin), apply_rotary_emb(k, cos_sin)
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        # (B, T, H, hd) -> (B, H, T, hd); no padding mask: every benchmark sequence is full length.
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(bsz, seqlen, -1))

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=INIT_STD)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden_size, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=INIT_STD)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)
        # torchtitan's depth init: the projections into the residual stream shrink with depth.
        self.weight_init_std = INIT_STD / math.sqrt(2 * (layer_id + 1))

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos_sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class Llama(nn.Module):
    """``forward(tokens (B, T)) -> logits (B, T, padded vocab)``, next-token prediction."""

    rope_cos_sin: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        assert config.dim % config.n_heads == 0 and config.n_heads % config.n_kv_heads == 0
        assert config.head_dim % 2 == 0  # rotary pairs
        self.config = config
        # Parameters are made on meta and then initialised once, by init_weights, on the device
        # asked for: the weights a seed gives are then the same whether the model is built here
        # or built on meta and materialised later (FSDP), and no time goes to nn's default init.
        device = torch.get_default_device()
        with torch.device("meta"):
            self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_size, config.dim)
            self.layers = nn.ModuleDict({str(i): TransformerBlock(i, config) for i in range(config.n_layers)})
            self.norm: nn.RMSNorm | None = nn.RMSNorm(config.dim, eps=config.norm_eps)
            self.output: nn.Linear | None = nn.Linear(config.dim, config.vocab_size, bias=False)
            self.register_buffer("rope_cos_sin", self._rope_table(), persistent=False)
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share tok_embeddings' table with output (tied configs only). ``to_empty`` unties them
        (it makes a new tensor per module): call this after it, before building the optimizer."""
        if self.config.tie_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def _rope_table(self, device: torch.device | None = None) -> torch.Tensor:
        c = self.config
        return rope_cos_sin(c.head_dim, c.max_seq_len, c.rope_theta, device=device)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """(Re)initialise every parameter and the rotary buffer in place, torchtitan's scheme:
        embedding N(0, 1); wq/wk/wv/w1 truncated N(0, 0.02); wo/w2/w3 truncated N(0, 0.02 /
        sqrt(2 (layer + 1))); output truncated N(0, dim^-1/2) within 3 std, so that the logits
        of the unit-RMS final norm's output start at unit variance.

        A tied table (torchtitan has none) is N(0, 0.02), as GPT-2 and Hugging Face's Llama 3.2
        init it: at N(0, 1) the first logits would have variance dim (a loss of ~dim nats), and
        at any std s a token's own logit starts near dim * s (the residual stream is mostly its
        embedding at init), which N(0, 0.02) keeps at 1.3 for dim 64 (41 for the full 1B, the
        same as Hugging Face's init). Call after ``to_empty`` (and ``tie_weights``) on a
        meta-built model."""
        device = buffer_device or self.rope_cos_sin.device
        self.rope_cos_sin = self._rope_table(device)
        for layer in self.layers.values():
            cast(TransformerBlock, layer).init_weights()  # __init__ made every layer a TransformerBlock
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.config.tie_embeddings:
            table = self.tok_embeddings if self.tok_embeddings is not None else self.output
            if table is not None:
                nn.init.normal_(table.weight, mean=0.0, std=INIT_STD)
            return
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight)
        if self.output is not None:
            std = self.config.dim**-0.5
            nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Module presence is fixed per pipeline stage before tracing: not data-dependent.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


LLAMA_FLOPS_SOURCE = (
    "closed form per token (torchtitan get_num_flop_per_token): 6*N + 12*L*H*Q*T, "
    "N = all parameters but the token embedding table (matmul weights incl. output, RMSNorm weights); x T per sequence"
)


def llama_non_embedding_parameters(config: LlamaConfig) -> int:
    """torchtitan's ``get_num_params(model, exclude_embedding=True)`` for the untied model: every
    parameter except ``tok_embeddings.weight``. Per layer: wq (d * H hd), wk and wv (d * Hkv hd
    each), wo (H hd * d), w1, w2, w3 (d * f each), two RMSNorm weights (d each); then the final
    RMSNorm (d) and the output projection (d * V). A tied model still runs the output matmul, so
    it is counted here although its table is the embedding's (torchtitan, subtracting the
    embedding from a tied model, would drop the head's FLOPs)."""
    c = config
    d, hd, f = c.dim, c.head_dim, c.ffn_hidden_size
    per_layer = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d + 3 * d * f + 2 * d
    return c.n_layers * per_layer + d + d * c.vocab_size


def llama_train_flops_per_token(config: LlamaConfig, seq_len: int) -> int:
    """torchtitan's ``get_num_flop_per_token``: 6 N + 12 L H Q T, with Q = head_dim.

    6 N: each weight does one multiply-add per token forward (2 FLOPs) and two backward (the
    gradients of its input and of itself), as in ``transformer._encoder_train_flops_per_token``.
    torchtitan's N also holds the RMSNorm weights (2 L d + d), which are elementwise scales, not
    matmuls: they add 6 (2L + 1) d per token, under 0.001% of Llama 3 8B's count; kept so that MFU
    is comparable with torchtitan's. 12 L H Q T: per layer, Q K^T and P V for H query heads of Q
    dimensions over T positions, 2 x 2 H Q T forward, x 3 training; the full T x T although the
    attention is causal (as nanoGPT, PaLM and torchtitan count it). GQA does not change it: the
    shared key/value heads are repeated, every query head still attends.

    Relation to GPT-2's ``gpt_train_flops_per_sequence`` / T: the same 6 N_matmul + 12 L d T (H Q =
    d), except that N here adds the RMSNorm weights and the MLP is three d x f matrices, and GPT-2
    has no separate output table (its lm_head is the tied embedding, counted as d x V there too).
    """
    c = config
    return 6 * llama_non_embedding_parameters(c) + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len


def llama_train_flops_per_sequence(config: LlamaConfig, seq_len: int) -> int:
    return seq_len * llama_train_flops_per_token(config, seq_len)
