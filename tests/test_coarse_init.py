"""``coarse_init``: how an IVF index's coarse k-means starts (k-means++ seeds by default up to
2,048 lists; faiss's random rows on request, for recall parity at equal parameters), and
``spherical``: the coarse k-means with unit-norm centroids."""

import numpy as np
import pytest
import torch

import vq
from vq.distances import unit_rows_np
from vq.index import IVFPQ, IVFSQ, IVFFlat


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_the_coarse_centroids_are_those_of_kmeans_started_as_asked(blobs, init):
    x = torch.from_numpy(blobs[:2000])
    index = IVFFlat(x.shape[1], 16, coarse_init=init, seed=3)
    index.train(x)
    expected = vq.kmeans(x, 16, niter=index.coarse_niter, init=init, seed=3).centroids
    torch.testing.assert_close(index.quantizer.codebook, expected, rtol=0, atol=0)


def test_auto_is_k_means_plus_plus_below_the_threshold(blobs):
    x = torch.from_numpy(blobs[:2000])
    auto, seeded = IVFFlat(x.shape[1], 16, seed=3), IVFFlat(x.shape[1], 16, seed=3,
                                                            coarse_init="k-means++")  # fmt: skip
    auto.train(x)
    seeded.train(x)
    assert torch.equal(auto.quantizer.codebook, seeded.quantizer.codebook)
    assert "coarse_init" not in auto.config()  # files of the default stay as they were


@pytest.mark.parametrize("kind", [IVFPQ, IVFSQ])
def test_coarse_init_is_kept_through_a_save(blobs, kind, tmp_path):
    x = blobs[:2000]
    args = (x.shape[1], 16, 8) if kind is IVFPQ else (x.shape[1], 16)
    index = kind(*args, coarse_init="random")
    index.train(x)
    index.add(x)
    index.save(tmp_path / "i")
    loaded = vq.load_index(tmp_path / "i")
    assert loaded.coarse_init == "random" and loaded.config() == index.config()
    np.testing.assert_array_equal(loaded.search(x[:5], 3)[1], index.search(x[:5], 3)[1])


def test_an_unknown_coarse_init_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="coarse_init must be one of 'auto', 'k-means\\+\\+'"):
        IVFFlat(8, 4, coarse_init="kmeans++")


def test_spherical_coarse_centroids_are_those_of_spherical_kmeans(blobs):
    x = torch.from_numpy(unit_rows_np(blobs[:2000]))
    index = IVFFlat(x.shape[1], 16, seed=3, spherical=True)
    index.train(x)
    expected = vq.kmeans(x, 16, niter=index.coarse_niter, init="k-means++", seed=3,
                         spherical=True).centroids  # fmt: skip
    torch.testing.assert_close(index.quantizer.codebook, expected, rtol=0, atol=0)
    torch.testing.assert_close(index.quantizer.codebook.norm(dim=1), torch.ones(16))
    assert "spherical" not in IVFFlat(x.shape[1], 16).config()  # old files stay as they were


@pytest.mark.parametrize(
    ("desc", "spill", "lam"),
    [("IVF16(spherical),Flat", False, None), ("IVF16(soar=1.5,spherical),PQ8", True, 1.5),
     ("IVF16(spherical,soar),SQ8", True, 1.0), ("IVF16(spherical),PQ8x4fs,RFlat", False, None)],
)  # fmt: skip
def test_spherical_factory_strings_set_the_options(desc, spill, lam):
    index = vq.index_factory(32, desc)
    ivf = getattr(index, "index", index)  # (the IVF inside a Refine)
    assert ivf.spherical and ivf.spill == spill and (not spill or ivf.soar_lambda == lam)
    assert ivf.config()["spherical"] is True


def test_a_spherical_index_searches_exactly_over_every_list_and_saves(blobs, tmp_path):
    x = unit_rows_np(blobs[:3000])
    index = vq.index_factory(x.shape[1], "IVF16(spherical),Flat")
    index.train(x)
    index.add(x)
    D, I = index.search(x[:20], 5, nprobe=16)  # every list: the exact answer (ties aside)
    exact = np.argsort(((x[:20, None] - x[None]) ** 2).sum(-1), axis=1)[:, :5]
    np.testing.assert_array_equal(I, exact)
    index.save(tmp_path / "i")
    loaded = vq.load_index(tmp_path / "i")
    assert loaded.spherical and loaded.config() == index.config()
    np.testing.assert_array_equal(loaded.search(x[:20], 5, nprobe=16)[1], I)


@pytest.mark.parametrize(
    ("desc", "match"),
    [("IVF16(spherical,spherical),Flat", "IVF option 'spherical'"),
     ("IVF16(sphere),Flat", "expected soar, soar=<lambda> or spherical"),
     ("IVF16(soar,soar=2),Flat", "IVF option 'soar=2'")],
)  # fmt: skip
def test_unknown_or_repeated_ivf_options_are_refused(desc, match):
    with pytest.raises(ValueError, match=match):
        vq.index_factory(32, desc)
