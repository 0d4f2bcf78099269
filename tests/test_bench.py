"""Every bench script runs end to end at a tiny size and writes a sane CSV (not a benchmark)."""

import csv
import math

import pytest

pytest.importorskip("faiss")
pytest.importorskip("matplotlib")

import bench.common  # noqa: E402
from bench import (  # noqa: E402
    ann,
    coldstart,
    encode,
    fastscan,
    frontier,
    ivf_search,
    ivfpq_parity,
    kmeans,
    latency,
    memory,
    pool,
    pq_search,
    sketch,
    spill,
)


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    return tmp_path


def one_thread(argv):
    """``argv`` with ``--threads 1``: the test workers already fill the cores, and OpenMP teams
    of two spin against each other there."""
    return [*argv, "--threads", "1"]


def read_csv(path, columns):
    """The rows of ``path``, after checking it has ``columns`` and sane numbers: recalls and
    fractions in [0, 1], throughputs, times, sizes and ratios finite and > 0 (memory increases,
    which a small build may not show, >= 0)."""
    assert path.exists(), f"{path.name} not written"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert rows, f"{path.name} is empty"
    missing = set(columns) - set(rows[0])
    assert not missing, f"{path.name} lacks columns {missing}"
    for row in rows:
        for col, value in row.items():
            if value == "":
                continue
            if col.startswith("recall") or col.startswith("identical"):
                assert 0.0 <= float(value) <= 1.0, (col, value)
            elif "increase" in col:
                assert math.isfinite(float(value)) and float(value) >= 0, (col, value)
            elif any(s in col for s in ("QPS", "/", "vectors/s", "vec/s", "MiB", "seconds")):
                assert math.isfinite(float(value)) and float(value) > 0, (col, value)
    return rows


def test_kmeans(results):
    kmeans.main(
        one_thread(["--n", "2000", "--dim", "16", "--k", "16", "--niter", "3", "--rounds", "1"])
    )
    rows = read_csv(results / "kmeans.csv", ["system", "seconds", "time / faiss", "objective"])
    assert {r["system"] for r in rows} >= {"faiss.Kmeans", "vq.kmeans (random)", "vq.lbg"}
    assert (results / "kmeans.png").exists()


def test_encode(results):
    encode.main(
        one_thread(["--n", "1000", "--dim", "8", "--M", "2", "--rvq-stages", "1", "--rounds", "1"])
    )
    read_csv(results / "encode.csv", ["operation", "vq vectors/s", "faiss vectors/s", "vq / faiss"])


def test_pq_search(results):
    pq_search.main(
        one_thread(["--n", "2000", "--dim", "16", "--M", "4", "--nq", "20", "--rounds", "1"])
    )
    rows = read_csv(results / "pq_search.csv", ["vq QPS", "faiss QPS", "identical top-k rows"])
    assert float(rows[0]["identical top-k rows"]) > 0.5  # same codebooks and codes


def test_sketch(results):
    argv = "--data synthetic --n 3000 --dim 40 --nlist 16 --nq 50 --nprobe 1 4 --rounds 1"
    rows = sketch.main(one_thread([*argv.split(), "--min-seconds", "0.01"]))
    read_csv(results / "sketch.csv", ["QPS sketch", "QPS plain", "QPS faiss", "sketch / faiss"])
    # the same lists and exact distances: the same ids as the plain scan and as faiss
    assert all(r["same ids as plain"] == 1.0 and r["same ids as faiss"] > 0.99 for r in rows)


def test_spill(results):
    argv = "--n 3000 --dim 16 --nlist 32 --nq 50 --nprobe 1 4 --rounds 1"
    rows = spill.main(one_thread(argv.split()))
    read_csv(results / "spill.csv", ["recall_plain", "recall_soar", "qps_plain", "qps_soar"])
    assert all(row["recall_soar"] >= row["recall_plain"] for row in rows)


