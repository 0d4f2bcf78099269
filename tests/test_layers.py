"""Quantizers as trainable layers (issue 7): gradients, EMA and gradient codebook learning,
k-means initialisation, dead-code restart, quantizer dropout, masks and layouts, FSQ,
torch.compile / torch.export, and codebooks kept identical across torchrun processes."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import vq
from vq.quantizers.functional import rotation_trick


def clustered(n, dim, centers=8, seed=0, spread=0.1):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(centers, dim, generator=g) * 3
    return c[torch.randint(centers, (n,), generator=g)] + spread * torch.randn(n, dim, generator=g)


def state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --- gradients ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: vq.VectorQuantizer(8, 16, learning="ema"),
        lambda: vq.ProductQuantizer(8, 2, nbits=3, learning="ema"),
        lambda: vq.ResidualVQ(8, 3, 8, learning="ema", quantizer_dropout=0.5),
    ],
    ids=["vq", "pq", "rvq"],
)
def test_gradients_reach_the_encoder_straight_through(make):
    torch.manual_seed(0)
    encoder, layer = torch.nn.Linear(5, 8), make()
    x = torch.randn(4, 10, 5)
    out = layer(encoder(x))
    g = torch.randn_like(out.quantized)
    (out.quantized * g).sum().backward()
    # straight through: d quantized / d z is the identity, so the encoder sees g itself
    ref = torch.nn.Linear(5, 8)
    ref.load_state_dict(encoder.state_dict())
    (ref(x) * g).sum().backward()
    torch.testing.assert_close(encoder.weight.grad, ref.weight.grad)
    assert encoder.weight.grad.abs().sum() > 0


def test_commitment_gradient_pulls_the_input_to_its_codeword():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(8, 16, learning="ema", commitment_weight=0.25)
    z = clustered(64, 8).requires_grad_()
    out = layer(z)
    out.loss.backward()
    x_hat = layer.decode(out.codes)
    torch.testing.assert_close(z.grad, 0.25 * 2 * (z.detach() - x_hat) / z.numel())
    torch.testing.assert_close(out.loss, 0.25 * out.commitment)


def test_rotation_trick_value_and_gradient():
    torch.manual_seed(0)
    z, q, g = torch.randn(3, 6, requires_grad=True), torch.randn(3, 6), torch.randn(3, 6)
    out = rotation_trick(z, q)
    torch.testing.assert_close(out.detach(), q)
    (out * g).sum().backward()
    for i in range(3):  # grad = λ Rᵀ g with R = I - 2wwᵀ + 2vuᵀ, λ = |q| / |z|
        zi = z[i].detach()
        u, v = zi / zi.norm(), q[i] / q[i].norm()
        w = (u + v) / (u + v).norm()
        r = torch.eye(6) - 2 * torch.outer(w, w) + 2 * torch.outer(v, u)
        torch.testing.assert_close(r @ u, v)  # R rotates z's direction onto q's
        expected = (q[i].norm() / zi.norm()) * (r.T @ g[i])
        torch.testing.assert_close(z.grad[i], expected, rtol=1e-5, atol=1e-5)


def test_rotation_trick_in_a_layer():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(8, 16, learning="ema", rotation_trick=True)
    z = clustered(64, 8).requires_grad_()
    out = layer(z)
    torch.testing.assert_close(out.quantized.detach(), layer.decode(out.codes))
    out.quantized.sum().backward()
    assert not torch.allclose(z.grad, torch.ones_like(z))  # not the straight-through identity


# --- EMA ---------------------------------------------------------------------------------------
def test_ema_update_matches_a_hand_computed_update():
    gamma, eps = 0.5, 0.1
    layer = vq.VectorQuantizer(2, 2, learning=vq.EMA(kmeans_init=False, decay=gamma, eps=eps))
    cb = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    n = torch.tensor([2.0, 4.0])
    m = torch.tensor([[0.2, 0.4], [40.0, 36.0]])
    with torch.no_grad():
        layer.codebook.copy_(cb)
        layer.learner.cluster_size.copy_(n[None])
        layer.learner.embed_sum.copy_(m[None])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [9.0, 9.0], [0.5, 0.5]])
    out = layer(x.clone().requires_grad_())
    assert out.codes.tolist() == [0, 0, 1, 0]
    counts = torch.tensor([3.0, 1.0])
    sums = torch.tensor([[1.5, 1.5], [9.0, 9.0]])
    n1 = gamma * n + (1 - gamma) * counts  # [2.5, 2.5]
    m1 = gamma * m + (1 - gamma) * sums
    total = n1.sum()
    smoothed = (n1 + eps) / (total + 2 * eps) * total
    torch.testing.assert_close(layer.learner.cluster_size[0], n1)
    torch.testing.assert_close(layer.learner.embed_sum[0], m1)
    torch.testing.assert_close(layer.codebook, m1 / smoothed[:, None])


def test_codeword_smoothing_matches_a_hand_computed_update():
    """``smoothing="codeword"``: statistics start at zero, ``e ← (m + ε e) / (n + ε)``, so an
    unused codeword stays exactly where it was."""
    gamma, eps = 0.5, 0.1
    learning = vq.EMA(kmeans_init=False, decay=gamma, eps=eps, smoothing="codeword")
    layer = vq.VectorQuantizer(2, 3, learning=learning)
    assert not layer.learner.cluster_size.any() and not layer.learner.embed_sum.any()
    cb = torch.tensor([[0.0, 0.0], [10.0, 10.0], [-50.0, 50.0]])
    with torch.no_grad():
        layer.codebook.copy_(cb)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [9.0, 9.0], [0.5, 0.5]])
    assert layer(x).codes.tolist() == [0, 0, 1, 0]
    counts = torch.tensor([3.0, 1.0, 0.0])
    sums = torch.tensor([[1.5, 1.5], [9.0, 9.0], [0.0, 0.0]])
    n1, m1 = (1 - gamma) * counts, (1 - gamma) * sums
    torch.testing.assert_close(layer.learner.cluster_size[0], n1)
    torch.testing.assert_close(layer.learner.embed_sum[0], m1)
    torch.testing.assert_close(layer.codebook, (m1 + eps * cb) / (n1 + eps)[:, None])
    assert torch.equal(layer.codebook[2], cb[2])  # unused: unmoved


def test_kmeans_start_leaves_codeword_statistics_at_zero_until_the_update():
    """After the k-means start the statistics are those of the first update alone: (1 - γ)
    times the batch's counts and sums (Laplace smoothing keeps the k-means counts instead)."""
    x = clustered(512, 4, centers=8, seed=3)
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(4, 8, learning=vq.EMA(decay=0.8, smoothing="codeword"))
    codes = layer(x).codes.long()
    counts = torch.bincount(codes, minlength=8).float()
    sums = torch.zeros(8, 4).index_add_(0, codes, x)
    torch.testing.assert_close(layer.learner.cluster_size[0], 0.2 * counts)
    torch.testing.assert_close(layer.learner.embed_sum[0], 0.2 * sums)


