import numpy as np
import pytest
import torch

pytest.importorskip("torchaudio")

from vq.datasets import embed  # noqa: E402
from vq.datasets.embed import embed_nsynth, embedding_dim  # noqa: E402

SR = 16_000


class Tones:
    """A dataset of pure tones (waveform, metadata), with the attributes the cache uses."""

    def __init__(self, freqs, root="tones", length=16_000):
        t = torch.arange(length) / SR
        self.waves = [0.5 * torch.sin(2 * torch.pi * f * t) for f in freqs]
        self.note_strs = [f"tone-{f:.0f}" for f in freqs]
        self.root = root

    def __len__(self):
        return len(self.waves)

    def __getitem__(self, i):
        return self.waves[i], {"note_str": self.note_strs[i]}


def test_embeddings_have_the_documented_shape_and_separate_pitches():
    data = Tones([220, 220, 440, 880, 1760])
    x = embed_nsynth(data, batch_size=2)
    assert x.shape == (5, embedding_dim("logmel")) == (5, 128) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], x[1], rtol=1e-5)  # same note, same vector
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    assert (d[0, 2:] > 100 * max(d[0, 1], 1e-6)).all()  # other pitches far away
    # the mean half of the vector peaks in the mel band of the tone: higher tone, higher band
    peaks = x[2:, :64].argmax(1)
    assert (np.diff(peaks) > 0).all()


def test_mfcc_variant_and_batching_do_not_change_results():
    data = Tones([300, 600, 1200])
    x = embed_nsynth(data, method="mfcc", n_mfcc=20, batch_size=1)
    assert x.shape == (3, 40)
    np.testing.assert_allclose(
        x, embed_nsynth(data, method="mfcc", n_mfcc=20, batch_size=3), rtol=1e-4, atol=1e-4
    )


def test_cache_is_reused_and_keyed_by_configuration(tmp_path, monkeypatch):
    data = Tones([200, 400])
    first = embed_nsynth(data, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1

    def no_transform(config):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(embed, "_transform", no_transform)
    np.testing.assert_array_equal(embed_nsynth(data, cache_dir=tmp_path), first)
    with pytest.raises(AssertionError, match="recomputed"):  # another configuration
        embed_nsynth(data, cache_dir=tmp_path, n_mels=32)
    with pytest.raises(AssertionError, match="recomputed"):  # other notes
        embed_nsynth(Tones([200, 401]), cache_dir=tmp_path)


def test_corrupt_cache_is_recomputed(tmp_path):
    data = Tones([200, 400])
    first = embed_nsynth(data, cache_dir=tmp_path)
    (cache,) = tmp_path.glob("*.safetensors")
    cache.write_bytes(b"not a safetensors file")
    np.testing.assert_array_equal(embed_nsynth(data, cache_dir=tmp_path), first)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda d, tmp: embed_nsynth(d, method="wavelet"), "method must be one of"),
        (lambda d, tmp: embed_nsynth(d, batch_size=0), "batch_size must be positive"),
        (
            lambda d, tmp: embed_nsynth([(torch.zeros(100), {}), (torch.zeros(90), {})]),
            "one length",
        ),
        (lambda d, tmp: embed_nsynth([(torch.zeros(100), {})], cache_dir=tmp), "note_strs"),
    ],
)
def test_bad_input(tmp_path, call, match):
    with pytest.raises(ValueError, match=match):
        call(Tones([100]), tmp_path)
