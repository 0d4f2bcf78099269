"""vq.compat against vector-quantize-pytorch (the anchor, an optional oracle: the comparisons
skip when it is not installed): the anchor's README examples run with vq.compat standing in for
it, give the anchor's shapes, dtypes and — built from the same seed — its codes, outputs and
losses; one training step equals the anchor's (codebooks, EMA statistics, gradients); every
constructor argument of the anchor is either taken with its default or refused by name; the
eval forward exports; a 200-step training of an autoencoder ends at the anchor's loss."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import vq
import vq.compat as compat
from vq.compat.finite_scalar import FSQ_REFUSED, RESIDUAL_FSQ_REFUSED
from vq.compat.lookup_free import LFQ_REFUSED, RESIDUAL_LFQ_REFUSED
from vq.compat.refusals import is_default
from vq.compat.residual_vq import GROUPED_RESIDUAL_VQ_REFUSED, RESIDUAL_VQ_REFUSED
from vq.compat.simvq import RESIDUAL_SIMVQ_REFUSED, SIMVQ_REFUSED
from vq.compat.vector_quantize import VECTOR_QUANTIZE_REFUSED


@pytest.fixture(scope="module")
def anchor():
    return pytest.importorskip("vector_quantize_pytorch")


def both(anchor, make, call, seed: int = 0):
    """``call(make(library))`` for the anchor and vq.compat, each built after
    ``torch.manual_seed(seed)`` → (theirs, ours)."""
    results = []
    for library in (anchor, compat):
        torch.manual_seed(seed)
        results.append(call(make(library)))
    return results


def structure(out):
    """Shapes and dtypes of a (nested) tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return tuple(out.shape), out.dtype
    return type(out).__name__, [structure(t) for t in out]


def randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same_codes(theirs, ours, ties: float = 0.0, channels_first: bool = False):
    """Equal ``(quantized, indices, ...)``: the same codes but for at most a fraction ``ties`` of
    the vectors (near-ties: the anchor's distances are square roots of sums that include
    ``||x||²``, vq's do not) and the same quantized vectors wherever the codes agree."""
    codes, their_codes = ours[1], theirs[1]
    assert codes.shape == their_codes.shape and codes.dtype == their_codes.dtype
    quantized, their_quantized = ours[0], theirs[0]
    if channels_first:
        quantized, their_quantized = quantized.movedim(1, -1), their_quantized.movedim(1, -1)
    agree = codes == their_codes
    if agree.dim() == quantized.dim():  # a last axis of heads or stages
        agree = agree.all(-1)
    assert float(1 - agree.float().mean()) <= ties, float(1 - agree.float().mean())
    torch.testing.assert_close(quantized[agree], their_quantized[agree].detach())


# -- the anchor's README, with vq.compat standing in ------------------------------------------
def test_readme_vector_quantize(anchor):
    x = randn(1, 1024, 256)
    theirs, ours = both(
        anchor,
        lambda lib: lib.VectorQuantize(
            dim=256, codebook_size=512, decay=0.8, commitment_weight=1.0
        ),
        lambda layer: layer(x),
    )
    quantized, indices, commit_loss = ours  # (1, 1024, 256), (1, 1024), ()
    assert structure(ours) == structure(theirs)
    assert quantized.shape == (1, 1024, 256) and indices.shape == (1, 1024)
    assert commit_loss.shape == () and indices.dtype == torch.int64
    assert_same_codes(theirs, ours, ties=0.002)
    torch.testing.assert_close(commit_loss, theirs[2], rtol=1e-4, atol=0)


def test_readme_residual_vq(anchor):
    x = randn(1, 1024, 256)

    def make(lib):
        return lib.ResidualVQ(dim=256, num_quantizers=8, codebook_size=1024)

    theirs, ours = both(anchor, make, lambda layer: layer(x))
    quantized, indices, commit_loss = ours
    assert structure(ours) == structure(theirs)
    assert (quantized.shape, indices.shape, commit_loss.shape) == (
        (1, 1024, 256),
        (1, 1024, 8),
        (8,),
    )
    assert_same_codes(theirs, ours, ties=0.01)  # 8 stages of near-ties (a tiny random start)
    torch.testing.assert_close(commit_loss, theirs[2].detach(), rtol=1e-4, atol=1e-6)
    theirs, ours = both(anchor, make, lambda layer: layer(x, return_all_codes=True))
    assert structure(ours) == structure(theirs) and ours[3].shape == (8, 1, 1024, 256)
    for layer in (make(anchor), make(compat)):  # decoding indices gives the eval output
        layer.eval()
        quantized, indices, _, all_codes = layer(x, return_all_codes=True)
        torch.testing.assert_close(layer.get_output_from_indices(indices), quantized)
        torch.testing.assert_close(all_codes.sum(0), quantized)  # no projections here