def test_relative_dead_code_threshold_restarts_codes_below_a_fraction_of_the_mean():
    torch.manual_seed(0)
    learning = vq.EMA(kmeans_init=False, decay=0.9, dead_code_ratio=0.9, reset_ratio=0.25)
    layer = vq.VectorQuantizer(4, 8, learning=learning)
    x = clustered(256, 4, centers=2, seed=1)
    far = torch.full((8, 4), 100.0)
    with torch.no_grad():
        layer.codebook.copy_(far)
        layer.codebook[:2] = x[:2]
        layer.learner.cluster_size.fill_(5.0)
        layer.learner.cluster_size[0, 5] = 0.5
        layer.learner.embed_sum.copy_(layer.codebook[None] * 5.0)
    counts = torch.bincount(layer(x).codes.long(), minlength=8).float()
    usage = 0.9 * torch.tensor([5.0] * 5 + [0.5] + [5.0] * 2) + 0.1 * counts  # before restarts
    mean = usage.mean()
    dead = usage < 0.9 * mean
    assert dead.tolist() == [False, False] + [True] * 6  # every unused code: 4.5 < 0.9 mean
    size = layer.learner.cluster_size[0]
    torch.testing.assert_close(size[dead], torch.full((6,), float(0.25 * mean)))
    torch.testing.assert_close(size[~dead], usage[~dead])
    restarted = layer.codebook[dead]
    exact = torch.cdist(restarted, x, compute_mode="donot_use_mm_for_euclid_dist")
    assert bool((exact.amin(1) < 1e-5).all())  # batch vectors
    assert len({tuple(r.tolist()) for r in restarted}) == 6  # each its own


