"""What every layer of issue 21 (LFQ, ResidualFSQ, ResidualLFQ, GroupedResidualVQ, SimVQ learning,
ResidualVQ's cosine stages and beam search in training) must do, as
the older layers do: gradients reach the input, encode/decode are pure and equal the eval
forward, masks and channel-first layouts, bf16 autocast gives the float32 codes, state_dict
resumes, one compiled graph with no recompile, strict torch.export. (ONNX Runtime: the LAYERS
table of test_export.py; two processes: tests/distributed_jobs.py.)"""

import copy

import pytest
import torch

import vq


def clustered(n, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(16, dim, generator=g) * 2
    return centers[torch.randint(16, (n,), generator=g)] + 0.2 * torch.randn(n, dim, generator=g)


LAYERS = {
    "lfq": lambda: vq.LFQ(8, 256),
    "lfq-projections": lambda: vq.LFQ(12, num_bits=5, commitment_weight=0.5),
    "residual-fsq": lambda: vq.ResidualFSQ([8, 5, 5, 5], 2, quantizer_dropout=0.5),
    "residual-fsq-projections": lambda: vq.ResidualFSQ([4, 4, 3], 2, dim=8),
    "residual-lfq": lambda: vq.ResidualLFQ(8, 2, 256, quantizer_dropout=0.5),
    "residual-lfq-projections": lambda: vq.ResidualLFQ(8, 2, num_bits=3),
    "residual-lfq-per-stage": lambda: vq.ResidualLFQ(
        8, 2, 256, quantizer_dropout=0.5, per_stage_gradient=True
    ),
    "residual-fsq-per-stage": lambda: vq.ResidualFSQ(
        [8, 5, 5, 5], 2, quantizer_dropout=0.5, per_stage_gradient=True
    ),
    "grouped-rvq": lambda: vq.GroupedResidualVQ(
        8, 2, 2, 16, learning=vq.EMA(decay=0.9, dead_code_threshold=0.5), quantizer_dropout=0.5
    ),
    "grouped-rvq-grad": lambda: vq.GroupedResidualVQ(
        8, 2, 2, 8, learning=vq.Gradient(kmeans_init=False), beam_size=2
    ),
    "simvq": lambda: vq.VectorQuantizer(8, 32, learning="simvq", commitment_weight=0.25),
    "simvq-residual": lambda: vq.ResidualVQ(8, 2, 16, learning="simvq", quantizer_dropout=0.5),
    "simvq-residual-per-stage": lambda: vq.ResidualVQ(
        8, 2, 16, learning="simvq", rotation_trick=True, per_stage_gradient=True
    ),
    "rvq-cosine": lambda: vq.ResidualVQ(8, 2, 16, learning=vq.EMA(decay=0.9), cosine=True),
    "rvq-beam": lambda: vq.ResidualVQ(
        8, 2, 16, beam_size=2, learning=vq.EMA(decay=0.9, dead_code_threshold=0.5)
    ),
}


def state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("name", list(LAYERS))
def test_gradients_reach_the_input_and_the_loss_trains_it(name):
    torch.manual_seed(0)
    encoder, layer = torch.nn.Linear(5, LAYERS[name]().dim), LAYERS[name]()
    out = layer(encoder(torch.randn(4, 32, 5)))
    (out.quantized.square().mean() + out.loss).backward()
    assert encoder.weight.grad.abs().sum() > 0
    if name.startswith(("lfq", "residual-lfq")):  # the entropy and commitment terms alone
        encoder.zero_grad()
        layer(encoder(torch.randn(4, 32, 5))).loss.backward()
        assert encoder.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", list(LAYERS))
def test_eval_forward_equals_pure_encode_decode_and_changes_nothing(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = clustered(256, layer.dim).reshape(4, 64, layer.dim)
    layer(x)  # a training step (initialises the grouped stacks)
    before = state(layer)
    codes = layer.encode(x)
    layer.decode(codes)
    layer.distance_tables(x[0, :3])
    layer.eval()
    with torch.no_grad():
        out = layer(x)
    assert torch.equal(out.codes, codes) and out.codes.dtype == layer.code_dtype
    torch.testing.assert_close(out.quantized, layer.decode(codes))
    after = state(layer)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name", list(LAYERS))
def test_mask_and_channel_first(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = clustered(2 * 48, layer.dim).reshape(2, 48, layer.dim)
    layer(x)
    layer.eval()
    mask = torch.arange(48)[None].expand(2, 48) < torch.tensor([[30], [48]])
    out = layer(x, mask=mask)
    assert (out.quantized[~mask] == 0).all()
    assert torch.equal(out.codes[mask], layer.encode(x)[mask])
    layer.channel_first = True
    out_cf = layer(x.transpose(1, 2))
    layer.channel_first = False
    assert out_cf.quantized.shape == (2, layer.dim, 48)
    assert torch.equal(out_cf.codes, layer.encode(x))


#: the layers without projections (whose nn.Linear runs in bf16 under autocast, as any layer's)
PLAIN = [name for name in LAYERS if "projections" not in name]
#: compiled and exported: every layer kind and learning rule, and the projections (the
#: nn.Linear pair every layer shares, the same code for all) once
GRAPHS = [*PLAIN, "lfq-projections"]


@pytest.mark.parametrize("name", PLAIN)
def test_bfloat16_autocast_gives_the_float32_codes(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = clustered(512, layer.dim).reshape(4, 128, layer.dim)
    layer(x)
    xb = x.bfloat16()
    twin = copy.deepcopy(layer)  # the same state, the same random draws: a float32 forward
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(xb)
    torch.manual_seed(1)
    ref = twin(xb.float())
    assert layer.project_in is None and out.quantized.dtype == torch.bfloat16
    assert torch.equal(out.codes, ref.codes)
    torch.testing.assert_close(out.loss, ref.loss)
    assert out.loss.dtype == torch.float32


@pytest.mark.parametrize("name", list(LAYERS))
def test_state_dict_resumes(name):
    torch.manual_seed(0)
    layer, fresh = LAYERS[name](), LAYERS[name]()
    x = clustered(256, layer.dim).reshape(4, 64, layer.dim)
    for step in range(2):
        layer(x + 0.1 * step)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.is_trained
    torch.manual_seed(1)
    a = layer(x)
    torch.manual_seed(1)
    b = fresh(x)
    assert torch.equal(a.codes, b.codes)
    torch.testing.assert_close(a.loss, b.loss)
    for key, value in state(layer).items():
        torch.testing.assert_close(state(fresh)[key], value, msg=key)


@pytest.mark.parametrize("name", GRAPHS)
def test_compiled_training_step_is_one_graph_without_recompiles(name):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = clustered(128, layer.dim).reshape(2, 64, layer.dim)

    def step(x):
        out = layer(x)
        return out.loss + out.quantized.square().mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for i in range(3):  # the first step initialises; the third must reuse the second's graph
        compiled((x + 0.01 * i).requires_grad_()).backward()
        if i == 1:
            graphs = counters["stats"]["unique_graphs"]
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == graphs == 1
    layer.eval()
    with torch.no_grad():
        assert torch.equal(layer(x).codes, layer.encode(x))


@pytest.mark.parametrize("name", GRAPHS)
def test_eval_forward_exports_strictly(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = clustered(120, layer.dim).reshape(3, 40, layer.dim)
    layer(x)
    layer.eval()
    program = torch.export.export(layer, (x,), strict=True)
    ours, ref = program.module()(x), layer(x)
    assert torch.equal(ours.codes, ref.codes)
    torch.testing.assert_close(ours.quantized, ref.quantized)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: vq.LFQ(8, 100), "power of two"),
        (lambda: vq.LFQ(8, 64, num_bits=5), "disagree"),
        (lambda: vq.LFQ(), "give codebook_size or num_bits"),
        (lambda: vq.LFQ(num_bits=30), r"num_bits must lie in \[1, 24\]"),
        (lambda: vq.LFQ(4, inv_temperature=0), "inv_temperature must be positive"),
        (lambda: vq.LFQ(4, entropy_loss_weight=-1), "entropy_loss_weight"),
        (lambda: vq.ResidualFSQ([4, 1], 2), "integers >= 2"),
        (lambda: vq.ResidualFSQ([4, 4], 0), "num_quantizers must be >= 1"),
        (lambda: vq.ResidualLFQ(4, 2, 16, quantizer_dropout=2), "quantizer_dropout"),
        (lambda: vq.GroupedResidualVQ(10, 3, 2, 8), "divide dim=10"),
        (lambda: vq.GroupedResidualVQ(8, 2, 2, 8, dropout_min_stages=3), "dropout_min_stages"),
    ],
)
def test_bad_arguments_say_what_is_wrong(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_untrained_fixed_layers_say_how_to_train_them_as_layers():
    for layer in (
        vq.GroupedResidualVQ(8, 2, 2, 8),
        vq.VectorQuantizer(8, 4),
        vq.ResidualVQ(8, 2, 4),
    ):
        with pytest.raises(
            RuntimeError, match=r"learning='ema' \(or 'grad'\) to train it as a layer"
        ):
            layer(torch.randn(3, 8))