def test_ivf_search(results):
    argv = "--n 2000 --dim 16 --nlist 8 --M 8 --nq 20 --ntrain 2000 --nprobe 1 4 --rounds 1"
    ivf_search.main(one_thread(argv.split()))
    rows = read_csv(results / "ivf_search.csv", ["nprobe", "vq QPS", "faiss QPS", "recall@10"])
    assert [int(r["nprobe"]) for r in rows] == [1, 4]
    read_csv(results / "ivf_add.csv", ["vq add vec/s", "faiss add vec/s", "file vq / faiss"])


def test_ann(results):
    # 32 dimensions, PQ8: the IVF-PQ kernel configuration most tests use (compiled once)
    argv = (
        "--n 2000 --nq 20 --dim 32 --nlist 8 --M 8 --ntrain 1000 --nprobe 1 4 16 --k-factor 1 4 "
        "--rounds 1 --min-seconds 0.01 --index Flat IVF8,PQ8 IVF8,PQ8,RFlat"
    )
    rows = ann.main(one_thread(argv.split()))
    columns = ["data", "index", "system", "param", "recall@1", "recall@10", "recall@100", "QPS"]
    csv_rows = read_csv(results / "ann.csv", [*columns, "vq / faiss"])
    assert len(csv_rows) == len(rows) == 2 * (1 + 3 + 2)  # Flat; nprobe 1, 4, 16 -> 8; RFlat
    params = [r["param"] for r in csv_rows if r["system"] == "vq"]
    assert params == [
        "-",
        "nprobe=1",
        "nprobe=4",
        "nprobe=8",
        "nprobe=8,k_factor=1",
        "nprobe=8,k_factor=4",
    ]
    flat = [r for r in csv_rows if r["index"] == "Flat"]
    assert all(float(r["recall@100"]) == 1.0 for r in flat)  # exact search finds the truth
    refined = [float(r["recall@10"]) for r in csv_rows if r["index"].endswith("RFlat")]
    assert max(refined) > 0.9
    assert (results / "ann.png").exists()


def test_frontier(results):
    argv = (
        "--data synthetic --n 3000 --nq 30 --dim 32 --nlist 16 --ntrain 2000 --nprobe 4 16 "
        "--k-factor 2 8 --ef 16 64 --rounds 1 --min-seconds 0.01 --systems vq faiss "
        "--vq HNSW16 HNSW16:int8:efc64 IVF16,PQ16x4fs,Refine(SQfp16)"
    )
    rows = frontier.main(one_thread(argv.split()))
    columns = ["system", "index", "param", "recall@10", "QPS", "B/vector", "build seconds"]
    points = read_csv(results / "frontier.csv", columns)
    assert len(points) == len(rows)
    indexes = {(r["system"], r["index"]) for r in points}
    assert {("vq", "HNSW16"), ("vq", "HNSW16:int8:efc64"), ("faiss", "HNSW32")} <= indexes
    size = {(r["system"], r["index"]): float(r["B/vector"]) for r in points}
    # float32 vectors (128 B) re-rank IVF16,PQ16x4fs,RFlat; fp16 ones (64 B) the lean variant
    lean, full = size["vq", "IVF16,PQ16x4fs,Refine(SQfp16)"], size["vq", "IVF16,PQ16x4fs,RFlat"]
    assert 64 + 8 + 8 <= lean <= 64 + 8 + 8 + 8  # + ids, the codes once as blocks (and small)
    assert lean <= full - 64 + 1
    assert 128 <= size["faiss", "IVF16,Flat"] <= 128 + 8 + 4

    def params(index):
        return {r["param"] for r in points if r["system"] == "vq" and r["index"] == index}

    fp16 = params("IVF16,PQ16x4fs,Refine(SQfp16)")
    assert "nprobe=16,k_factor=8" in fp16 and fp16 == params("IVF16,PQ16x4fs,RFlat")  # swept alike
    table = read_csv(results / "frontier-frontier.csv", ["recall@10 >=", "vq", "faiss"])
    assert [r["recall@10 >="] for r in table] == ["0.8", "0.9", "0.95", "0.99"]
    # the best vq point at 0.8 is at least as fast as every vq point reaching 0.8
    best = max(
        float(r["QPS"]) for r in points if r["system"] == "vq" and float(r["recall@10"]) >= 0.8
    )
    assert table[0]["vq"].startswith(f"{best:,.0f} ")
    assert (results / "frontier.png").exists()