def test_fewer_batch_vectors_than_dead_codes_restart_the_least_used():
    """A batch of 3 vectors and 6 dead codes: the 3 least used restart, each from its own
    vector, and the others wait (vector-quantize-pytorch 1.34's rule)."""
    torch.manual_seed(0)
    learning = vq.EMA(kmeans_init=False, decay=0.5, smoothing="codeword", dead_code_threshold=4.0)
    layer = vq.VectorQuantizer(2, 8, learning=learning)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    start = torch.tensor([[0.5, 0.4], [0.6, 0.6]] + [[100.0 + k, 0.0] for k in range(6)])
    usage = torch.tensor([20.0, 20.0, 6.0, 1.0, 5.0, 2.0, 7.0, 3.0])
    with torch.no_grad():
        layer.codebook.copy_(start)
        layer.learner.cluster_size.copy_(usage[None])
        layer.learner.embed_sum.copy_((start * usage[:, None])[None])
    assert layer(x).codes.tolist() == [0, 1, 1]
    # usage after the step: 10.5, 11, then the unused halved: 3, .5, 2.5, 1, 3.5, 1.5 (all dead)
    size = layer.learner.cluster_size[0]
    assert size.tolist() == [10.5, 11.0, 3.0, 4.0, 2.5, 4.0, 3.5, 4.0]
    moved = ~torch.isclose(layer.codebook, start, rtol=1e-6, atol=0).all(1)
    assert moved.tolist() == [True, True, False, True, False, True, False, True]
    restarted = {tuple(row) for row in layer.codebook[[3, 5, 7]].tolist()}
    assert restarted == {tuple(row) for row in x.tolist()}  # each its own batch vector


def test_ema_codebooks_learn_the_data_and_restarts_raise_usage():
    x = clustered(2048, 16, centers=16)
    results = {}
    for threshold in (0.0, 1.0):
        torch.manual_seed(0)
        learning = vq.EMA(decay=0.8, kmeans_init=False, dead_code_threshold=threshold)
        layer = vq.VectorQuantizer(16, 16, learning=learning)
        first = layer(x).commitment
        for _ in range(20):
            out = layer(x)
        assert out.commitment < 0.3 * first
        results[threshold] = out
    # random codewords near the origin: without restarts many codes never win a vector
    assert results[1.0].commitment < 0.7 * results[0.0].commitment
    assert results[1.0].perplexity > results[0.0].perplexity + 2


def test_dead_codes_are_replaced_and_their_statistics_reset():
    torch.manual_seed(0)
    learning = vq.EMA(kmeans_init=False, decay=0.9, dead_code_threshold=1.0)
    layer = vq.VectorQuantizer(4, 8, learning=learning)
    x = clustered(256, 4, centers=2, seed=1)
    far = torch.full((8, 4), 100.0)  # no vector comes near these
    with torch.no_grad():
        layer.codebook.copy_(far)
        layer.codebook[:2] = x[:2]
        layer.learner.cluster_size.fill_(5.0)
        layer.learner.cluster_size[0, 5] = 0.5  # dead already
        layer.learner.embed_sum.copy_(layer.codebook[None] * 5.0)
    layer(x)
    cb, size = layer.codebook, layer.learner.cluster_size[0]
    # code 5 was dead: now a batch vector, with usage reset to the threshold
    assert (cb[5] == x).all(dim=1).any()
    assert size[5] == 1.0
    # the others unused this step decayed to 4.5 and stay (above the threshold; the EMA
    # recomputes them from smoothed counts, which moves them by about ε)
    torch.testing.assert_close(cb[2:5], far[2:5], atol=1e-3, rtol=0)
    torch.testing.assert_close(cb[6:], far[6:], atol=1e-3, rtol=0)
    torch.testing.assert_close(size[[2, 3, 4, 6, 7]], torch.full((5,), 4.5))
    # EMA state agrees with the new codeword: e_k = m_k / ñ_k
    learner = layer.learner
    smoothed = learner._smoothed(learner.cluster_size)[0]
    torch.testing.assert_close(learner.embed_sum[0, 5] / smoothed[5], cb[5])
    # after more steps every unused code has been restarted onto the data
    for _ in range(40):
        layer(x)
    assert (torch.cdist(layer.codebook, x).min(dim=1).values < 1.0).all()


def test_gradient_learning_trains_the_codebook_by_its_loss():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(8, 16, learning=vq.Gradient(codebook_weight=2.0))
    assert isinstance(layer.codebook, torch.nn.Parameter)
    z = clustered(128, 8)
    layer(z)  # k-means initialisation: at the centroids the gradient would vanish
    z = (z + 0.3).requires_grad_()
    out = layer(z)
    torch.testing.assert_close(out.loss, out.commitment + 2.0 * out.codebook_loss)
    torch.testing.assert_close(out.codebook_loss, out.commitment)  # same distance, other side
    out.loss.backward()
    used = torch.zeros(16, dtype=torch.bool)
    used[out.codes.long()] = True
    assert (layer.codebook.grad[used].abs().sum(1) > 0).all()
    assert (layer.codebook.grad[~used] == 0).all()
    first = out.codebook_loss.detach()
    opt = torch.optim.SGD(layer.parameters(), lr=5.0)
    for _ in range(20):
        opt.zero_grad()
        out = layer(z.detach())
        out.loss.backward()
        opt.step()
    assert out.codebook_loss < 0.5 * first


