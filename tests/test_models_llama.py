"""Tests of the Llama decoder: FLOPs closed form vs FlopCounterMode, GQA, rotary, the sharded-head
attention a tensor-parallel plan relies on, meta-device init, training, and the trainer's CLI."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.flop_counter import FlopCounterMode

from scalerepro.models import llama
from scalerepro.models.registry import MODEL_NAMES, ModelShape, build, resolve

from conftest import REPO, load_record, python_train

TINY = ModelShape(seq_len=16, vocab_size=64, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2)
BATCH = 2


def tiny_model(name: str = "llama3_8b", shape: ModelShape = TINY, seed: int = 0) -> llama.Llama:
    torch.manual_seed(seed)
    return build(resolve(name, shape))


def counted_train_flops_per_sequence(spec, batch: int = BATCH) -> float:
    with torch.device("meta"):
        model = build(spec)
        tokens = torch.randint(spec.vocab_size, (batch, spec.seq_len))
        with FlopCounterMode(display=False) as counter:
            model(tokens).sum().backward()
    return counter.get_total_flops() / batch


@pytest.mark.parametrize("name", ["llama_1b", "llama3_8b"])
@pytest.mark.parametrize(
    "shape",
    [
        TINY,
        ModelShape(seq_len=48, vocab_size=1000, num_layers=3, hidden_size=96, num_heads=6, num_kv_heads=3),
        ModelShape(seq_len=64, vocab_size=500, num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=4),  # MHA
        ModelShape(),  # full size on the meta device
    ],
    ids=["tiny", "gqa-3-kv", "mha", "full"],
)
def test_flops_closed_form_matches_flop_counter(name: str, shape: ModelShape) -> None:
    """The closed form (torchtitan's 6 N + 12 L H Q T) against the matmuls autograd runs.

    Exact once the RMSNorm weights are taken out: torchtitan's N holds them (6 (2L + 1) d FLOPs
    per token) but they are elementwise scales, which FlopCounterMode does not count. Both count
    the causal attention's full T x T (SDPA on meta runs its math path, whose bmms are counted in
    full), so no tolerance is needed for the mask either.
    """
    spec = resolve(name, shape)
    config = build_meta(spec).config
    norm_weights = 2 * config.n_layers * config.dim + config.dim
    assert spec.train_flops_per_sample - 6 * norm_weights * spec.seq_len == counted_train_flops_per_sequence(spec)
    assert spec.flops_source == llama.LLAMA_FLOPS_SOURCE


def build_meta(spec):
    with torch.device("meta"):
        return build(spec)


def test_llama3_8b_flops_per_token_is_torchtitans() -> None:
    """torchtitan's get_num_flop_per_token at seq 8192, from its published numbers: 8,030,261,248
    parameters less the 128256 x 4096 embedding, and 12 L H Q T = 12 * 32 * 32 * 128 * 8192."""
    spec = resolve("llama3_8b")
    expected_per_token = 6 * (8_030_261_248 - 128_256 * 4096) + 12 * 32 * 32 * 128 * 8192
    assert spec.train_flops_per_sample == expected_per_token * 8192


def test_tied_model_counts_its_output_matmul() -> None:
    """llama_1b ties output to tok_embeddings: the table is one parameter, but the output matmul
    still runs, so its 6 d V FLOPs per token stay in the count (what FlopCounterMode sees)."""
    model = tiny_model("llama_1b")
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == resolve("llama_1b", TINY).num_parameters
    configs = {
        tie: llama.llama_config(
            dim=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=64,
            seq_len=16,
            ffn_dim_multiplier=1.5,
            multiple_of=256,
            tie_embeddings=tie,
        )
        for tie in (False, True)
    }
    with torch.device("meta"):
        counts = {tie: sum(p.numel() for p in llama.Llama(config).parameters()) for tie, config in configs.items()}
    assert counts[True] == counts[False] - 64 * 64
    flops = {tie: llama.llama_train_flops_per_sequence(config, 16) for tie, config in configs.items()}
    assert flops[True] == flops[False]


def test_full_shape_ffn_widths() -> None:
    assert build_meta(resolve("llama3_8b")).config.ffn_hidden_size == 14336
    assert build_meta(resolve("llama_1b")).config.ffn_hidden_size == 8192


def test_module_names_are_torchtitans() -> None:
    names = {name for name, _ in tiny_model().named_parameters()}
    expected_layer = {
        "attention_norm.weight",
        "attention.wq.weight",
        "attention.wk.weight",
        "attention.wv.weight",
        "attention.wo.weight",
        "ffn_norm.weight",
        "feed_forward.w1.weight",
        "feed_forward.w2.weight",
        "feed_forward.w3.weight",
    }
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.{i}.{suffix}" for i in range(2) for suffix in expected_layer}
    assert names == expected
    assert all(not name.endswith("bias") for name in names)
    assert "rope_cos_sin" not in tiny_model().state_dict()  # non-persistent buffer


def test_gqa_equals_attention_with_explicitly_repeated_heads() -> None:
    """Grouped-query attention with 2 kv heads for 4 query heads equals multi-head attention whose
    wk/wv repeat each kv head's rows for its 2 query heads (query head h uses kv head h // 2)."""
    gqa = tiny_model()
    mha_shape = ModelShape(**{**TINY.__dict__, "num_kv_heads": 4})
    mha = tiny_model(shape=mha_shape)
    head_dim = 16
    with torch.no_grad():
        state = gqa.state_dict()
        for key, value in list(state.items()):
            if key.endswith(("attention.wk.weight", "attention.wv.weight")):
                state[key] = value.unflatten(0, (2, head_dim)).repeat_interleave(2, dim=0).flatten(0, 1)
        mha.load_state_dict(state)
    tokens = torch.randint(64, (BATCH, 16))
    torch.testing.assert_close(gqa(tokens), mha(tokens))