def test_fastscan(results):
    argv = (
        "--n 3000 --nq 30 --dim 32 --nlist 8 --M 8 --ntrain 3000 --nprobe 1 4 --k-factor 1 4 "
        "--rounds 1 --min-seconds 0.01"
    )
    rows = fastscan.main(one_thread(argv.split()))
    csv_rows = read_csv(results / "fastscan.csv", ["index", "system", "param", "QPS", "same ids"])
    assert len(csv_rows) == len(rows) == 2 * (1 + 2 + 2 + 2)  # PQ; 2 nprobes x 2 IVF; RFlat
    params = [r["param"] for r in csv_rows if r["system"] == "vq" and "RFlat" in r["index"]]
    assert params == ["nprobe=8,k_factor=1", "nprobe=8,k_factor=4"]  # nprobe 16, 64 -> nlist
    # the imported index gives faiss's answers (ties of quantized distances aside)
    assert min(float(r["same ids"]) for r in csv_rows) >= 0.9
    for a, b in zip(csv_rows[::2], csv_rows[1::2], strict=True):
        assert abs(float(a["recall@10"]) - float(b["recall@10"])) <= 0.02, (a, b)
    assert (results / "fastscan.png").exists()


def test_ann_helpers():
    assert ann.default_nlist(100) == 32 and ann.default_nlist(1) == 8
    assert ann.default_nlist(1_000_000) == 1024 and ann.default_nlist(3300) == 256
    assert ann.faiss_description("OPQ16,IVF1024,PQ16,RFlat") == "OPQ16,IVF1024,PQ16np,RFlat"
    assert ann.faiss_description("PQ8") == "PQ8np"
    assert ann.faiss_description("IVF64,Flat") == "IVF64,Flat"


def test_memory(results):
    memory.main(one_thread(["--n", "3000", "--dim", "16", "--index", "PQ2", "--ntrain", "1000"]))
    columns = ["index", "system", "n", "peak RSS MiB", "RSS increase MiB", "file bytes/vector"]
    rows = read_csv(results / "memory.csv", [*columns, "file vq / faiss"])
    assert [r["system"] for r in rows] == ["vq", "faiss"]
    for r in rows:  # 2 code bytes per vector, plus ids and codebooks
        assert 2 <= float(r["file bytes/vector"]) < 40


def test_export(results):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bench import export

    # 32 dimensions, PQ8: the IVF-PQ kernel configuration most tests use (compiled once)
    argv = (
        "--n 2000 --dim 32 --M 8 --rvq-stages 2 --nlist 8 --nprobe 2 --ntrain 2000 "
        "--encode-batches 4 --search-batches 3 --rounds 1 --min-seconds 0.001"
    )
    rows = export.main(one_thread(argv.split()))
    columns = ["operation", "batch", "ONNX Runtime ms", "torch eager ms", "eager / ONNX Runtime"]
    csv_rows = read_csv(results / "export.csv", [*columns, "vq (numba) ms", "identical rows"])
    assert len(csv_rows) == len(rows) == 3  # PQ and RVQ encode, IVFPQ search
    assert [int(r["batch"]) for r in csv_rows] == [4, 4, 3]
    assert all(float(r["identical rows"]) == 1.0 for r in csv_rows)  # same graph, two runtimes
    assert (results / "export.png").exists()