# --- k-means initialisation ------------------------------------------------------------------
def test_kmeans_initialisation_from_the_first_batch():
    x = clustered(1024, 8, centers=4)
    layer = vq.VectorQuantizer(8, 32, learning=vq.EMA(decay=0.99, kmeans_iters=10))
    assert not layer.is_trained and not bool(layer.learner.initted)
    layer.eval()
    with pytest.raises(RuntimeError, match="not trained"):
        layer(x)
    layer.train()
    with torch.no_grad():  # no gradients: no state change, and a clear error
        with pytest.raises(RuntimeError, match="not trained"):
            layer(x)
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # empty clusters are dead codes, not a warning
        layer(x)
    assert layer.is_trained and bool(layer.learner.initted)
    ours = ((x - layer.decode(layer.encode(x))) ** 2).sum()
    ref = vq.kmeans(x, 32, niter=10)
    assert ours <= 1.1 * ref.inertia  # a k-means solution (one EMA step later)
    again = vq.VectorQuantizer(8, 32, learning=vq.EMA(decay=0.99, kmeans_iters=10))
    torch.manual_seed(3)
    again(x)
    assert torch.equal(again.codebook, layer.codebook)  # torch.manual_seed fixes it


def test_a_first_batch_without_vectors_defers_the_kmeans_start():
    """Every row masked (or, in a residual layer, every sample dropping a stage): nothing to
    start from, so the codebook waits for the next batch instead of failing."""
    x = clustered(256, 4, centers=4, seed=2)
    layer = vq.VectorQuantizer(4, 8, learning=vq.EMA(decay=0.8))
    start = layer.codebook.clone()
    out = layer(x[None], torch.zeros(1, 256, dtype=torch.bool))
    assert not bool(layer.learner.initted.any()) and float(out.loss) == 0.0
    assert out.codes.shape == (1, 256)  # codes for every position
    layer(x[None])
    assert bool(layer.learner.initted.all()) and not torch.equal(layer.codebook, start)
    assert float(torch.cdist(layer.codebook, x).amin(1).max()) < 1.0  # k-means on x
    for seed in range(20):  # two samples, each keeping 1-3 stages: find a batch dropping stage 3
        torch.manual_seed(seed)
        rvq = vq.ResidualVQ(4, 3, 8, learning=vq.EMA(decay=0.8), quantizer_dropout=1.0,
                            dropout_min_stages=1)  # fmt: skip
        kept = int(rvq(x[:2]).num_stages.max())
        # a stage starts when some sample keeps it, and only then
        assert rvq.learner.initted.tolist() == [m < kept for m in range(3)]
        if kept < 3:
            break
    assert kept < 3
    for _ in range(20):
        rvq(x)
    assert bool(rvq.learner.initted.all())


def test_fit_initialises_a_learning_layer():
    x = clustered(2000, 8, centers=16)
    layer = vq.ResidualVQ(8, 2, 16, learning="ema", niter=5).fit(x)
    assert layer.learner.initted.all()
    codes = torch.as_tensor(layer.encode(x)).long()
    for m in range(2):
        counts = torch.bincount(codes[:, m], minlength=16).float()
        torch.testing.assert_close(layer.learner.cluster_size[m], counts)
    before = layer.codebooks.clone()
    layer(x[:256])  # continues from the fitted codebooks (no new k-means)
    assert (layer.codebooks - before).abs().max() < 0.5


def test_few_vectors_for_kmeans_warn_and_still_initialise():
    layer = vq.VectorQuantizer(4, 64, learning="ema")
    with pytest.warns(RuntimeWarning, match="got 10 vectors for 64 codes"):
        layer(torch.randn(10, 4))
    assert layer.learner.initted.all() and torch.isfinite(layer.codebook).all()


# --- residual stacks: quantizer dropout, prefixes ----------------------------------------------
def test_quantizer_dropout_gives_per_sample_numbers_of_stages():
    torch.manual_seed(0)
    x = clustered(64 * 6, 8).reshape(64, 6, 8)
    layer = vq.ResidualVQ(8, 4, 16, learning="ema", quantizer_dropout=1.0, dropout_min_stages=2)
    layer(x)  # initialise
    with torch.no_grad():  # training mode without updates: the codebooks decode stays valid
        out = layer(x)
    stages = out.num_stages
    assert stages.shape == (64,) and stages.dtype == torch.int64
    assert stages.min() >= 2 and stages.max() <= 4 and len(stages.unique()) == 3
    for b in range(64):  # each sample is the sum of its first n stages
        n = int(stages[b])
        torch.testing.assert_close(out.quantized[b], layer.decode(out.codes[b], num_stages=n))
    prefix = layer.decode(out.codes[:, :, :2], num_stages=2)
    torch.testing.assert_close(prefix, layer.decode(out.codes, num_stages=2))
    layer.eval()
    out = layer(x)
    assert (out.num_stages == 4).all()
    torch.testing.assert_close(out.quantized, layer.decode(out.codes))