def test_repeat_kv_is_repeat_interleave() -> None:
    x = torch.randn(2, 5, 3, 4)
    torch.testing.assert_close(llama.repeat_kv(x, 4), x.repeat_interleave(4, dim=2))


def test_attention_works_on_head_sharded_projections() -> None:
    """What tensor parallelism does to one block's attention: wq/wk/wv split column-wise over
    heads (2 shards), wo row-wise; each shard reads its head counts from the tensor shapes, and the
    shards' outputs sum to the unsharded output."""
    model = tiny_model()
    attention = model.layers["0"].attention
    x = torch.randn(BATCH, 16, 64)
    with torch.no_grad():
        full = attention(x, model.rope_cos_sin)
        shards = 2
        total = torch.zeros_like(full)
        for rank in range(shards):
            shard = llama.Attention(model.config)
            for name in ("wq", "wk", "wv"):
                weight = getattr(attention, name).weight
                setattr(shard, name, torch.nn.Linear(64, weight.size(0) // shards, bias=False))
                getattr(shard, name).weight.copy_(weight.chunk(shards, dim=0)[rank])
            shard.wo = torch.nn.Linear(attention.wo.in_features // shards, 64, bias=False)
            shard.wo.weight.copy_(attention.wo.weight.chunk(shards, dim=1)[rank])
            total += shard(x, model.rope_cos_sin)
    torch.testing.assert_close(total, full)


def test_rotary_is_relative() -> None:
    """RoPE: the dot product of a rotated query and key depends only on their distance."""
    cos_sin = llama.rope_cos_sin(head_dim=8, seq_len=32, theta=500_000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def at(x, position):
        return llama.apply_rotary_emb(x, cos_sin[position : position + 1])

    torch.testing.assert_close((at(q, 5) * at(k, 2)).sum(), (at(q, 23) * at(k, 20)).sum())
    assert not torch.allclose((at(q, 5) * at(k, 2)).sum(), (at(q, 5) * at(k, 4)).sum())


def test_is_causal() -> None:
    model = tiny_model().eval()
    tokens = torch.randint(64, (1, 16))
    changed = tokens.clone()
    changed[0, 8] = (tokens[0, 8] + 1) % 64
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :8], after[:, :8])
    assert not torch.allclose(before[:, 8], after[:, 8])


def test_meta_built_model_materialises_with_init_weights() -> None:
    """The FSDP path: build on meta, to_empty, init_weights; the rotary table must be recomputed
    (to_empty leaves it uninitialised) and the result equals a model built directly."""
    spec = resolve("llama3_8b", TINY)
    model = build_meta(spec).to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    direct = tiny_model()
    torch.testing.assert_close(model.rope_cos_sin, direct.rope_cos_sin)
    for (name, a), (_, b) in zip(model.named_parameters(), direct.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_pipeline_stage_modules_can_be_removed() -> None:
    """A torchtitan-style pipeline split: the first stage keeps tok_embeddings and layer 0, the
    last layer 1, norm and output; chained, the two stages give the whole model's logits."""
    whole = tiny_model()
    first, last = tiny_model(), tiny_model()
    del first.layers["1"]
    first.norm = first.output = None
    del last.layers["0"]
    last.tok_embeddings = None
    tokens = torch.randint(64, (BATCH, 16))
    with torch.no_grad():
        torch.testing.assert_close(last(first(tokens)), whole(tokens))


@pytest.mark.parametrize("name", ["llama_1b", "llama3_8b"])
def test_loss_falls_on_a_fixed_batch(name: str) -> None:
    model = tiny_model(name)
    tokens = torch.randint(64, (4, 17), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_compiles_without_graph_breaks() -> None:
    compiled = torch.compile(tiny_model(), backend="eager", fullgraph=True)  # a break raises
    compiled(torch.randint(64, (BATCH, 16))).sum().backward()


def test_the_config_schema_names_every_model() -> None:
    """The study config validates the model name against an enum: a model missing there cannot be
    studied. (The run record states the name the run was asked to train, whatever the registry
    made of it: a run of an unknown model fails with its record saying so.)"""
    config = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert find_model_enum(config) == list(MODEL_NAMES)


def find_model_enum(schema: dict) -> list[str]:
    found = [value["enum"] for value in walk(schema) if isinstance(value, dict) and "cnn" in value.get("enum", [])]
    assert len(found) == 1, found
    return found[0]


def walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from walk(child)


def test_trainer_cli_trains_a_tiny_llama(tmp_path) -> None:
    """The real trainer process on a shrunk llama_1b: the flags reach the model (--num-kv-heads
    included), the record validates, MFU's FLOPs are the registry's, and the loss falls."""
    args = [
        "--model",
        "llama_1b",
        "--seq-len",
        "32",
        "--vocab-size",
        "128",
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-heads",
        "4",
        "--num-kv-heads",
        "2",
        "--device",
        "cpu",
        "--lr",
        "3e-3",
        "--steps",
        "30",
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        "16",
        "--loader",
        "device",
        "--synthetic-samples",
        "2048",
        "--eval-samples",
        "64",
        "--log-interval",
        "5",
        "--comm-probe-steps",
        "0",
        "--bucket-probe-steps",
        "0",
        "--progress",
        "off",
        "--record",
        str(tmp_path / "r.json"),
    ]
    result = python_train(args, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(tmp_path / "r.json")
    spec = resolve("llama_1b", ModelShape(seq_len=32, vocab_size=128, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2))
    assert record["model"]["name"] == "llama_1b"
    assert record["model"]["num_parameters"] == spec.num_parameters
    assert record["model"]["train_flops_per_sample"] == spec.train_flops_per_sample
    losses = [entry["loss"] for entry in record["loss_log"]]
    # The bar of test_trainer's learning runs (the LR is scaled down to batch 16: sqrt(16 / 256)).
    assert losses[-1] < 0.9 * losses[0], losses
    m = record["measurements"]
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 32)


@pytest.mark.parametrize("name", ["llama_1b", "llama3_8b"])
def test_initial_loss_is_near_uniform(name: str) -> None:
    """At init (tiny shape) the loss starts within a nat of uniform, ln(V). A tied table at the
    untied embedding's N(0, 1) gave logits of variance dim: a loss of ~dim (64) nats; at the
    untied output's N(0, dim^-1/2), each token's own logit was sqrt(dim) = 8: a loss of 8."""
    model = tiny_model(name)
    tokens = torch.randint(64, (8, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert abs(loss.item() - math.log(64)) < 1.0, loss.item()
