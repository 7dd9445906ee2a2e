"""Put the analyze.py results of several runs side by side: one PNG for the README.

    python -m tools.compare_positions out-pos-*/analysis --out docs/positions.png

Reads each DIR/analysis.json and draws, one line per run:
  decay      mean attention weight over the uniform baseline against distance (layers
             averaged): above 1 near and below 1 far means nearer tokens get more weight;
  shift      the max change of an attention weight when the text moves, per layer (log
             scale; values at the fp32 floor mean invariant);
  same token the same-token ratio per layer (1 = no preference for earlier copies of the
             query's token at the same distance).
"""
import json
import os
import sys

from trainer.cli import OneLineParser, check_output, fail

SHIFT_FLOOR = 1e-9  # exact zeros drawn here on the log axis


def load(folder):
    path = os.path.join(folder, "analysis.json")
    if not os.path.isfile(path):
        fail(f"{path} not found; run python -m tools.analyze RUN_DIR first")
    with open(path) as f:
        return json.load(f)


def mean_ratio(result):
    """Distances present in every layer, and the layer-mean of measured / uniform there."""
    layers = [dict(zip(measured["distance"], (w / u for w, u in zip(measured["weight"], uniform["weight"]))))
              for measured, uniform in zip(result["decay"], result["uniform"])]
    common = sorted(set.intersection(*(set(layer) for layer in layers)))
    return common, [sum(layer[d] for layer in layers) / len(layers) for d in common]


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.compare_positions", description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", metavar="DIR", help="analyze.py output folders")
    ap.add_argument("--out", help="the PNG to write (default: positions.png in the first DIR)")
    args = ap.parse_args(argv)
    args.out = args.out or os.path.join(args.folders[0], "positions.png")
    check_output(args.out, "--out")
    results = [load(folder) for folder in args.folders]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (decay, shift, same) = plt.subplots(1, 3, figsize=(13, 3.8))
    for r in results:
        label = f"{r['attention']}, {r['pos_encoding']}"
        decay.plot(*mean_ratio(r), label=label)
        layers = range(len(r["shift_invariance_per_layer"]))
        shift.plot(layers, [max(v, SHIFT_FLOOR) for v in r["shift_invariance_per_layer"]], marker="o", label=label)
        same.plot(layers, [v if v is not None else float("nan") for v in r["same_token_ratio_per_layer"]],
                  marker="o", label=label)
    decay.axhline(1.0, color="k", lw=0.8)
    decay.set(yscale="log", xlabel="query-key distance", ylabel="weight / uniform (mean over layers)",
              title="long-distance decay")
    shift.set(yscale="log", xlabel="layer", ylabel="max |change| of a weight", title="shift invariance")
    same.axhline(1.0, color="k", lw=0.8)
    same.set(xlabel="layer", ylabel="same-token / other at equal distance", title="semantic aggregation")
    for ax in (decay, shift, same):
        ax.grid(alpha=0.3)
    decay.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