def test_quantizer_dropout_probability():
    torch.manual_seed(0)
    layer = vq.ResidualVQ(8, 4, 16, learning="ema", quantizer_dropout=0.25)
    out = layer(clustered(4000, 8))
    dropped = (out.num_stages < 4).float().mean()  # P(drop) · P(n < 4) = 0.25 · 3/4
    assert abs(float(dropped) - 0.1875) < 0.03


def test_residual_stages_learn_the_residuals():
    torch.manual_seed(0)
    x = clustered(4096, 8, centers=64, spread=0.3)
    one = vq.VectorQuantizer(8, 16, learning=vq.EMA(decay=0.8))
    stack = vq.ResidualVQ(8, 3, 16, learning=vq.EMA(decay=0.8))
    for _ in range(10):
        one(x), stack(x)
    err_one = ((x - one.decode(one.encode(x))) ** 2).mean()
    err_stack = ((x - stack.decode(stack.encode(x))) ** 2).mean()
    assert err_stack < 0.5 * err_one
    assert stack(x).perplexity.shape == (3,)


# --- layouts, masks, projections, cosine, precision ---------------------------------------------
def test_channel_first_layout():
    torch.manual_seed(0)
    a = vq.ResidualVQ(8, 2, 16, learning="ema", channel_first=True)
    b = vq.ResidualVQ(8, 2, 16, learning="ema")
    x = clustered(2 * 30, 8).reshape(2, 5, 6, 8)
    torch.manual_seed(1)
    out_a = a(x.permute(0, 3, 1, 2))  # [B, D, H, W]
    torch.manual_seed(1)
    out_b = b(x)
    assert out_a.quantized.shape == (2, 8, 5, 6) and out_a.codes.shape == (2, 5, 6, 2)
    torch.testing.assert_close(out_a.quantized, out_b.quantized.permute(0, 3, 1, 2))
    assert torch.equal(out_a.codes, out_b.codes)
    assert torch.equal(a.codebooks, b.codebooks)
    with pytest.raises(ValueError, match=r"channel-first input \[B, 8, \.\.\.\], got shape"):
        a(x)


def test_padding_mask_leaves_padding_out():
    torch.manual_seed(0)
    learning = vq.EMA(kmeans_init=False, decay=0.5)
    masked, plain = (vq.VectorQuantizer(4, 8, learning=learning) for _ in range(2))
    plain.load_state_dict(masked.state_dict())
    x = clustered(3 * 7, 4).reshape(3, 7, 4)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 5:] = mask[2, 2:] = False
    x_padded = torch.where(mask[..., None], x, torch.full_like(x, 50.0))
    out = masked(x_padded, mask=mask)
    ref = plain(x[mask])
    assert (out.quantized[~mask] == 0).all()
    torch.testing.assert_close(out.quantized[mask], ref.quantized)
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(out.perplexity, ref.perplexity)
    assert_same_state(state(masked), state(plain))  # padding never reached the statistics
    with pytest.raises(ValueError, match=r"mask: expected shape \(3, 7\)"):
        masked(x, mask=mask[:, :3])
    with pytest.raises(TypeError, match="mask: expected a bool tensor"):
        masked(x, mask=mask.float())


def test_factorized_codes_round_trip_and_tables():
    torch.manual_seed(0)
    x = clustered(512, 16)
    for layer in (
        vq.VectorQuantizer(16, 32, learning="ema", codebook_dim=4),
        vq.ResidualVQ(16, 3, 16, learning="ema", codebook_dim=4),
    ):
        out = layer(x)
        assert layer.project_in.weight.shape == (4, 16)
        assert out.quantized.shape == x.shape
        layer.eval()
        out = layer(x)
        torch.testing.assert_close(out.quantized, layer.decode(layer.encode(x)))
        codes = torch.as_tensor(layer.encode(x[:50])).long().reshape(50, -1)
        x_hat = layer.decode(layer.encode(x[:50]))
        q = x[50:53]
        ip = layer.distance_tables(q, "ip")
        cols = torch.arange(codes.shape[1])
        sums = torch.stack([ip[:, cols, c].sum(1) for c in codes], dim=1)
        torch.testing.assert_close(sums, q @ x_hat.T, rtol=1e-4, atol=1e-3)