def test_vqvae_nsynth(results, tmp_path):
    pytest.importorskip("vector_quantize_pytorch")
    pytest.importorskip("torchaudio")
    pytest.importorskip("soundfile")
    from bench import vqvae_nsynth

    argv = (
        "--steps 6 --instruments 11 --max-train 22 --max-test 3 --frames 16 --batch 8 "
        "--codes 16 --stages 2 --hidden 16 --latent 8 --micro-batch 2 --micro-len 16 "
        "--micro-dim 8 --micro-codes 16 --micro-stages 2 --rounds 2"
    )
    vqvae_nsynth.main(one_thread([*argv.split(), "--data-dir", str(tmp_path / "data")]))
    columns = ["layer", "system", "best seconds", "vq / anchor", "perplexity", "codes used"]
    step = read_csv(results / "vq_layer_step.csv", columns)
    assert [r["system"] for r in step] == ["vq", "vector-quantize-pytorch"] * 2
    for r in step:  # 16 codes per codebook
        assert 1 <= float(r["perplexity"]) <= 16 and 0 < float(r["codes used"]) <= 1
    columns = ["system", "test reconstruction MSE", "perplexity (mean over stages)"]
    trained = read_csv(results / "vqvae_nsynth.csv", [*columns, "step time / anchor"])
    assert [r["system"] for r in trained] == ["vq", "vector-quantize-pytorch"]
    for r in trained:  # normalised log-mels: an untrained decoder's error is about 1
        assert 0 < float(r["test reconstruction MSE"]) < 3
    columns = ["layer", "system", "test reconstruction MSE", "codes used (mean over codebooks)"]
    layers = read_csv(results / "vqvae_nsynth_layers.csv", columns)
    names = ["LFQ", "ResidualFSQ", "ResidualLFQ", "GroupedResidualVQ", "SimVQ", "ResidualVQ, SimVQ"]
    assert [r["layer"] for r in layers] == [n for n in names for _ in range(2)]
    assert [r["system"] for r in layers] == ["vq", "vector-quantize-pytorch"] * len(names)
    for r in layers:
        assert 0 < float(r["test reconstruction MSE"]) < 3
        assert 0 < float(r["codes used (mean over codebooks)"]) <= 1


def test_coldstart_times_a_fresh_process_per_kind(results):
    kinds = ["ProductQuantizer", coldstart.LAYER]  # (each index kind runs the same code)
    argv = ["--n", "2000", "--repeats", "1", "--no-cold", "--kinds", *kinds]
    rows = coldstart.main(one_thread(argv))
    assert [r["kind"] for r in rows] == kinds
    table = read_csv(results / "coldstart.csv", ["kind", "vq import s", "vq load+first s"])
    assert [r["kind"] for r in table] == kinds
    for row in rows:  # every child reported positive, finite times
        assert 0 < row["vq import s"] < 60 and 0 < row["vq load+first s"] < 60
    assert rows[0]["faiss load+first s"] > 0  # faiss ran beside vq
    assert "faiss load+first s" not in rows[1]  # no faiss equivalent of the layer step


def test_latency_reports_percentiles_of_both_libraries(results):
    # 32 dimensions, PQ8: the IVF-PQ kernel configuration most tests use (compiled once)
    argv = "--n 2000 --dim 32 --queries 30 --kinds Flat IVF64,PQ8"
    rows = latency.main(one_thread(argv.split()))
    assert [r["index"] for r in rows] == ["Flat", "IVF64,PQ8"]
    for row in rows:
        assert 0 < row["vq p50 us"] <= row["vq p99 us"]
        assert 0 < row["faiss p50 us"] <= row["faiss p99 us"]
    assert rows[0]["same ids"] == 1.0  # exact search: the same neighbours
    read_csv(results / "latency.csv", ["index", "vq p50 us", "faiss p50 us", "p50 ratio"])


def test_pool_reports_each_step_against_one_thread(results, monkeypatch):
    from vq.kernels.common import threads

    monkeypatch.setattr(threads, "_setting", threads._setting)  # (the run sets 2: put back)
    # two threads: the steps go through the pool (whether a worker wakes in time to take a
    # slice of so small a step depends on the machine's load: not asserted)
    rows = pool.main(["--threads", "2", "--work", "5", "40", "--rounds", "1"])
    assert [r["work µs"] for r in rows] == ["5", "40"]
    for row in rows:
        assert 0 < row["ideal µs"] < row["serial µs"]
        assert row["overhead µs"] == pytest.approx(row["step µs"] - row["ideal µs"], abs=0.2)
        assert row["caller starts µs"] >= 0
    assert rows[1]["serial µs"] > rows[0]["serial µs"]  # more work takes longer
    read_csv(results / "pool.csv", ["work µs", "step µs", "serial µs", "speed-up"])


