"""LFQ, ResidualLFQ and ResidualFSQ against hand computations: codes of known inputs, the entropy
terms against a direct computation over the whole codebook, stage scaling, prefix decoding,
and vector-quantize-pytorch as an optional oracle (skipped when it is not installed)."""

import itertools
import math

import pytest
import torch

import vq
from vq.quantizers.lfq import bit_table


def direct_entropies(z, scale, inv_temperature, weight=None):
    """The entropy terms from the [n, 2^bits] softmax over every corner (what LFQ avoids)."""
    bits = z.shape[1]
    corners = (2 * bit_table(bits) - 1) * scale  # [K, bits], most significant bit first
    p = torch.softmax(-inv_temperature * torch.cdist(z.double(), corners.double()) ** 2, -1)
    w = torch.ones(len(z), dtype=torch.double) if weight is None else weight.double()
    per_sample = (-(p * torch.log(p.clamp_min(1e-300))).sum(-1) * w).sum() / w.sum()
    mean = (p * w[:, None]).sum(0) / w.sum()
    return per_sample, -(mean * torch.log(mean.clamp_min(1e-300))).sum()


def test_lfq_codes_are_the_sign_bits_most_significant_first():
    lfq = vq.LFQ(num_bits=3)
    x = torch.tensor([[1.0, -1.0, -1.0], [-0.5, 2.0, 0.1], [-1.0, -1.0, -1.0], [3.0, 0.2, 1e-6]])
    assert lfq.encode(x).tolist() == [4, 3, 0, 7]
    assert lfq.decode(torch.tensor([5])).tolist() == [[1.0, -1.0, 1.0]]
    assert lfq.codebook_size == 8 and lfq.code_dtype == torch.uint8


@pytest.mark.parametrize("bits, tau, scale", [(1, 1.0, 1.0), (4, 2.0, 0.5), (7, 0.3, 1.0)])
def test_lfq_entropy_terms_equal_a_direct_computation(bits, tau, scale):
    torch.manual_seed(bits)
    lfq = vq.LFQ(num_bits=bits, inv_temperature=tau, scale=scale, diversity_gamma=0.7)
    z = torch.randn(300, bits) * 0.5
    weight = (torch.rand(300) > 0.3).float()
    out = lfq(z.reshape(3, 100, bits), mask=weight.bool().reshape(3, 100))
    per_sample, codebook = direct_entropies(z, scale, tau, weight)
    torch.testing.assert_close(out.per_sample_entropy.double(), per_sample, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.codebook_entropy.double(), codebook, rtol=1e-5, atol=1e-6)
    commitment = (((z - torch.sign(z) * scale) ** 2).sum(-1) * weight).sum() / (weight.sum() * bits)
    expected = 0.25 * commitment + 0.1 * (per_sample - 0.7 * codebook)
    torch.testing.assert_close(out.loss.double(), expected.double(), rtol=1e-5, atol=1e-6)
    assert 0 <= codebook <= bits * math.log(2) + 1e-6


def test_lfq_entropy_gradient_equals_the_direct_one():
    torch.manual_seed(0)
    z = (torch.randn(64, 5) * 0.3).requires_grad_()
    lfq = vq.LFQ(num_bits=5, inv_temperature=3.0, commitment_weight=0.0)
    lfq(z).loss.backward()
    ref = z.detach().clone().requires_grad_()
    per_sample, codebook = direct_entropies(ref, 1.0, 3.0)
    (0.1 * (per_sample - codebook)).backward()
    torch.testing.assert_close(z.grad, ref.grad.float(), rtol=1e-4, atol=1e-6)


def test_lfq_large_codebook_entropy_never_builds_the_n_by_k_table():
    lfq = vq.LFQ(num_bits=20)  # 2^20 codes: an [8192, 2^20] table would be 32 GiB
    out = lfq(torch.randn(8192, 20))
    assert 0 < out.codebook_entropy <= 20 * math.log(2)
    assert out.codes.dtype == torch.int32 and out.codes.max() < 2**20


def test_residual_fsq_codes_by_hand():
    rfsq = vq.ResidualFSQ([5], 2)
    u = torch.tensor([[0.3], [-0.9], [0.0]])  # inputs after the soft clamp
    z = torch.atanh(u / 1.25) * 1.25
    # stage 0 grid {-1, -.5, 0, .5, 1}; stage 1: the same grid times 1/5
    # 0.3 → 0.5 (digit 3), residual -0.2 → -0.2 (digit 0 of {-.2, -.1, 0, .1, .2})
    # -0.9 → -1 (0), residual 0.1 → 0.1 (3); 0 → 0 (2), 0 (2)
    codes = rfsq.encode(z)
    assert codes.tolist() == [[3, 0], [0, 3], [2, 2]]
    torch.testing.assert_close(rfsq.decode(codes), u, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        rfsq.decode(codes[:, :1], num_stages=1), torch.tensor([[0.5], [-1.0], [0.0]])
    )