def test_cosine_codebooks():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(8, 16, learning="ema", cosine=True)
    x = clustered(512, 8) * torch.rand(512, 1) * 5  # directions matter, not norms
    for _ in range(3):
        layer(x)
    torch.testing.assert_close(layer.codebook.norm(dim=1), torch.ones(16))
    best = (F.normalize(x, dim=1) @ layer.codebook.T).argmax(1)
    assert (best == layer.encode(x).long()).float().mean() > 0.999
    pq = vq.ProductQuantizer(8, 2, nbits=3, learning="ema", cosine=True)
    pq(x)
    torch.testing.assert_close(pq.codebooks.norm(dim=-1), torch.ones(2, 8))


def test_bfloat16_autocast_quantizes_in_float32():
    torch.manual_seed(0)
    layer = vq.VectorQuantizer(64, 256, learning="ema")
    x = clustered(2048, 64, centers=256, spread=0.5)
    layer(x)
    xb = (x + 0.01 * torch.randn_like(x)).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(xb)
    assert out.quantized.dtype == torch.bfloat16
    assert torch.equal(out.codes, layer.encode(xb.float()))


# --- purity, persistence, errors ----------------------------------------------------------------
def test_encode_decode_eval_and_no_grad_change_nothing():
    layer = vq.ResidualVQ(8, 2, 16, learning=vq.EMA(dead_code_threshold=1.0))
    x = clustered(256, 8)
    layer(x)
    before = state(layer)
    layer.decode(layer.encode(x))
    layer.distance_tables(x[:3])
    with torch.no_grad():
        layer(x)
    layer.eval()
    layer(x)
    assert_same_state(before, state(layer))


