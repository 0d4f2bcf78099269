"""Part 3 of bench.vqvae_nsynth: the NSynth VQ-VAE trained with each layer of issue 21, vq's
against vector-quantize-pytorch's equivalent, same seeds, initial weights and batches.

    python -m bench.vqvae_nsynth --layers-only [--steps 300] [--seed 0 1 …] [--layers LFQ SimVQ …]

Layers (latent dimension D = ``--latent``, ``--codes`` codes per codebook where one applies):
LFQ (2^log2(codes·4) codes, entropy 0.1, commitment 0.25), ResidualFSQ ([8, 5, 5, 5] × stages),
ResidualLFQ (stages × codes, entropy 0.1, no commitment: the anchor's defaults),
GroupedResidualVQ (2 groups × stages × codes: EMA 0.99, k-means init, dead-code threshold 2,
commitment 0.25), SimVQ (codes·4 codes, commitment 0.25 and the rotation trick: the anchor's
defaults) and ResidualVQ with SimVQ (vector-quantize-pytorch's ResidualSimVQ: stages × codes).
The anchor's residual stacks pass the gradient stage by stage (each stage straight through, or
rotated onto its own codeword, from its own residual): vq's residual layers run with
``per_stage_gradient=True``, the same rule (one training step of ResidualFSQ, ResidualLFQ and
ResidualVQ by SimVQ then equals the anchor's in codes, output, loss and gradients: see
tests/test_lfq.py and tests/test_simvq.py). One step of LFQ at this configuration equals the
anchor's too (tests/test_lfq.py; to 1e-5 of the entropies and gradients at τ = 100, where the
anchor takes logarithms of probabilities clamped at 1e-5 and vq's entropies are exact), and so
does one EMA step of GroupedResidualVQ from the same codebooks (tests/test_grouped_residual.py:
the libraries' k-means initialisations and dead-code draws use their own random numbers).
Each VQ-VAE pair starts from the same encoder/decoder weights and sees the same crops in the
same order; both train alternately, step for step (the harness of part 2). Reports test
reconstruction error and codebook usage (perplexity and fraction of codes used on the test
set, averaged over codebooks). → bench/results/vqvae_nsynth_layers.csv; with several seeds
also the mean over seeds per layer and the per-seed ratios (vq / anchor) of MSE and codes used.
→ bench/results/vqvae_nsynth_layers_seeds.csv
"""

from __future__ import annotations

import math


def _channels_last(quantize):
    """Adapt an anchor layer taking [B, T, D] to the harness's [B, D, T]."""

    def run(z):
        out = quantize(z.transpose(1, 2))
        z_q, codes = out[0], out[1]
        loss = out[2].sum() if len(out) > 2 else z.new_zeros(())
        return z_q.transpose(1, 2), codes, loss

    return run


def layer_pairs(args) -> dict:
    """name → (make ours, make theirs, our quantize adapter, theirs', codebook size); the
    adapters map ``z`` [B, D, T] to ``(z_q [B, D, T], codes [B, T, C], loss)``."""
    import vector_quantize_pytorch as vqp

    import vq

    d, k, q = args.latent, args.codes, args.stages
    big = 1 << math.ceil(math.log2(4 * k))  # one codebook of 4 × the per-stage codes
    ema = vq.EMA(decay=0.99, kmeans_iters=10, dead_code_threshold=2.0)
    theirs_ema = dict(decay=0.99, kmeans_init=True, kmeans_iters=10, threshold_ema_dead_code=2)

    def ours(out):
        codes = out.codes
        return out.quantized, codes.reshape(*codes.shape[:2], -1), out.loss

    def grouped_theirs(layer):
        def run(z):
            z_q, codes, losses = layer(z.transpose(1, 2))  # codes [G, B, T, Q]
            codes = codes.permute(1, 2, 0, 3).reshape(z.shape[0], z.shape[2], -1)
            return z_q.transpose(1, 2), codes, losses.mean()

        return run

    def mean_loss(layer):  # ResidualSimVQ: a commitment per stage; vq's is their mean
        def run(z):
            z_q, codes, losses = layer(z.transpose(1, 2))
            return z_q.transpose(1, 2), codes, losses.mean()

        return run

    return {
        "LFQ": (
            lambda: vq.LFQ(d, big, commitment_weight=0.25, channel_first=True),
            lambda: vqp.LFQ(dim=d, codebook_size=big, commitment_loss_weight=0.25),
            ours,
            _channels_last,
            big,
        ),
        "ResidualFSQ": (
            lambda: vq.ResidualFSQ(
                [8, 5, 5, 5], q, dim=d, channel_first=True, per_stage_gradient=True
            ),
            lambda: vqp.ResidualFSQ(dim=d, levels=[8, 5, 5, 5], num_quantizers=q),
            ours,
            _channels_last,
            1000,
        ),
        "ResidualLFQ": (
            lambda: vq.ResidualLFQ(
                d, q, k, commitment_weight=0.0, channel_first=True, per_stage_gradient=True
            ),
            lambda: vqp.ResidualLFQ(dim=d, num_quantizers=q, codebook_size=k),
            ours,
            _channels_last,
            k,
        ),
        "GroupedResidualVQ": (
            lambda: vq.GroupedResidualVQ(
                d,
                2,
                q,
                k,
                learning=ema,
                commitment_weight=0.25,
                channel_first=True,
                per_stage_gradient=True,
            ),
            lambda: vqp.GroupedResidualVQ(
                dim=d,
                groups=2,
                num_quantizers=q,
                codebook_size=k,
                commitment_weight=0.25,
                rotation_trick=False,
                **theirs_ema,
            ),
            ours,
            grouped_theirs,
            k,
        ),
        "SimVQ": (
            lambda: vq.VectorQuantizer(
                d,
                big,
                learning="simvq",
                commitment_weight=0.25,
                rotation_trick=True,
                channel_first=True,
            ),
            lambda: vqp.SimVQ(dim=d, codebook_size=big),
            ours,
            _channels_last,
            big,
        ),
        "ResidualVQ, SimVQ": (
            lambda: vq.ResidualVQ(
                d,
                q,
                k,
                learning="simvq",
                commitment_weight=0.25,
                rotation_trick=True,
                channel_first=True,
                per_stage_gradient=True,  # the anchor's rotation trick is stage by stage
            ),
            lambda: vqp.ResidualSimVQ(dim=d, num_quantizers=q, codebook_size=k),
            ours,
            mean_loss,
            k,
        ),
    }