def test_readme_residual_vq_options_vq_does_not_have_are_refused_by_name():
    with pytest.raises(ValueError, match=r"diveq=True is not supported by vq\.compat"):
        compat.ResidualVQ(dim=256, num_quantizers=8, codebook_size=1024, diveq=True)
    with pytest.raises(ValueError, match=r"stochastic_sample_codes=True is not supported"):
        compat.ResidualVQ(
            dim=256, num_quantizers=8, codebook_size=1024, stochastic_sample_codes=True,
            sample_codebook_temp=0.1, shared_codebook=True,
        )  # fmt: skip


def test_readme_grouped_residual_vq(anchor):
    x = randn(1, 1024, 256)
    theirs, ours = both(
        anchor,
        lambda lib: lib.GroupedResidualVQ(dim=256, num_quantizers=8, groups=2, codebook_size=1024),
        lambda layer: layer(x),
    )
    assert structure(ours) == structure(theirs)
    assert ours[1].shape == (2, 1, 1024, 8) and ours[2].shape == (2, 8)
    flat = [(t[0], t[1].movedim(0, -2).flatten(-2)) for t in (theirs, ours)]  # [..., G · Q]
    assert_same_codes(*flat, ties=0.01)
    torch.testing.assert_close(ours[2], theirs[2].detach(), rtol=1e-4, atol=1e-6)
    layer = compat.GroupedResidualVQ(dim=256, num_quantizers=8, groups=2, codebook_size=1024)
    quantized, indices, _ = layer.eval()(x)
    torch.testing.assert_close(layer.get_output_from_indices(indices), quantized)


def test_readme_kmeans_init_runs_kmeans_on_the_first_batch(anchor):
    x = randn(1, 1024, 256)

    def make(lib):
        return lib.ResidualVQ(
            dim=256, codebook_size=256, num_quantizers=4, kmeans_init=True, kmeans_iters=10
        )

    layer = make(compat)
    assert not layer.layer.learner.initted.any() and not layer.codebooks.any()
    theirs, ours = both(anchor, make, lambda layer: layer(x))
    assert structure(ours) == structure(theirs) and ours[1].shape == (1, 1024, 4)
    # both libraries' k-means fit the first stage to this batch alike, far below the ~1.0 of
    # a random start (their own random numbers: not the same codes)
    first, anchors_first = float(ours[2][0]), float(theirs[2][0].detach())
    assert abs(first / anchors_first - 1) < 0.05 and first < 0.9
    layer(x)
    assert bool(layer.layer.learner.initted.all()) and bool(layer.codebooks.any())


def test_readme_rotation_trick_passes_the_anchors_gradient(anchor):
    g = torch.Generator().manual_seed(1)
    x, target = 0.05 * torch.randn(2, 64, 256, generator=g), torch.randn(2, 64, 256, generator=g)
    grads = []
    for rotation_trick in (True, False):

        def step(layer):
            xi = x.clone().requires_grad_()
            quantized, _, loss = layer(xi)
            ((quantized * target).sum() + loss).backward()
            return xi.grad

        theirs, ours = both(
            anchor,
            lambda lib, rotate=rotation_trick: lib.VectorQuantize(
                dim=256, codebook_size=256, rotation_trick=rotate
            ),
            step,
        )
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        grads.append(ours)
    assert not torch.allclose(grads[0], grads[1])  # the rotation trick is not straight through


def test_readme_directional_reparam_is_refused_by_name():
    with pytest.raises(ValueError, match=r"directional_reparam=True is not supported"):
        compat.VectorQuantize(
            dim=256, codebook_size=256, directional_reparam=True, directional_reparam_variance=5e-3
        )


@pytest.mark.parametrize(
    "options",
    [
        dict(codebook_size=256, codebook_dim=16),
        dict(codebook_size=256, use_cosine_sim=True),
        dict(codebook_size=512, dead_code_threshold_ratio=0.5),
    ],
    ids=["codebook_dim", "cosine", "dead-codes"],
)
def test_readme_codebook_usage_options(anchor, options):
    x = randn(1, 1024, 256)

    def make(lib):
        return lib.VectorQuantize(dim=256, **options)

    theirs, ours = both(anchor, make, lambda layer: (layer, layer(x)))
    assert structure(ours[1]) == structure(theirs[1])
    assert ours[1][1].shape == (1, 1024) and ours[1][2].shape == ()
    assert_same_codes(theirs[1], ours[1], ties=0.002)
    if "dead_code_threshold_ratio" in options:  # the same codes restarted, from batch vectors
        sizes = ours[0].layer.learner.cluster_size[0]
        torch.testing.assert_close(sizes, theirs[0]._codebook.cluster_size[0])
        usage = 0.2 * torch.bincount(ours[1][1].reshape(-1), minlength=512)  # the EMA, from 0
        line = 0.5 * usage.mean()
        restarted = usage < line
        assert 0 < int(restarted.sum()) < 512
        torch.testing.assert_close(sizes[restarted], line.expand(int(restarted.sum())))
        rows = ours[0].layer.codebook[restarted]
        exact = torch.cdist(rows, x[0], compute_mode="donot_use_mm_for_euclid_dist")
        assert bool((exact.amin(1) < 1e-5).all())