def test_state_dict_round_trip_of_a_trained_layer():
    x = clustered(256, 8)
    layer = vq.ProductQuantizer(8, 2, nbits=4, learning=vq.EMA(dead_code_threshold=0.5))
    layer(x)
    fresh = vq.ProductQuantizer(8, 2, nbits=4, learning=vq.EMA(dead_code_threshold=0.5))
    assert not fresh.is_trained
    fresh.load_state_dict(layer.state_dict())
    assert fresh.is_trained and fresh.learner.initted.all()
    assert torch.equal(fresh.encode(x), layer.encode(x))
    assert set(layer.state_dict()) == {
        "trained",
        "codebooks",
        "learner.initted",
        "learner.cluster_size",
        "learner.embed_sum",
    }
    # fit-only quantizers keep their old state (indexes save these)
    assert set(vq.VectorQuantizer(8, 4).state_dict()) == {"trained", "codebook"}


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: vq.VectorQuantizer(8, 4, learning="adam"), ValueError, "learning must be None"),
        (lambda: vq.EMA(decay=1.0), ValueError, r"decay must lie in \[0, 1\)"),
        (lambda: vq.Gradient(dead_code_threshold=-1), ValueError, "dead_code_threshold"),
        (lambda: vq.EMA(dead_code_ratio=1.0), ValueError, r"dead_code_ratio must lie in \[0, 1\)"),
        (
            lambda: vq.EMA(dead_code_threshold=2.0, dead_code_ratio=0.1),
            ValueError,
            "set one of them",
        ),
        (lambda: vq.EMA(reset_ratio=0.1), ValueError, "goes with dead_code_ratio > 0"),
        (lambda: vq.EMA(smoothing="lapalce"), ValueError, "smoothing must be 'laplace' or"),
        (lambda: vq.ResidualVQ(8, 4, 4, quantizer_dropout=2), ValueError, "quantizer_dropout"),
        (lambda: vq.ResidualVQ(8, 4, 4, dropout_min_stages=5), ValueError, "dropout_min_stages"),
        (lambda: vq.VectorQuantizer(8, 4, codebook_dim=0), ValueError, "codebook_dim"),
        (lambda: vq.VectorQuantizer(8, 4, commitment_weight=-1), ValueError, "commitment_weight"),
        (lambda: vq.FSQ([8, 1]), ValueError, "integers >= 2"),
    ],
)
def test_bad_layer_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_forward_errors_say_what_to_do():
    with pytest.raises(RuntimeError, match="learning='ema'"):
        vq.VectorQuantizer(8, 4)(torch.randn(3, 8))
    layer = vq.VectorQuantizer(8, 4, learning="ema")
    with pytest.raises(ValueError, match="x: expected vectors of dim 8, got 7"):
        layer(torch.randn(3, 7))
    with pytest.raises(TypeError, match="x: expected floating-point vectors, got int64"):
        layer(torch.ones(3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="1 NaN/Inf values"):
        layer(torch.tensor([[float("nan")] + [0.0] * 7]))
    rvq = vq.ResidualVQ(8, 2, 4, learning=vq.EMA(kmeans_init=False))
    with pytest.raises(ValueError, match=r"num_stages must lie in \[1, 2\]"):
        rvq.decode(torch.zeros(3, 2, dtype=torch.long), num_stages=3)
    with pytest.raises(ValueError, match=r"expected codes \[\.\.\., 2\] or \[\.\.\., 1\]"):
        rvq.decode(torch.zeros(3, 5, dtype=torch.long), num_stages=1)


# --- FSQ ---------------------------------------------------------------------------------------
def test_fsq_refuses_a_grid_past_its_code_limit():
    """2^24 codes is the limit (the usage counts of every step hold one float per code); past
    it, and past int64 (levels whose product overflows it), a ValueError that says so."""
    assert vq.FSQ([8] * 8).codebook_size == 1 << 24
    with pytest.raises(ValueError, match=r"give 33,554,432 codes; FSQ takes at most 16,777,216"):
        vq.FSQ([8] * 8 + [2])
    with pytest.raises(ValueError, match=r"FSQ takes at most 16,777,216 \(2\^24"):
        vq.FSQ([2] * 70)
    with pytest.raises(ValueError, match=r"FSQ takes at most"):
        vq.ResidualFSQ(dim=16, levels=[16] * 7, num_quantizers=2)


def test_fsq_grid_codes_and_gradients():
    fsq = vq.FSQ([8, 5, 5, 5])
    assert fsq.codebook_size == 1000 and fsq.is_trained and fsq.code_dtype == torch.int16
    grid = fsq.decode(torch.arange(1000))
    assert grid.shape == (1000, 4) and len(grid.unique(dim=0)) == 1000
    for i, levels in enumerate((8, 5, 5, 5)):
        assert len(grid[:, i].unique()) == levels and grid[:, i].abs().max() <= 1.0
    for levels in (8, 5):  # one dimension: a monotone staircase of `levels` steps
        line = vq.FSQ([levels])
        sweep = torch.linspace(-8, 8, 4001)[:, None]
        codes = torch.as_tensor(line.encode(sweep)).long()
        assert torch.equal(codes.unique(), torch.arange(levels))
        assert (codes.diff() >= 0).all()
    codes = torch.as_tensor(fsq.encode(torch.randn(20000, 4) * 2)).long()
    assert codes.min() >= 0 and codes.max() < 1000 and len(codes.unique()) > 900
    z = torch.randn(4, 50, 4, requires_grad=True)
    out = fsq(z)
    torch.testing.assert_close(out.quantized, fsq.decode(out.codes))
    assert out.loss == 0 and out.codes.shape == (4, 50)
    out.quantized.sum().backward()
    bounded = torch.func.grad(lambda t: (fsq._bound(t) / fsq._half_width(t.dtype)).sum())
    torch.testing.assert_close(z.grad, bounded(z.detach()))  # rounding passes straight through
    assert (z.grad > 0).all()
    assert 1 < out.perplexity <= 1000 and 0 < out.usage <= 0.2


def test_fsq_projections_and_tables():
    torch.manual_seed(0)
    fsq = vq.FSQ([4, 4, 3], dim=16, channel_first=True)
    x = torch.randn(2, 16, 9)
    out = fsq(x)
    assert out.quantized.shape == (2, 16, 9) and out.codes.shape == (2, 9)
    rows = x.transpose(1, 2)
    torch.testing.assert_close(out.quantized.transpose(1, 2), fsq.decode(fsq.encode(rows)))
    q, db = torch.randn(3, 16), rows.reshape(-1, 16)
    tables = fsq.distance_tables(q)
    exact = torch.cdist(q, fsq.decode(fsq.encode(db))) ** 2
    got = tables[:, 0, fsq.encode(db).long()]
    torch.testing.assert_close(got, exact, rtol=1e-4, atol=1e-3)
    assert fsq.fit(db) is fsq


# --- compile and export ------------------------------------------------------------------------
def test_compiled_training_step_has_one_graph_and_matches_eager():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x = clustered(4 * 64, 16, centers=32).reshape(4, 64, 16)
    make = lambda: vq.ResidualVQ(  # noqa: E731
        16, 2, 32, learning=vq.EMA(decay=0.9, dead_code_threshold=0.5), quantizer_dropout=0.5
    )
    compiled_layer, eager_layer = make(), make()

    def step(layer, x):
        out = layer(x)
        return out.loss + out.quantized.square().mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for i in range(4):
        xi = x + 0.01 * i
        torch.manual_seed(i)
        compiled(compiled_layer, xi.clone().requires_grad_()).backward()
        if i == 1:
            graphs = counters["stats"]["unique_graphs"]
        torch.manual_seed(i)
        step(eager_layer, xi.clone().requires_grad_()).backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == graphs == 1  # no recompile after warm-up
    assert compiled_layer.is_trained and compiled_layer.learner.initted.all()
    # the k-means initialisation ran inside the graph (torch.cond): as good as in eager mode
    ours = ((x - compiled_layer.decode(compiled_layer.encode(x))) ** 2).mean()
    ref = ((x - eager_layer.decode(eager_layer.encode(x))) ** 2).mean()
    assert ours < 1.5 * ref and ref < 1.5 * ours


def test_compiled_initialisation_equals_eager():
    x = clustered(512, 8, centers=16)
    layers = [vq.VectorQuantizer(8, 16, learning=vq.EMA(decay=0.9)) for _ in range(2)]
    compiled = torch.compile(layers[0], fullgraph=True, backend="aot_eager")
    for i in range(2):
        torch.manual_seed(i)
        compiled(x + i)
        torch.manual_seed(i)
        layers[1](x + i)
    assert layers[0].learner.initted.all()
    for key, value in state(layers[1]).items():
        torch.testing.assert_close(state(layers[0])[key], value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: vq.VectorQuantizer(8, 16, learning="grad", codebook_dim=4, rotation_trick=True),
        lambda: vq.ResidualVQ(8, 2, 16, beam_size=2, learning="ema", channel_first=True),
        lambda: vq.ProductQuantizer(8, 2, nbits=4, learning="ema", cosine=True),
        lambda: vq.FSQ([5, 4, 3], dim=8),
    ],
    ids=["vq", "rvq", "pq", "fsq"],
)
def test_eval_forward_exports(make):
    layer = make()
    x = clustered(3 * 40, 8).reshape(3, 40, 8)
    if layer.channel_first:
        x = x.transpose(1, 2).contiguous()
    layer(x)  # initialise
    layer.eval()
    program = torch.export.export(layer, (x,), strict=True)
    ours, ref = program.module()(x), layer(x)
    assert torch.equal(ours.codes, ref.codes)
    torch.testing.assert_close(ours.quantized, ref.quantized)
    torch.testing.assert_close(ours.perplexity, ref.perplexity)