#: the system beside the anchor: vq, or (``--control``) the anchor itself from a start perturbed
#: by one part in 10^6 — the spread two runs of one algorithm show after 300 steps
CONTROL = "anchor, perturbed start"
ANCHOR = "vector-quantize-pytorch"
#: ``--vq-default-too``: a third model beside the residual pairs, vq's layer with its default
#: gradient rule (one estimator for the whole stack) instead of the anchor's per-stage one
DEFAULT = "vq, default gradient"


def train_pair(args, x_train, x_test, name: str, pair, seed: int) -> list[dict]:
    """Train vq's and the anchor's VQ-VAE with layer ``name`` step for step; their rows."""
    import copy
    import statistics

    import torch

    from bench.vqvae_model import VQVAE, make_vqvae, train_alternately

    make_ours, make_theirs, adapt_ours, adapt_theirs, size = pair
    if args.control:
        make_ours, adapt_ours = make_theirs, adapt_theirs
    torch.manual_seed(seed)
    encoder, decoder = make_vqvae(args.n_mels, args.hidden, args.latent)
    torch.manual_seed(seed)  # SimVQ: the same frozen codebooks and maps on both sides
    ours = make_ours()
    torch.manual_seed(seed)
    theirs = make_theirs()
    first = copy.deepcopy(encoder)
    if args.control:
        with torch.no_grad():
            weight = first[0].weight
            noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed))
            weight.mul_(1 + 1e-6 * noise)
    adapted = adapt_ours(ours) if args.control else (lambda z: adapt_ours(ours(z)))
    models = {
        CONTROL if args.control else "vq": VQVAE(first, decoder, ours, adapted, args.lr),
        ANCHOR: VQVAE(encoder, copy.deepcopy(decoder), theirs, adapt_theirs(theirs), args.lr),
    }
    staged = any(hasattr(module, "per_stage_gradient") for module in ours.modules())
    if args.vq_default_too and not args.control and staged:
        torch.manual_seed(seed)
        default = make_ours()
        for module in default.modules():  # GroupedResidualVQ: its stacks too
            if hasattr(module, "per_stage_gradient"):
                module.per_stage_gradient = False
        models[DEFAULT] = VQVAE(
            copy.deepcopy(encoder),
            copy.deepcopy(decoder),
            default,
            lambda z: adapt_ours(default(z)),
            args.lr,
        )
    # the same crops for every layer and system
    times = train_alternately(models, x_train, args, seed=seed + 1)["times"]
    rows = []
    for system, model in models.items():
        scores = model.evaluate(x_test, size)
        rows.append(
            {
                "layer": name,
                "seed": seed,
                "system": system,
                "steps": args.steps,
                "test reconstruction MSE": scores["test MSE"],
                "perplexity (mean over codebooks)": scores["perplexity"],
                "codes used (mean over codebooks)": scores["used"],
                "step ms (median)": 1000 * statistics.median(times[system]),
            }
        )
    ref = rows[1]  # the anchor's
    for row in rows:
        row["MSE / anchor"] = row["test reconstruction MSE"] / ref["test reconstruction MSE"]
        row["used / anchor"] = row["codes used (mean over codebooks)"] / max(
            ref["codes used (mean over codebooks)"], 1e-12
        )
    return rows


