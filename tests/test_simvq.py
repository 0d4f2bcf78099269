"""SimVQ as a learning rule of VectorQuantizer and ResidualVQ (a frozen random codebook behind a
learned linear map), and ResidualVQ's cosine stages and beam search in training. (The layer
contract — compile, export, bf16, masks, state_dict — is in test_layer_contract.py; ONNX in
test_export.py; two processes in tests/distributed_jobs.py.)"""

import copy

import pytest
import torch
import torch.nn.functional as F

import vq


def clustered(n, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(16, dim, generator=g) * 2
    return centers[torch.randint(16, (n,), generator=g)] + 0.2 * torch.randn(n, dim, generator=g)


SIMVQ = {
    "vq": lambda: vq.VectorQuantizer(8, 32, learning="simvq", commitment_weight=0.25),
    "rvq": lambda: vq.ResidualVQ(8, 3, 16, learning=vq.SimVQ(codebook_weight=0.5)),
}


@pytest.mark.parametrize("name", list(SIMVQ))
def test_simvq_trains_the_map_and_never_the_frozen_codebook(name):
    torch.manual_seed(0)
    layer = SIMVQ[name]()
    assert [n for n, _ in layer.named_parameters()] == ["codebook_transform"]
    frozen = layer._codebook_groups().clone()
    w0 = layer.codebook_transform.detach().clone()
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    x = clustered(256, 8).reshape(4, 64, 8)
    for _ in range(5):
        out = layer(x)
        out.loss.backward()
        assert layer.codebook_transform.grad.abs().sum() > 0  # the codebook loss reaches W
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(layer._codebook_groups(), frozen)
    assert not torch.allclose(layer.codebook_transform, w0)
    # the codewords are W c_k: codes are the nearest rows of C Wᵀ (stage by stage for RVQ)
    words = frozen @ layer.codebook_transform.detach().transpose(1, 2)
    torch.testing.assert_close(layer.effective_codebooks().detach(), words)
    residual, codes = x.reshape(-1, 8), []
    for stage in words:
        c = torch.cdist(residual, stage).argmin(1)
        codes.append(c)
        residual = residual - stage[c]
    ours = layer.encode(x).long().reshape(256, -1)
    assert torch.equal(ours, torch.stack(codes, 1))
    torch.testing.assert_close(
        layer.decode(ours).reshape(256, 8), x.reshape(-1, 8) - residual, atol=1e-5, rtol=0
    )


def test_grouped_simvq_trains_each_groups_map_and_codes_by_group():
    torch.manual_seed(0)
    layer = vq.GroupedResidualVQ(8, 2, 2, 16, learning="simvq")
    frozen = [rvq.codebooks.clone() for rvq in layer.rvqs]
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = clustered(128, 8).reshape(2, 64, 8)
    for _ in range(2):
        layer(x).loss.backward()
        assert all(rvq.codebook_transform.grad.abs().sum() > 0 for rvq in layer.rvqs)
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(r.codebooks, f) for r, f in zip(layer.rvqs, frozen, strict=True))
    words = torch.cat([r.codebooks @ r.codebook_transform.detach().mT for r in layer.rvqs])
    torch.testing.assert_close(layer.effective_codebooks().detach(), words)
    parts = [rvq.encode(part) for rvq, part in zip(layer.rvqs, x.chunk(2, -1), strict=True)]
    assert torch.equal(layer.encode(x), torch.stack(parts, -2))


@pytest.mark.parametrize("rotation", [False, True])
def test_simvq_loss_and_codes_equal_vector_quantize_pytorch(rotation):
    anchor = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    ours = vq.VectorQuantizer(
        8, 32, learning="simvq", commitment_weight=0.25, rotation_trick=rotation
    )
    theirs = anchor.SimVQ(dim=8, codebook_size=32, rotation_trick=rotation)
    with torch.no_grad():
        theirs.frozen_codebook.copy_(ours.codebook)
        theirs.code_transform.weight.copy_(ours.codebook_transform[0])
    x = clustered(128, 8).reshape(2, 64, 8).requires_grad_()
    out = ours(x)
    quantized, indices, loss = theirs(x)
    assert torch.equal(out.codes.long(), indices)
    torch.testing.assert_close(out.quantized, quantized)
    torch.testing.assert_close(out.loss, loss)
    target = torch.randn(2, 64, 8, generator=torch.Generator().manual_seed(1))
    ((out.quantized * target).sum() + out.loss).backward()
    ours_grads = ours.codebook_transform.grad[0].clone(), x.grad.clone()
    x.grad = None
    ((quantized * target).sum() + loss).backward()
    torch.testing.assert_close(ours_grads[0], theirs.code_transform.weight.grad)
    torch.testing.assert_close(ours_grads[1], x.grad)  # straight through, or rotated