# --- torch.distributed -------------------------------------------------------------------------
_DDP_SCRIPT = """
import sys, torch, torch.distributed as dist
from safetensors.torch import save_file
from torch._dynamo.utils import counters
import vq

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(100 + rank)  # every process draws its own data and random numbers
layers = {  # the compiled layer first: its k-means starts numba's threads inside the graph
    "compiled": vq.ResidualVQ(8, 2, 16, learning=vq.EMA(decay=0.8, dead_code_threshold=1.0)),
    "vq": vq.VectorQuantizer(8, 32, learning=vq.EMA(decay=0.8, dead_code_threshold=2.0)),
    "rvq": vq.ResidualVQ(8, 2, 16, learning=vq.EMA(dead_code_threshold=1.0),
                         quantizer_dropout=0.5),
    "grad": vq.VectorQuantizer(8, 16, learning=vq.Gradient(dead_code_threshold=1.0)),
}
compiled = torch.compile(layers["compiled"], fullgraph=True, backend="aot_eager")
for step in range(4):
    for name, layer in layers.items():
        x = torch.randn(2, 64 + 16 * rank, 8) * (1 + rank) + rank  # other data on each process
        x.requires_grad_()  # an encoder's output
        out = compiled(x) if name == "compiled" else layer(x)
        out.loss.backward()
        if name == "grad":
            for p in layer.parameters():  # what DDP does with gradients
                dist.all_reduce(p.grad)
                p.data -= 0.1 * p.grad / dist.get_world_size()
                p.grad = None
    if rank == 1:  # eval and no-grad forwards on one process only: nothing may communicate
        with torch.no_grad():
            layers["vq"](torch.randn(5, 8))
        layers["rvq"].eval()
        layers["rvq"](torch.randn(5, 8))
        layers["rvq"].train()
tensors = {f"{n}.{k}": v.contiguous() for n, l in layers.items() for k, v in l.state_dict().items()}
tensors["graphs"] = torch.tensor(counters["stats"]["unique_graphs"])
save_file(tensors, f"{sys.argv[1]}/rank{rank}.safetensors")
dist.destroy_process_group()
"""


def test_torchrun_keeps_codebooks_identical_across_processes(tmp_path):
    from safetensors.torch import load_file

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_DDP_SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run(
        [*cmd, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = load_file(tmp_path / "rank0.safetensors"), load_file(tmp_path / "rank1.safetensors")
    assert a.keys() == b.keys() and "vq.learner.embed_sum" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert int(a["graphs"]) == 1  # compiled steps: one graph on each process, no recompile
    assert a["vq.learner.initted"].all() and a["vq.codebook"].abs().sum() > 0