COLUMNS = [
    "layer",
    "seed",
    "system",
    "steps",
    "test reconstruction MSE",
    "MSE / anchor",
    "perplexity (mean over codebooks)",
    "codes used (mean over codebooks)",
    "used / anchor",
    "step ms (median)",
]

SUMMARY_COLUMNS = [
    "layer",
    "system",
    "seeds",
    "MSE (mean)",
    "anchor MSE (mean)",
    "MSE / anchor (of means)",
    "MSE / anchor per seed",
    "used (mean)",
    "anchor used (mean)",
    "used / anchor (of means)",
    "used / anchor per seed",
]


def summary(rows: list[dict]) -> list[dict]:
    """Per layer and system beside the anchor, over the seeds of ``rows`` (train_pair's, or
    read back from the CSV): the mean test MSE and codes used of the system and of the anchor,
    the ratio of the means, and the per-seed ratios."""
    import statistics

    mse, used = "test reconstruction MSE", "codes used (mean over codebooks)"
    runs: dict = {}  # (layer, system) → seed → row, and (layer, ANCHOR) likewise
    for r in rows:
        runs.setdefault((r["layer"], r["system"]), {})[int(r["seed"])] = r
    out = []
    for (layer, system), by_seed in runs.items():
        if system == ANCHOR:
            continue
        anchor = runs[(layer, ANCHOR)]
        seeds = sorted(by_seed)

        def mean(table, key, seeds=seeds):
            return statistics.fmean(float(table[s][key]) for s in seeds)

        def per_seed(key, by_seed=by_seed, anchor=anchor, seeds=seeds):
            ratios = (float(by_seed[s][key]) / float(anchor[s][key]) for s in seeds)
            return " ".join(f"{v:.3f}" for v in ratios)

        out.append(
            {
                "layer": layer,
                "system": system,
                "seeds": " ".join(map(str, seeds)),
                "MSE (mean)": mean(by_seed, mse),
                "anchor MSE (mean)": mean(anchor, mse),
                "MSE / anchor (of means)": mean(by_seed, mse) / mean(anchor, mse),
                "MSE / anchor per seed": per_seed(mse),
                "used (mean)": mean(by_seed, used),
                "anchor used (mean)": mean(anchor, used),
                "used / anchor (of means)": mean(by_seed, used) / mean(anchor, used),
                "used / anchor per seed": per_seed(used),
            }
        )
    return out


def run(args, x_train, x_test) -> list[dict]:
    """Every chosen layer (``args.layers``, default all) for every seed of ``args.seed``."""
    pairs = layer_pairs(args)
    chosen = args.layers or list(pairs)
    unknown = [name for name in chosen if name not in pairs]
    if unknown:
        raise SystemExit(f"--layers: unknown {unknown}; choose from {list(pairs)}")
    rows = []
    for seed in args.seed:
        for name in chosen:
            pair_rows = train_pair(args, x_train, x_test, name, pairs[name], seed)
            anchor = pair_rows[1]
            for row in pair_rows:
                if row is anchor:
                    continue
                print(
                    f"seed {seed}, {name}, {row['system']}: test MSE "
                    f"{row['test reconstruction MSE']:.4g} / "
                    f"{anchor['test reconstruction MSE']:.4g} (vq / anchor "
                    f"{row['MSE / anchor']:.3f}), codes used "
                    f"{row['codes used (mean over codebooks)']:.4g} / "
                    f"{anchor['codes used (mean over codebooks)']:.4g} "
                    f"({row['used / anchor']:.3f})",
                    flush=True,
                )
            rows += pair_rows
    return rows


def main_part(args, x_train, x_test) -> list[dict]:
    """Part 3 of bench.vqvae_nsynth: train, print and write the tables; the per-seed rows."""
    from bench.common import report

    rows = run(args, x_train, x_test)
    seeds = " ".join(map(str, args.seed))
    control = f"; control: {CONTROL} against the anchor" if args.control else ""
    title = (
        f"VQ-VAE on NSynth log-mels with each issue-21 layer: {args.latent}-d latents, "
        f"{args.stages} stages of {args.codes} codes where staged, {args.steps} steps of "
        f"{args.batch} crops, same weights and batches (seed {seeds}){control}"
    )
    report("vqvae_nsynth_layers", title, args.threads, rows, COLUMNS)
    if len(args.seed) > 1:
        print()
        title = f"The same, per layer over seeds {seeds}: means and per-seed ratios{control}"
        report("vqvae_nsynth_layers_seeds", title, args.threads, summary(rows), SUMMARY_COLUMNS)
    return rows