def test_residual_simvq_per_stage_equals_vector_quantize_pytorchs_residual_simvq():
    """With the rotation trick stage by stage (``per_stage_gradient``) and the same seed, vq's
    ResidualVQ learning by SimVQ is the anchor's ResidualSimVQ: the same frozen codebooks and
    maps, codes, output, loss (the anchor's per-stage losses averaged), and gradients to the
    input and to every stage's map."""
    anchor = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    ours = vq.ResidualVQ(
        8, 3, 16, learning="simvq", commitment_weight=0.25, rotation_trick=True,
        per_stage_gradient=True,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = anchor.ResidualSimVQ(dim=8, num_quantizers=3, codebook_size=16)
    maps = torch.stack([layer.code_transform.weight for layer in theirs.layers])
    assert torch.equal(ours.codebooks, torch.stack([la.frozen_codebook for la in theirs.layers]))
    assert torch.equal(ours.codebook_transform, maps)
    x = clustered(128, 8).reshape(2, 64, 8)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(x_ours)
    quantized, indices, losses = theirs(x_theirs)
    assert torch.equal(out.codes.long(), indices)
    torch.testing.assert_close(out.quantized, quantized)
    torch.testing.assert_close(out.loss, losses.mean())
    target = torch.randn(2, 64, 8, generator=torch.Generator().manual_seed(1))
    ((out.quantized * target).sum() + out.loss).backward()
    ((quantized * target).sum() + losses.mean()).backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    grads = torch.stack([layer.code_transform.weight.grad for layer in theirs.layers])
    torch.testing.assert_close(ours.codebook_transform.grad, grads)


@pytest.mark.parametrize("rotation", [False, True])
def test_per_stage_gradient_sums_the_kept_stages_gradients(rotation):
    """The same output and loss either way; straight through, the input's gradient is the
    upstream gradient times the stages each row keeps (3, or its quantizer-dropout draw);
    rotated, it is the sum of each stage's rotation of the upstream gradient."""
    x = clustered(96, 8).reshape(3, 32, 8)
    grads, outs = [], []
    for per_stage in (False, True):
        torch.manual_seed(0)
        layer = vq.ResidualVQ(
            8, 3, 16, learning=vq.Gradient(kmeans_init=False), quantizer_dropout=0.7,
            rotation_trick=rotation, per_stage_gradient=per_stage,
        )  # fmt: skip
        xi = x.clone().requires_grad_()
        torch.manual_seed(1)  # the same quantizer-dropout draw
        out = layer(xi)
        outs.append(out)
        out.quantized.sum().backward()
        grads.append(xi.grad)
    torch.testing.assert_close(outs[0].quantized, outs[1].quantized)
    assert torch.equal(outs[0].codes, outs[1].codes) and torch.equal(outs[0].loss, outs[1].loss)
    kept = outs[1].num_stages.float()[:, None, None]  # [B] stages per sample
    assert kept.min() < 3  # the draw dropped stages somewhere
    if not rotation:
        assert torch.equal(grads[0], torch.ones_like(x))
        assert torch.equal(grads[1], kept.expand_as(x))
        return
    codebooks = layer.effective_codebooks().detach()
    r, expected = x.reshape(-1, 8), torch.zeros(96, 8)
    keep = (torch.arange(3)[None] < kept.reshape(3, 1).expand(3, 32).reshape(-1, 1)).float()
    for m, c in enumerate(outs[1].codes.reshape(-1, 3).T):
        q = codebooks[m][c.long()]
        ri = r.clone().requires_grad_()
        vq.quantizers.functional.rotation_trick(ri, q).sum().backward()
        expected += ri.grad * keep[:, m, None]
        r = r - q
    torch.testing.assert_close(grads[1].reshape(96, 8), expected)


def test_simvq_refuses_what_does_not_apply():
    does_not_apply = "kmeans_init, dead_code_threshold and dead_code_ratio do not apply"
    with pytest.raises(ValueError, match=does_not_apply):
        vq.SimVQ(kmeans_init=True)
    with pytest.raises(ValueError, match=does_not_apply):
        vq.SimVQ(dead_code_threshold=1.0)
    with pytest.raises(ValueError, match=does_not_apply):
        vq.SimVQ(dead_code_ratio=0.1)
    with pytest.raises(ValueError, match="ProductQuantizer does not learn by SimVQ"):
        vq.ProductQuantizer(8, 2, nbits=4, learning="simvq")
    with pytest.raises(ValueError, match="'simvq'"):
        vq.VectorQuantizer(8, 4, learning="sim")
    layer = vq.ResidualVQ(8, 2, 16, learning="simvq")
    with pytest.raises(ValueError, match="learning by SimVQ keeps its random codebook"):
        layer.fit(torch.randn(100, 8))


def test_beam_search_training_codes_are_encodes_beam_codes():
    """The training forward picks the codes encode's beam search picks with the codebooks as
    they were before the step (the first step initialises stage by stage on the best partial
    encoding), and they reconstruct better than greedy codes from the same codebooks."""
    torch.manual_seed(0)
    layer = vq.ResidualVQ(8, 3, 16, beam_size=4, learning=vq.EMA(decay=0.9))
    x = clustered(512, 8).reshape(4, 128, 8)
    layer(x)
    for step in range(3):
        before = copy.deepcopy(layer)
        out = layer(x + 0.05 * step)
        assert torch.equal(out.codes, before.encode(x + 0.05 * step))
    greedy = copy.deepcopy(before)
    greedy.beam_size = 1
    errors = [((m.decode(m.encode(x)) - x) ** 2).sum() for m in (before, greedy)]
    assert errors[0] < errors[1]
    assert not torch.equal(before.encode(x), greedy.encode(x))


def test_cosine_stages_pick_the_nearest_codeword_by_cosine_and_keep_unit_codewords():
    torch.manual_seed(0)
    layer = vq.ResidualVQ(8, 3, 16, learning=vq.EMA(decay=0.9), cosine=True)
    x = clustered(512, 8).reshape(4, 128, 8)
    layer(x)  # spherical k-means initialisation, stage by stage
    for step in range(3):
        before = copy.deepcopy(layer)
        out = layer(x + 0.05 * step)
        torch.testing.assert_close(layer.codebooks.norm(dim=-1), torch.ones(3, 16))
        # by hand: the input l2-normalised, each stage the codeword of largest cosine with
        # the residual, the residual minus that unit codeword
        residual, codes = F.normalize((x + 0.05 * step).reshape(-1, 8), dim=-1), []
        for stage in before.codebooks:
            c = (F.normalize(residual, dim=-1) @ stage.T).argmax(1)
            codes.append(c)
            residual = residual - stage[c]
        assert torch.equal(out.codes.long().reshape(-1, 3), torch.stack(codes, 1))
    eval_out = layer.eval()(x)
    torch.testing.assert_close(eval_out.quantized, layer.decode(layer.encode(x)))
    with pytest.raises(ValueError, match="use beam_size=1 with cosine=True"):
        vq.ResidualVQ(8, 2, 16, 2, cosine=True)


def test_cosine_stages_fit_unit_codewords_and_encode_by_cosine():
    x = clustered(2000, 8)
    layer = vq.ResidualVQ(8, 3, 16, cosine=True, niter=10).fit(x)
    torch.testing.assert_close(layer.codebooks.norm(dim=-1), torch.ones(3, 16))
    residual, codes = F.normalize(x, dim=-1), []
    for stage in layer.codebooks:
        cosines = F.normalize(residual, dim=-1) @ stage.T
        codes.append(cosines.argmax(1))
        if not codes[1:]:  # the first stage's codewords are the clusters' directions
            assert cosines.max(1).values.mean() > 0.95
        residual = residual - stage[codes[-1]]
    assert torch.equal(layer.encode(x).long(), torch.stack(codes, 1))
    with vq._cpu.torch_only():
        assert torch.equal(layer.static_encode(x), torch.stack(codes, 1))


def test_cosine_simvq_codes_by_the_unit_mapped_codewords():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(8, 32, learning="simvq", cosine=True)
    x = clustered(64, 8)
    layer(x).loss.backward()
    assert layer.codebook_transform.grad.abs().sum() > 0
    words = F.normalize(layer.codebook @ layer.codebook_transform[0].detach().T, dim=-1)
    torch.testing.assert_close(layer.effective_codebooks()[0].detach(), words)
    assert torch.equal(layer.encode(x).long(), (F.normalize(x, dim=-1) @ words.T).argmax(1))
