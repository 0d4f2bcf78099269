"""GroupedResidualVQ learning by EMA against vector-quantize-pytorch's GroupedResidualVQ at the
bench's configuration (bench/vqvae_layers.py: EMA 0.99, commitment 0.25, each stage straight
through) with the anchor's EMA rule (1.34: ``smoothing="codeword"``) and a dead-code threshold of
a tenth of the mean usage: from the same codebooks and statistics, one training step gives
the anchor's codes, output, loss, input gradient and EMA state. (The two libraries' k-means
initialisations and dead-code draws use their own random numbers, so the start is copied and
restarted codes are checked for what they are, not for which batch row they took.)"""

import pytest
import torch

import vq

D, G, Q, K = 16, 2, 3, 32


def pair(ratio: float):
    """vq's layer after one training step (its k-means initialisation and first EMA update), and
    the anchor's holding the same codebooks, usage counts and sums."""
    vqp = pytest.importorskip("vector_quantize_pytorch")
    torch.manual_seed(0)
    learning = vq.EMA(decay=0.99, kmeans_iters=10, smoothing="codeword", dead_code_ratio=ratio)
    ours = vq.GroupedResidualVQ(
        D, G, Q, K, learning=learning, commitment_weight=0.25, per_stage_gradient=True
    )
    theirs = vqp.GroupedResidualVQ(
        dim=D, groups=G, num_quantizers=Q, codebook_size=K, commitment_weight=0.25,
        rotation_trick=False, decay=0.99, kmeans_init=True, kmeans_iters=10,
        dead_code_threshold_ratio=ratio,
    )  # fmt: skip
    ours(torch.randn(4, 64, D, generator=torch.Generator().manual_seed(2)))
    with torch.no_grad():
        for rvq, anchor in zip(ours.rvqs, theirs.rvqs, strict=True):
            for m, layer in enumerate(anchor.layers):
                book = layer._codebook
                book.embed.copy_(rvq.codebooks[m][None])
                book.cluster_size.copy_(rvq.learner.cluster_size[m][None])
                book.embed_avg.copy_(rvq.learner.embed_sum[m][None])
                book.initted.fill_(True)
    return ours, theirs


def states(ours, theirs):
    """(vq's, the anchor's) codebooks [G, Q, K, d/G], usage counts [G, Q, K] and sums."""
    books = [[layer._codebook for layer in anchor.layers] for anchor in theirs.rvqs]
    mine = [torch.stack([r.codebooks for r in ours.rvqs])]
    mine += [torch.stack([r.learner.cluster_size for r in ours.rvqs])]
    mine += [torch.stack([r.learner.embed_sum for r in ours.rvqs])]
    anchor = [
        torch.stack([torch.cat([getattr(b, name) for b in group]) for group in books])
        for name in ("embed", "cluster_size", "embed_avg")
    ]
    return mine, anchor


def step(ours, theirs):
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(4, 64, D, generator=g), torch.randn(4, 64, D, generator=g)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(x_ours)
    quantized, indices, losses = theirs(x_theirs)  # indices [G, B, T, Q], losses [G, Q]
    assert torch.equal(out.codes.long(), indices.permute(1, 2, 0, 3))
    torch.testing.assert_close(out.quantized, quantized)
    torch.testing.assert_close(out.loss, losses.mean())  # commitment 0.25, mean over G and Q
    ((out.quantized * target).sum() + out.loss).backward()
    ((quantized * target).sum() + losses.mean()).backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    return x, out.codes.long()


def test_grouped_residual_ema_step_equals_vector_quantize_pytorch():
    ours, theirs = pair(ratio=0.0)
    before = states(ours, theirs)[0]
    step(ours, theirs)
    mine, anchor = states(ours, theirs)
    for a, b, old in zip(mine, anchor, before, strict=True):
        assert not torch.equal(a, old)  # the step moved every statistic
        torch.testing.assert_close(a, b)


def test_grouped_residual_dead_codes_restart_as_the_anchors():
    """The same codes fall below a tenth of their codebook's mean usage on both sides; they
    restart from rows of their stage's input with usage reset to that line, and every other
    code equals the anchor's."""
    ours, theirs = pair(ratio=0.1)
    old_books, old_sizes = (t.clone() for t in states(ours, theirs)[0][:2])
    x, codes = step(ours, theirs)
    (books, sizes, _), (a_books, a_sizes, _) = states(ours, theirs)
    torch.testing.assert_close(sizes, a_sizes)
    codes = codes.reshape(-1, G, Q)
    counts = torch.stack([torch.bincount(c, minlength=K) for c in codes.reshape(-1, G * Q).T])
    usage = old_sizes.lerp(counts.reshape(G, Q, K).float(), 0.01)  # the EMA of usage
    line = 0.1 * usage.mean(-1, keepdim=True)
    restarted = usage < line
    assert 0 < int(restarted.sum()) < restarted.numel()
    torch.testing.assert_close(sizes[restarted], line.expand_as(usage)[restarted])
    torch.testing.assert_close(sizes[~restarted], usage[~restarted])
    torch.testing.assert_close(books[~restarted], a_books[~restarted])
    # stage m's input: the group's channels minus the codewords the stages before drew
    for g in range(G):
        residual = x.reshape(-1, D).chunk(G, -1)[g].clone()
        for m in range(Q):
            rows = books[g, m][restarted[g, m]]
            exact = "donot_use_mm_for_euclid_dist"  # the matrix-product form is off by ~1e-3
            hits = torch.cdist(rows, residual, compute_mode=exact).amin(1)
            assert bool((hits < 1e-5).all())  # every restarted codeword is a batch row
            residual -= old_books[g, m][codes[:, g, m]]