def test_deprecated_dead_code_arguments_convert_as_the_anchors(anchor):
    """1.34's deprecated absolute arguments: ``v >= 1`` is taken as ``v / codebook_size``, a
    smaller value as the ratio itself, with a warning naming the new argument; the restarts
    then equal the anchor's."""
    x = randn(1, 1024, 256)

    def make(lib):
        return lib.VectorQuantize(
            dim=256, codebook_size=512, threshold_ema_dead_code=256, reset_cluster_size=0.25
        )

    with pytest.warns(DeprecationWarning, match="pass dead_code_threshold_ratio"):
        theirs, ours = both(anchor, make, lambda layer: (layer, layer(x)))
    learning = ours[0].layer.learner.learning
    assert (learning.dead_code_ratio, learning.reset_ratio) == (0.5, 0.25)
    sizes = ours[0].layer.learner.cluster_size[0]
    torch.testing.assert_close(sizes, theirs[0]._codebook.cluster_size[0])
    assert_same_codes(theirs[1], ours[1], ties=0.002)


@pytest.mark.parametrize("name", ["threshold_ema_dead_code", "reset_cluster_size"])
@pytest.mark.parametrize("value", [-1, -0.5, float("nan")])
def test_a_negative_deprecated_dead_code_argument_is_refused_by_its_own_name(name, value):
    """Refused before any conversion or warning, naming the argument the caller passed (not
    the ratio it would have become)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no deprecation warning before the error)
        for layer, more in (
            (compat.VectorQuantize, {}),
            (compat.ResidualVQ, {"num_quantizers": 2}),
        ):
            message = rf"{layer.__name__}: {name} must be >= 0 .* got {value}"
            with pytest.raises(ValueError, match=message):
                layer(dim=8, codebook_size=16, **more, **{name: value})


def test_readme_image_feature_map_and_orthogonal_regularisation(anchor):
    img_fmap = randn(1, 256, 32, 32)
    with pytest.raises(ValueError, match=r"orthogonal_reg_weight=10 is not supported"):
        compat.VectorQuantize(
            dim=256, codebook_size=256, accept_image_fmap=True, orthogonal_reg_weight=10,
            orthogonal_reg_max_codes=128, orthogonal_reg_active_codes_only=False,
        )  # fmt: skip
    theirs, ours = both(
        anchor,
        lambda lib: lib.VectorQuantize(dim=256, codebook_size=256, accept_image_fmap=True),
        lambda layer: layer(img_fmap),
    )
    quantized, indices, loss = ours  # (1, 256, 32, 32), (1, 32, 32), ()
    assert structure(ours) == structure(theirs) and indices.shape == (1, 32, 32)
    assert_same_codes(theirs, ours, ties=0.002, channels_first=True)


@pytest.mark.parametrize("separate", [True, False])
def test_readme_multi_headed(anchor, separate):
    img_fmap = randn(1, 256, 32, 32)

    def make(lib):
        return lib.VectorQuantize(
            dim=256, codebook_dim=32, heads=8, separate_codebook_per_head=separate,
            codebook_size=8196 if separate else 512, accept_image_fmap=True,
        )  # fmt: skip

    theirs, ours = both(anchor, make, lambda layer: layer(img_fmap))
    quantized, indices, loss = ours  # (1, 256, 32, 32), (1, 32, 32, 8), ()
    assert structure(ours) == structure(theirs) and indices.shape == (1, 32, 32, 8)
    assert_same_codes(theirs, ours, ties=0.005, channels_first=True)
    torch.testing.assert_close(loss, theirs[2].detach(), rtol=1e-4, atol=1e-6)
    layer = make(compat).eval()
    quantized, indices, _ = layer(img_fmap)
    torch.testing.assert_close(layer.get_output_from_indices(indices), quantized)


def test_readme_sim_vq(anchor):
    x = randn(1, 1024, 512)
    theirs, ours = both(
        anchor,
        lambda lib: lib.SimVQ(dim=512, codebook_size=1024, rotation_trick=True),
        lambda layer: (layer, layer(x)),
    )
    sim_vq, (quantized, indices, commit_loss) = ours
    assert x.shape == quantized.shape
    assert torch.allclose(quantized, sim_vq.indices_to_codes(indices), atol=1e-6)
    assert structure(ours[1]) == structure(theirs[1]) and torch.equal(indices, theirs[1][1])
    torch.testing.assert_close(commit_loss, theirs[1][2])


def test_readme_residual_sim_vq(anchor):
    x = randn(1, 1024, 512)
    theirs, ours = both(
        anchor,
        lambda lib: lib.ResidualSimVQ(
            dim=512, num_quantizers=4, codebook_size=1024, rotation_trick=True
        ),
        lambda layer: (layer, layer(x)),
    )
    residual_sim_vq, (quantized, indices, commit_loss) = ours
    assert x.shape == quantized.shape
    assert torch.allclose(quantized, residual_sim_vq.get_output_from_indices(indices), atol=1e-6)
    assert structure(ours[1]) == structure(theirs[1]) and torch.equal(indices, theirs[1][1])
    torch.testing.assert_close(commit_loss, theirs[1][2])


def test_readme_fsq(anchor):
    x = randn(1, 1024, 4) * 2
    theirs, ours = both(
        anchor, lambda lib: lib.FSQ(levels=[8, 5, 5, 5]), lambda layer: (layer, layer(x))
    )
    quantizer, (xhat, indices) = ours  # (1, 1024, 4), (1, 1024)
    assert torch.all(xhat == quantizer.indices_to_codes(indices))
    assert structure(ours[1]) == structure(theirs[1]) and indices.dtype == torch.int32
    assert torch.equal(indices, theirs[1][1]) and torch.equal(xhat, theirs[1][0])


def test_readme_residual_fsq(anchor):
    x = randn(1, 1024, 256)

    def run(residual_fsq):
        residual_fsq.eval()
        quantized, indices = residual_fsq(x)  # (1, 1024, 256), (1, 1024, 8)
        quantized_out = residual_fsq.get_output_from_indices(indices)
        assert torch.all(quantized == quantized_out)
        return quantized, indices

    theirs, ours = both(
        anchor, lambda lib: lib.ResidualFSQ(dim=256, levels=[8, 5, 5, 3], num_quantizers=8), run
    )
    assert structure(ours) == structure(theirs) and ours[1].shape == (1, 1024, 8)
    assert torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[0], theirs[0])


def test_readme_lfq(anchor):
    image_feats = randn(1, 16, 32, 32)

    def make(lib):
        return lib.LFQ(codebook_size=65536, dim=16, entropy_loss_weight=0.1, diversity_gamma=1.0)

    theirs, ours = both(
        anchor, make, lambda layer: (layer, layer(image_feats, inv_temperature=100.0))
    )
    quantizer, (quantized, indices, entropy_aux_loss) = ours  # (1, 16, 32, 32), (1, 32, 32), ()
    assert (quantized == quantizer.indices_to_codes(indices)).all()
    assert structure(ours[1]) == structure(theirs[1]) and indices.shape == (1, 32, 32)
    assert torch.equal(indices, theirs[1][1]) and torch.equal(quantized, theirs[1][0])
    # the anchor's entropies take logarithms of probabilities clamped at 1e-5
    torch.testing.assert_close(entropy_aux_loss, theirs[1][2], rtol=1e-3, atol=1e-4)
    quantizer = make(compat)
    seq = randn(1, 32, 16)
    quantized, *_ = quantizer(seq)
    assert seq.shape == quantized.shape
    video_feats = randn(1, 16, 10, 32, 32)
    quantized, *_ = quantizer(video_feats)
    assert video_feats.shape == quantized.shape


def test_readme_lfq_multiple_codebooks(anchor):
    image_feats = randn(1, 16, 32, 32)
    theirs, ours = both(
        anchor,
        lambda lib: lib.LFQ(codebook_size=4096, dim=16, num_codebooks=4),
        lambda layer: (layer, layer(image_feats)),
    )
    quantizer, (quantized, indices, entropy_aux_loss) = ours  # (1, 16, 32, 32), (1, 32, 32, 4), ()
    assert image_feats.shape == quantized.shape
    assert (quantized == quantizer.indices_to_codes(indices)).all()
    assert structure(ours[1]) == structure(theirs[1]) and indices.shape == (1, 32, 32, 4)
    assert torch.equal(indices, theirs[1][1])
    torch.testing.assert_close(quantized, theirs[1][0])
    torch.testing.assert_close(entropy_aux_loss, theirs[1][2], rtol=1e-3, atol=1e-4)


def test_readme_residual_lfq(anchor):
    x = randn(1, 1024, 256)

    def run(residual_lfq):
        residual_lfq.eval()
        quantized, indices, commit_loss = residual_lfq(x)  # (1, 1024, 256), (1, 1024, 8), (8,)
        quantized_out = residual_lfq.get_output_from_indices(indices)
        assert torch.all(quantized == quantized_out)
        return quantized, indices, commit_loss

    def make(lib):
        return lib.ResidualLFQ(dim=256, codebook_size=256, num_quantizers=8)

    theirs, ours = both(anchor, make, run)
    assert structure(ours) == structure(theirs) and ours[1].shape == (1, 1024, 8)
    assert torch.equal(ours[1], theirs[1]) and not ours[2].any()
    torch.testing.assert_close(ours[0], theirs[0])
    theirs, ours = both(anchor, make, lambda layer: layer(x))  # training: a loss per stage
    assert torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[2], theirs[2].detach(), rtol=1e-3, atol=1e-5)


# -- one training step ------------------------------------------------------------------------
VQ_STEPS = {
    "ema": dict(),
    "ema-straight-through": dict(rotation_trick=False, commitment_weight=0.25),
    "learnable": dict(learnable_codebook=True, ema_update=False),
    "projected": dict(codebook_dim=8),
    "cosine": dict(use_cosine_sim=True),
    "heads": dict(heads=2, codebook_dim=8, separate_codebook_per_head=True),
}


@pytest.mark.parametrize("name", list(VQ_STEPS))
def test_vector_quantize_training_step_equals_the_anchors(anchor, name):
    """From the same seed: the same codes, output, loss, input gradient, and afterwards the same
    codebooks and EMA statistics (or the same codebook gradient, learning by gradient)."""
    g = torch.Generator().manual_seed(1)
    x, target = 0.05 * torch.randn(2, 64, 16, generator=g), torch.randn(2, 64, 16, generator=g)

    def step(layer):
        xi = x.clone().requires_grad_()
        quantized, indices, loss = layer(xi)
        ((quantized * target).sum() + loss).backward()
        return layer, quantized, indices, loss, xi.grad

    theirs, ours = both(
        anchor, lambda lib: lib.VectorQuantize(dim=16, codebook_size=32, **VQ_STEPS[name]), step
    )
    assert torch.equal(ours[2], theirs[2])
    for a, b in zip(ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    book = theirs[0]._codebook
    if name == "learnable":
        torch.testing.assert_close(ours[0].layer.codebook.grad, book.embed.grad[0])
    elif name == "heads":
        torch.testing.assert_close(ours[0].codebook, book.embed)
    else:
        torch.testing.assert_close(ours[0].layer.codebook, book.embed[0])
        torch.testing.assert_close(ours[0].layer.learner.cluster_size, book.cluster_size)
        torch.testing.assert_close(ours[0].layer.learner.embed_sum, book.embed_avg)


@pytest.mark.parametrize("rotation_trick", [True, False])
def test_residual_vq_training_step_equals_the_anchors(anchor, rotation_trick):
    """Per-stage losses equal the anchor's, and the gradient of their sum reaches the input as
    the anchor's does (every stage's own estimator and commitment)."""
    g = torch.Generator().manual_seed(1)
    x, target = 0.05 * torch.randn(2, 64, 16, generator=g), torch.randn(2, 64, 16, generator=g)

    def step(layer):
        xi = x.clone().requires_grad_()
        quantized, indices, losses = layer(xi)
        ((quantized * target).sum() + losses.sum()).backward()
        return quantized, indices, losses, xi.grad, layer.codebooks

    theirs, ours = both(
        anchor,
        lambda lib: lib.ResidualVQ(
            dim=16, num_quantizers=3, codebook_size=32, rotation_trick=rotation_trick
        ),
        step,
    )
    assert torch.equal(ours[1], theirs[1])
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_eval_mode_loss_is_zero_and_frozen_forwards_change_nothing():
    x = randn(4, 10, 8)
    layer = compat.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16).eval()
    before = layer.codebooks.clone()
    _, _, losses = layer(x)
    assert torch.equal(losses, torch.zeros(2)) and torch.equal(layer.codebooks, before)
    single = compat.VectorQuantize(dim=8, codebook_size=16)
    before = single.codebook.clone()
    _, _, loss = single(x, freeze_codebook=True)  # training mode: a loss, no update
    assert loss > 0 and torch.equal(single.codebook, before)
    single(x)
    assert not torch.equal(single.codebook, before)


# -- masks, dropout, decoding -----------------------------------------------------------------
def test_masked_positions_get_minus_one_and_zeros_or_the_input(anchor):
    x = randn(2, 10, 8)
    mask = torch.arange(10) < torch.tensor([7, 10])[:, None]
    for zeros in (True, False):
        theirs, ours = both(
            anchor,
            lambda lib, zeros=zeros: lib.VectorQuantize(
                dim=8, codebook_size=16, return_zeros_for_masked_padding=zeros
            ),
            lambda layer: layer(x, mask=mask),
        )
        assert torch.equal(ours[1], theirs[1]) and bool((ours[1][0, 7:] == -1).all())
        torch.testing.assert_close(ours[0], theirs[0])
        expected = torch.zeros(3, 8) if zeros else x[0, 7:]
        assert torch.equal(ours[0][0, 7:], expected)
    lens = torch.tensor([7, 10])
    _, by_lens, _ = compat.VectorQuantize(dim=8, codebook_size=16)(x, lens=lens)
    assert torch.equal(by_lens == -1, ~mask)
    _, codes, _ = compat.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16)(x, mask=mask)
    assert torch.equal((codes == -1).all(-1), ~mask) and not bool((codes[mask] == -1).any())


def test_quantize_dropout_writes_minus_one_past_each_samples_stages():
    torch.manual_seed(0)
    layer = compat.ResidualVQ(
        dim=8, num_quantizers=4, codebook_size=16, quantize_dropout=True,
        quantize_dropout_cutoff_index=1,
    )  # fmt: skip
    quantized, codes, losses = layer(torch.randn(64, 5, 8))
    kept = (codes >= 0).sum(-1)  # [64, 5]: stages kept, the same along each sample
    assert bool((kept == kept[:, :1]).all()) and kept.min() >= 2 and kept.max() == 4
    assert len(kept[:, 0].unique()) == 3  # 2, 3 or 4 stages
    assert torch.equal(codes >= 0, torch.arange(4) < kept[..., None])  # a prefix of stages
    layer.eval()
    _, codes, _ = layer(torch.randn(64, 5, 8))
    prefix = layer.layer.decode(codes[..., :2], num_stages=2)  # vq's own prefix decoding
    torch.testing.assert_close(layer.get_output_from_indices(codes[..., :2]), prefix)
    dropped = codes.clone()
    dropped[..., 2:] = -1
    torch.testing.assert_close(layer.get_output_from_indices(dropped), prefix)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: compat.VectorQuantize(dim=8, codebook_size=16, codebook_dim=4), (2, 30, 8)),
        (
            lambda: compat.VectorQuantize(
                dim=8, codebook_size=16, codebook_dim=4, accept_image_fmap=True
            ),
            (2, 8, 6, 5),
        ),
        (lambda: compat.VectorQuantize(dim=8, codebook_size=16, channel_last=False), (2, 8, 30)),
        (
            lambda: compat.VectorQuantize(dim=8, codebook_size=16, heads=2, codebook_dim=2),
            (2, 30, 8),
        ),
        (
            lambda: compat.ResidualVQ(dim=8, num_quantizers=3, codebook_size=16, codebook_dim=4),
            (2, 30, 8),
        ),
        (
            lambda: compat.ResidualVQ(
                dim=8, num_quantizers=2, codebook_size=16, accept_image_fmap=True
            ),
            (2, 8, 6, 5),
        ),
        (
            lambda: compat.GroupedResidualVQ(
                dim=8, groups=2, num_quantizers=2, codebook_size=16, accept_image_fmap=True
            ),
            (2, 8, 6, 5),
        ),
        (lambda: compat.ResidualLFQ(dim=8, num_quantizers=2, codebook_size=16), (2, 30, 8)),
        (lambda: compat.ResidualFSQ(dim=8, levels=[5, 4], num_quantizers=2), (2, 30, 8)),
        (lambda: compat.FSQ(levels=[5, 4], dim=8, num_codebooks=2), (2, 30, 8)),
        (lambda: compat.LFQ(dim=8, codebook_size=16, num_codebooks=2), (2, 8, 6, 5)),
    ],
    ids=[
        "vq",
        "vq-image",
        "vq-channel-first",
        "vq-heads",
        "rvq",
        "rvq-image",
        "grvq-image",
        "rlfq",
        "rfsq",
        "fsq",
        "lfq",
    ],  # fmt: skip
)
def test_decoding_indices_gives_the_eval_output(make, shape):
    torch.manual_seed(0)
    layer = make().eval()
    quantized, indices = layer(torch.randn(shape))[:2]
    decode = getattr(layer, "get_output_from_indices", None) or layer.indices_to_codes
    torch.testing.assert_close(decode(indices), quantized)


# -- what vq's layers gained for the compat layers ----------------------------------------------
def test_stage_commitment_is_each_stages_distance_and_commitment_their_weighted_mean():
    """vq.ResidualVQ's ``stage_commitment`` [Q]: ``||z - P_m||² / d`` over the vectors stage m
    kept (a padding mask and quantizer dropout), by hand from the codes and the codebooks the
    step coded with; ``commitment`` is their mean weighted by the vectors each stage kept."""
    torch.manual_seed(0)
    layer = vq.ResidualVQ(
        8, 3, 16, learning=vq.EMA(kmeans_init=False), quantizer_dropout=0.5
    )  # fmt: skip
    x, mask = randn(32, 5, 8), torch.arange(5) < torch.randint(2, 6, (32, 1))
    books = layer.codebooks.clone()  # the codebooks of this step, before its EMA update
    out = layer(x, mask=mask)
    kept = (torch.arange(3) < out.num_stages[:, None, None]) & mask[..., None]  # [B, T, Q]
    partial = books[torch.arange(3), out.codes.long()].cumsum(-2)  # P_m [B, T, Q, d]
    distances = ((x[..., None, :] - partial) ** 2).sum(-1)  # [B, T, Q]
    rows = kept.sum((0, 1)).float()
    expected = (distances * kept).sum((0, 1)) / (rows * 8)
    assert out.stage_commitment.shape == (3,) and not out.stage_commitment.requires_grad
    torch.testing.assert_close(out.stage_commitment, expected)
    torch.testing.assert_close(out.commitment, (expected * rows).sum() / rows.sum())
    grouped = vq.GroupedResidualVQ(8, 2, 3, 16, learning=vq.EMA(kmeans_init=False))(x)
    assert grouped.stage_commitment.shape == (2, 3)
    torch.testing.assert_close(grouped.commitment, grouped.stage_commitment.mean())
    lfq = vq.ResidualLFQ(8, 3, 16)(x)
    torch.testing.assert_close(lfq.commitment, lfq.stage_commitment.mean())
    assert vq.ResidualFSQ([5, 4], 2, dim=8)(x).stage_commitment is None  # no commitment term


def test_fsq_bound_keeps_every_level_two_included_as_the_anchors():
    """The tanh bound spans ``(L-1)/2 · (1 + 1e-3)`` (vector-quantize-pytorch's): a level count
    of 2 has both its values (the paper's ``1 - 1e-3`` made it NaN), and equal inputs give
    the anchor's codes."""
    fsq = vq.FSQ([2, 4, 3])
    sweep = torch.linspace(-6, 6, 2001)[:, None].expand(-1, 3)
    values = torch.as_tensor(fsq.decode(fsq.encode(sweep)))
    for i, levels in enumerate((2, 4, 3)):  # a monotone staircase through every value
        steps = values[:, i]
        assert steps.unique().numel() == levels and bool((steps.diff() >= 0).all())
    assert sorted(fsq.decode(torch.arange(24))[:, 0].unique().tolist()) == [-1.0, 0.0]
    assert torch.as_tensor(fsq.encode(randn(5000, 3) * 3)).unique().numel() == 24


# -- arguments: the anchor's names and defaults, or refused by name ---------------------------
#: compat class → the anchor classes whose constructor arguments it takes (outer first), the
#: arguments the outer class sets itself, and the table of arguments it refuses
ARGUMENTS = {
    "VectorQuantize": (["VectorQuantize"], set(), VECTOR_QUANTIZE_REFUSED),
    "ResidualVQ": (["ResidualVQ", "VectorQuantize"], set(), RESIDUAL_VQ_REFUSED),
    "GroupedResidualVQ": (
        ["GroupedResidualVQ", "ResidualVQ", "VectorQuantize"],
        set(),
        GROUPED_RESIDUAL_VQ_REFUSED,
    ),
    "SimVQ": (["SimVQ"], set(), SIMVQ_REFUSED),
    "ResidualSimVQ": (["ResidualSimVQ", "SimVQ"], set(), RESIDUAL_SIMVQ_REFUSED),
    "FSQ": (["FSQ"], set(), FSQ_REFUSED),
    "LFQ": (["LFQ"], set(), LFQ_REFUSED),
    "ResidualFSQ": (["ResidualFSQ", "FSQ"], {"preserve_symmetry"}, RESIDUAL_FSQ_REFUSED),
    "ResidualLFQ": (["ResidualLFQ", "LFQ"], {"codebook_scale"}, RESIDUAL_LFQ_REFUSED),
}


def _parameters(fn) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in inspect.signature(fn).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


def _same_default(ours, theirs) -> bool:
    """Whether the anchor's default ``theirs`` is ``ours`` (a class: an instance of it; a
    function: one of that name)."""
    if inspect.isfunction(ours) and inspect.isfunction(theirs):
        return ours.__name__ == theirs.__name__
    return theirs is ours or is_default(theirs, ours)


@pytest.mark.parametrize("name", list(ARGUMENTS))
def test_every_anchor_argument_is_taken_with_its_default_or_refused(anchor, name):
    classes, set_by_outer, table = ARGUMENTS[name]
    theirs: dict[str, inspect.Parameter] = {}
    for cls in classes:
        for arg, p in _parameters(getattr(anchor, cls).__init__).items():
            if arg not in set_by_outer:
                theirs.setdefault(arg, p)
    ours = _parameters(getattr(compat, name).__init__)
    assert set(ours) <= set(theirs), set(ours) - set(theirs)  # no names of our own
    for arg, p in theirs.items():
        if arg in ours:
            assert _same_default(ours[arg].default, p.default), (arg, ours[arg].default, p.default)
        else:
            assert arg in table, f"{name} neither takes nor refuses {arg}"
            assert _same_default(table[arg][0], p.default), (arg, table[arg][0], p.default)
    # forward takes the anchor's arguments, with its defaults
    ours, theirs = (_parameters(getattr(lib, name).forward) for lib in (compat, anchor))
    assert list(ours) == list(theirs)
    for arg, p in theirs.items():
        assert _same_default(ours[arg].default, p.default), arg


def test_refused_and_unknown_arguments_raise_naming_them():
    with pytest.raises(ValueError) as error:
        compat.VectorQuantize(dim=8, codebook_size=16, orthogonal_reg_weight=10)
    assert str(error.value) == (
        "VectorQuantize: orthogonal_reg_weight=10 is not supported by vq.compat (vq has no "
        "orthogonal regularisation of the codebook); leave it at vector-quantize-pytorch's "
        "default, 0.0"
    )
    compat.VectorQuantize(dim=8, codebook_size=16, orthogonal_reg_weight=0.0)  # the default
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'kmeans_inti'"):
        compat.VectorQuantize(dim=8, codebook_size=16, kmeans_inti=True)
    with pytest.raises(ValueError, match=r"straight_through_activation=Tanh\(\) is not supported"):
        compat.LFQ(dim=4, straight_through_activation=torch.nn.Tanh())
    with pytest.raises(ValueError, match=r"use_cosine_sim=True is not supported"):
        compat.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, use_cosine_sim=True)
    with pytest.raises(ValueError, match=r"beam_size=4 is not supported"):
        compat.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16, beam_size=4)
    with pytest.raises(ValueError, match=r"topk=2 is not supported"):
        compat.VectorQuantize(dim=8, codebook_size=16)(torch.randn(2, 3, 8), topk=2)
    with pytest.raises(ValueError, match=r"learnable_codebook=True learns the codebook by"):
        compat.VectorQuantize(dim=8, codebook_size=16, learnable_codebook=True)
    with pytest.raises(ValueError, match=r"sync_codebook=False is not supported"):
        compat.VectorQuantize(dim=8, codebook_size=16, sync_codebook=False)
    with pytest.raises(ValueError, match=r"all have the same size"):
        compat.ResidualVQ(dim=8, codebook_size=(16, 32))