def test_pool_refuses_no_work_and_no_threads(capsys):
    for argv in (["--work", "0"], ["--threads", "0"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            pool.main(argv)
        assert "must be at least 1 and each --work above 0" in capsys.readouterr().err


def test_ivfpq_parity_reports_each_seed_and_their_mean(results):
    # 32 dimensions, PQ8: the IVF-PQ kernel configuration most tests use (compiled once)
    argv = "--data clustered --n 3000 --nq 40 --dim 32 --seeds 0 1 --nprobe 2 --kinds IVF16,PQ8"
    rows = ivfpq_parity.main(one_thread(argv.split()))
    assert [r["seed"] for r in rows] == [0, 1, "mean"]
    seeds, mean = rows[:2], rows[2]
    for col in ("vq recall@10", "faiss recall@10"):
        assert mean[col] == pytest.approx(sum(r[col] for r in seeds) / 2)
    assert mean["vq - faiss"] == pytest.approx(mean["vq recall@10"] - mean["faiss recall@10"])
    assert mean["bar"] in ("within 0.005: met", "within 0.005: not met")
    # different seeds train different indexes: the two seeds' recalls are not both equal
    assert (seeds[0]["vq recall@10"], seeds[0]["faiss recall@10"]) != (
        seeds[1]["vq recall@10"],
        seeds[1]["faiss recall@10"],
    )
    read_csv(results / "ivfpq_parity.csv", ["data", "index", "nprobe", "seed", "vq - faiss"])


def test_coldstart_reports_cold_cache_bars_and_the_cli(results, capsys):
    argv = "--n 2000 --nq 5 --repeats 1 --cli-n 3000 --cli-index Flat --kinds Flat".split()
    rows = coldstart.main(one_thread([*argv, coldstart.CLI]))
    assert [r["kind"] for r in rows] == ["Flat", coldstart.CLI]
    flat, cli = rows
    assert 0 < flat["vq load+first s"] <= flat["vq cold load+first s"]  # the cold one compiles
    assert flat["vq / faiss load+first"] == flat["vq load+first s"] / flat["faiss load+first s"]
    assert flat["warm bar"].startswith(("met", "not met"))
    assert flat["cold bar"] in ("met", "not met")
    # the CLI is timed whole, warm only, beside faiss's child on the same index
    assert cli["vq process s"] > 0 and cli["faiss process s"] > 0
    assert "vq import s" not in cli and "vq cold load+first s" not in cli
    table = read_csv(results / "coldstart.csv", coldstart.CSV_COLUMNS)
    assert [r["kind"] for r in table] == ["Flat", coldstart.CLI]
    printed = capsys.readouterr().out
    assert f"| {coldstart.CLI} | n/a | n/a |" in printed  # no import / load+first of its own


def test_latency_reports_means_recalls_and_nprobe_of_both(results):
    rows = latency.main(
        one_thread("--n 2000 --dim 32 --queries 30 --nprobe 4 --kinds IVF64,PQ8".split())
    )
    (row,) = rows
    assert row["nprobe"] == 4
    assert 0 < row["vq mean us"] and 0 < row["faiss mean us"]
    assert row["p50 ratio"] == row["vq p50 us"] / row["faiss p50 us"]
    # the same codes searched with the same nprobe: the same neighbours, the same recall
    assert row["same ids"] >= 0.95
    assert abs(row["vq recall@10"] - row["faiss recall@10"]) <= 0.05
    assert row["target"].startswith("p50 <= 1x: ")
    columns = ["nprobe", "vq mean us", "faiss mean us", "p99 ratio", "vq recall@10", "same ids"]
    read_csv(results / "latency.csv", columns)


def test_frontier_refuses_a_graph_of_fewer_than_two_links(capsys):
    with pytest.raises(SystemExit) as stop:
        frontier.main(one_thread(["--data", "synthetic", "--hnsw-M", "16", "1"]))
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert "--hnsw-M: each M must be at least 2 (links per node), got [16, 1]" in error
