"""``coarse_init``: how an IVF index's coarse k-means starts (k-means++ seeds by default up to
2,048 lists; faiss's random rows on request, for recall parity at equal parameters)."""

import numpy as np
import pytest
import torch

import vq
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