# -- export ---------------------------------------------------------------------------------
EXPORTED = {
    "VectorQuantize": lambda: compat.VectorQuantize(dim=8, codebook_size=16, codebook_dim=4),
    "ResidualVQ": lambda: compat.ResidualVQ(dim=8, num_quantizers=2, codebook_size=16),
    "FSQ": lambda: compat.FSQ(levels=[5, 4, 3], dim=8),
    "LFQ": lambda: compat.LFQ(dim=8, codebook_size=64),
}


@pytest.mark.parametrize("name", list(EXPORTED))
def test_eval_forward_exports_strictly(name):
    torch.manual_seed(0)
    layer = EXPORTED[name]().eval()
    x = torch.randn(3, 40, 8)
    program = torch.export.export(layer, (x,), strict=True)
    ours, ref = program.module()(x), layer(x)
    assert torch.equal(ours[1], ref[1])
    torch.testing.assert_close(ours[0], ref[0])


def test_a_training_step_compiles_to_one_graph():
    """A compat layer's training step (k-means initialisation, EMA update, per-stage losses)
    compiles with ``fullgraph=True``: one graph before and after the initialisation."""
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    layer = compat.ResidualVQ(dim=16, num_quantizers=2, codebook_size=32, kmeans_init=True)

    def step(x):
        quantized, _, losses = layer(x)
        return quantized.square().mean() + losses.sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for i in range(3):  # the first step initialises; the third reuses the graph
        compiled(randn(2, 64, 16, seed=i).requires_grad_()).backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert bool(layer.layer.learner.initted.all())


# -- training -------------------------------------------------------------------------------
def test_training_an_autoencoder_ends_at_the_anchors_loss(anchor):
    """200 Adam steps of the same autoencoder (bench/compat_training.py) around each library's
    VectorQuantize, same seed and batches: the reconstruction MSE of the last 20 steps agree
    within 5% (they start from the same weights and codebooks, so they agree far closer) and
    training reduced it."""
    from bench.compat_training import final_loss, train

    torch.set_num_threads(1)  # the same sums on every machine (and no oversubscribed cores)
    ours, _ = train(compat, "VectorQuantize", seed=0, steps=200, batch=8, length=16)
    theirs, _ = train(anchor, "VectorQuantize", seed=0, steps=200, batch=8, length=16)
    assert abs(final_loss(ours) / final_loss(theirs) - 1) <= 0.05
    assert final_loss(ours) < 0.8 * ours[0]