def test_residual_stages_shrink_the_error_by_the_stage_scale():
    rfsq = vq.ResidualFSQ([5, 4, 2], 4)
    x = torch.randn(20000, 3) * 2
    u, codes = rfsq._bound(x), rfsq.encode(x)
    cell = torch.tensor([1 / 4, 1 / 3, 1.0])  # half a cell of stage 0: 1 / (L - 1)
    for m in range(1, 5):
        error = (u - rfsq.decode(codes, num_stages=m)).abs().amax(0)
        bound = cell * torch.tensor([5.0, 4.0, 2.0]) ** -(m - 1)
        assert (error <= bound + 1e-5).all() and (error > 0.9 * bound).all()
    rlfq = vq.ResidualLFQ(num_bits=3, num_quantizers=4)
    x = torch.rand(20000, 3) * 4 - 2  # a binary expansion: the error halves per stage
    codes = rlfq.encode(x)
    for m in range(1, 5):
        error = (x - rlfq.decode(codes, num_stages=m)).abs().max()
        assert 0.99 * 2.0 ** (1 - m) <= error <= 2.0 ** (1 - m)


def test_residual_lfq_stages_each_carry_their_entropy():
    torch.manual_seed(0)
    rlfq = vq.ResidualLFQ(num_bits=4, num_quantizers=2, inv_temperature=2.0)
    z = torch.randn(200, 4)
    out = rlfq(z)
    r1 = z - torch.sign(z)
    for m, r in enumerate((z, r1)):
        per_sample, codebook = direct_entropies(r, 2.0**-m, 2.0)
        torch.testing.assert_close(
            out.per_sample_entropy[m].double(), per_sample, rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(out.codebook_entropy[m].double(), codebook, rtol=1e-5, atol=1e-6)


# -- vector-quantize-pytorch as an oracle (optional) -------------------------------------------
def test_lfq_equals_vector_quantize_pytorch():
    vqp = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    x = torch.randn(2, 50, 6) * 0.05  # soft assignments, where the entropies are not ~0
    anchor = vqp.LFQ(dim=6, codebook_size=64, entropy_loss_weight=0.1, commitment_loss_weight=0.0)
    (q, idx, aux), parts = anchor(x, return_loss_breakdown=True)
    out = vq.LFQ(6, 64, commitment_weight=0.0)(x)
    assert torch.equal(out.codes.long(), idx.long())
    torch.testing.assert_close(out.quantized, q)
    torch.testing.assert_close(
        out.per_sample_entropy, parts.per_sample_entropy, rtol=1e-3, atol=1e-5
    )
    torch.testing.assert_close(out.codebook_entropy, parts.batch_entropy, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss, aux, rtol=1e-3, atol=1e-5)


def _close(ours, theirs, tol):
    ours, theirs = ours.detach(), theirs.detach()
    assert float((ours - theirs).norm()) <= tol * float(theirs.norm()), (ours, theirs)


@pytest.mark.parametrize("tau, tol", [(0.1, 1e-6), (100.0, 1e-4)])
def test_lfq_training_step_equals_vector_quantize_pytorch(tau, tol):
    """The bench's LFQ (64-d input, 1024 codes through learned projections, entropy weight
    0.1, diversity γ 1, commitment 0.25, straight through; same seed, same projections): one
    training step gives the anchor's codes and output exactly, and its per-sample entropy,
    codebook entropy, commitment, loss and gradients (input, both projections). At τ = 0.1
    every probability is soft and they agree to float rounding; at the bench's τ = 100 the
    anchor takes logarithms of probabilities clamped at 1e-5 (vq's entropies are exact), which
    moves the entropies and the gradients by about 1e-5 of their size."""
    vqp = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    ours = vq.LFQ(64, 1024, commitment_weight=0.25, inv_temperature=tau, channel_first=True)
    torch.manual_seed(0)
    theirs = vqp.LFQ(dim=64, codebook_size=1024, commitment_loss_weight=0.25)
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(2, 64, 32, generator=g), torch.randn(2, 64, 32, generator=g)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(x_ours)
    (q, idx, aux), parts = theirs(
        x_theirs.transpose(1, 2), inv_temperature=tau, return_loss_breakdown=True
    )
    q = q.transpose(1, 2)
    assert torch.equal(out.codes.long(), idx.long()) and torch.equal(out.quantized, q)
    assert torch.equal(out.commitment, parts.commitment)
    _close(out.per_sample_entropy, parts.per_sample_entropy, tol)
    _close(out.codebook_entropy, parts.batch_entropy, tol)
    _close(out.loss, aux, tol)
    ((out.quantized * target).sum() + out.loss).backward()
    ((q * target).sum() + aux).backward()
    _close(x_ours.grad, x_theirs.grad, tol)
    _close(ours.project_in.weight.grad, theirs.project_in.weight.grad, tol)
    _close(ours.project_in.bias.grad, theirs.project_in.bias.grad, tol)
    torch.testing.assert_close(ours.project_out.weight.grad, theirs.project_out.weight.grad)


def test_residual_lfq_codes_equal_vector_quantize_pytorch():
    vqp = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    x = torch.randn(2, 64, 5)
    anchor = vqp.ResidualLFQ(dim=5, num_quantizers=3, codebook_size=32).eval()
    q, idx, _ = anchor(x)
    ours = vq.ResidualLFQ(5, 3, 32).eval()
    out = ours(x)
    assert torch.equal(out.codes.long(), idx.long())
    torch.testing.assert_close(out.quantized, q)


PER_STAGE = {  # vq's layer, the anchor's (given its module)
    "ResidualLFQ": (
        lambda: vq.ResidualLFQ(16, 3, 32, commitment_weight=0.0, per_stage_gradient=True),
        lambda vqp: vqp.ResidualLFQ(dim=16, num_quantizers=3, codebook_size=32),
    ),
    "ResidualFSQ": (
        lambda: vq.ResidualFSQ([8, 5, 5, 5], 3, dim=16, per_stage_gradient=True),
        lambda vqp: vqp.ResidualFSQ(dim=16, levels=[8, 5, 5, 5], num_quantizers=3),
    ),
}


@pytest.mark.parametrize("kind", list(PER_STAGE))
def test_per_stage_gradient_training_step_equals_vector_quantize_pytorch(kind):
    """With ``per_stage_gradient`` and the same seed (the same projections), one training step
    of vq's residual LFQ / FSQ is the anchor's: codes, output, loss (LFQ: the entropy terms
    of every stage) and the gradient to the input (every stage passing its residual's
    gradient, through FSQ's clamp to the stage's grid)."""
    vqp = pytest.importorskip("vector_quantize_pytorch")
    make_ours, make_theirs = PER_STAGE[kind]
    torch.manual_seed(0)
    ours = make_ours()
    torch.manual_seed(0)
    theirs = make_theirs(vqp)
    g = torch.Generator().manual_seed(1)
    x, target = 2 * torch.randn(2, 64, 16, generator=g), torch.randn(2, 64, 16, generator=g)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, res = ours(x_ours), theirs(x_theirs)
    loss = res[2].sum() if kind == "ResidualLFQ" else torch.zeros(())
    assert torch.equal(out.codes.long(), res[1].long())
    torch.testing.assert_close(out.quantized, res[0])
    torch.testing.assert_close(out.loss, loss)
    ((out.quantized * target).sum() + out.loss).backward()
    ((res[0] * target).sum() + loss).backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    # vq's default: one straight-through estimator for the whole stack
    grads = []
    for per_stage in (False, True):
        torch.manual_seed(0)
        layer = make_ours()
        layer.per_stage_gradient = per_stage
        xi = x.clone().requires_grad_()
        layer(xi).quantized.sum().backward()
        grads.append(xi.grad)
    if kind == "ResidualLFQ":  # 3 stages, each straight through
        torch.testing.assert_close(grads[1], 3 * grads[0])
    else:  # FSQ: a stage passes the gradient only inside its grid
        assert not torch.allclose(grads[1], grads[0])


def test_residual_fsq_first_stage_hits_every_grid_point_exactly():
    rfsq = vq.ResidualFSQ([3, 4], 2)
    clamp = torch.tensor([1.5, 4 / 3])  # L / (L - 1)
    grid = torch.tensor(list(itertools.product((-1.0, 0.0, 1.0), (-1.0, -1 / 3, 1 / 3, 1.0))))
    codes = rfsq.encode(torch.atanh(grid / clamp) * clamp)
    digits = torch.stack([codes[:, 0] % 3, codes[:, 0] // 3], 1)
    torch.testing.assert_close(
        digits.float(), torch.tensor(list(itertools.product(range(3), range(4)))).float()
    )
    torch.testing.assert_close(rfsq.decode(codes[:, :1], num_stages=1), grid, atol=1e-5, rtol=0)
