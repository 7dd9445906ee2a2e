"""Every table of numbers in README.md and docs/ is what `python -m tools.tables` writes from
docs/results/ and the code: the committed documents match their regeneration, an edited number (in a
document or in a result file) is caught and named, and the code-derived cells equal the formulas
written out here (a gate of n_embd x n_embd per layer, a bf16 K/V cache)."""
import glob
import json
import os
import shutil

import pytest

from helpers import ROOT
from tools import compare, stats, tables
from tools.tables import extension, mqar, store, stored
from tools.tables.source import fmt_sci


@pytest.fixture()
def copy(tmp_path):
    """README.md and docs/ (results included) copied, for edits the check must catch."""
    shutil.copy(f"{ROOT}/README.md", tmp_path / "README.md")
    shutil.copytree(f"{ROOT}/docs", tmp_path / "docs")
    return tmp_path


def run_check(root, capsys):
    with pytest.raises(SystemExit) as e:
        tables.main(["--check", "--root", str(root)])
    return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_every_document_matches_its_regeneration():
    assert tables.check(ROOT) == []


def test_check_names_the_document_and_table_of_an_edited_number(copy, capsys):
    doc = copy / "docs" / "results.md"
    text = doc.read_text()
    row = "| mla | 5 | +0.0260 | [+0.0141, +0.0379] |"
    assert text.count(row) == 1
    doc.write_text(text.replace(row, "| mla | 5 | +0.0250 | [+0.0141, +0.0379] |"))
    code, err = run_check(copy, capsys)
    assert code == 1 and len(err) == 1
    assert err[0].startswith("docs/results.md:") and "table fair256-paired-test differs" in err[0]
    tables.main(["--root", str(copy)])                      # the command writes the number back
    assert doc.read_text() == text and tables.check(str(copy)) == []


def test_an_edited_result_file_changes_every_table_it_feeds(copy, capsys):
    path = copy / "docs" / "results" / "fair256" / "table.json"
    st = json.loads(path.read_text())
    st["paired"]["test"]["gla"]["verdict"] = "better"
    path.write_text(json.dumps(st))
    code, err = run_check(copy, capsys)
    named = {(line.split(":")[0], line.split("table ")[1].split()[0]) for line in err}
    assert code == 1 and named == {("README.md", "answer"), ("docs/answer.md", "answer"),
                                   ("docs/results.md", "fair256-paired-test"), ("docs/results.md", "fair256-scorecard")}


def test_a_table_of_numbers_outside_markers_and_a_long_readme_fail(copy, capsys):
    with open(copy / "docs" / "data.md", "a") as f:
        f.write("\n| rows | tokens |\n|---|---|\n| train | 1,003,854 |\n")
    with open(copy / "README.md", "a") as f:
        f.write("more\n" * (tables.README_MAX_LINES + 1 - len((copy / "README.md").read_text().splitlines())))
    code, err = run_check(copy, capsys)
    assert code == 1 and len(err) == 2
    assert err[0].startswith("docs/data.md:") and "outside <!-- table: NAME --> markers" in err[0]
    assert err[1].startswith(f"README.md: {tables.README_MAX_LINES + 1} lines")


@pytest.mark.parametrize("lines, words", [(["<!-- table: no-such-table -->", "<!-- /table -->"], "no-such-table"),
                                          (["<!-- table: threads -->"], "has no <!-- /table --> line"),
                                          (["<!-- /table -->"], "closes no table"),
                                          (["<!-- table: ext256-x4-loss -->", "<!-- /table -->"],
                                           "results are missing")])
def test_a_broken_marker_is_one_line_and_exit_2(copy, capsys, lines, words):
    shutil.rmtree(copy / "docs" / "results" / "ext256", ignore_errors=True)   # a study whose files are not stored
    with open(copy / "docs" / "data.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    code, err = run_check(copy, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: docs/data.md") and words in err[0]


def table_rows(doc, name):
    """[cells] of each row of a generated table as the committed document holds it."""
    with open(f"{ROOT}/{doc}") as f:
        lines = f.read().split("\n")
    begin = lines.index(f"<!-- table: {name} -->")
    rows = lines[begin + 1:lines.index("<!-- /table -->", begin)]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def generated(doc, name):
    """{first cell: cells} of a generated table as the committed document holds it."""
    return {cells[0]: cells for cells in table_rows(doc, name)}


def test_code_derived_cells_equal_the_formulas():
    """The fair study's configs: 4 layers, n_embd 128, 4 heads of 32, no biases, vocabulary 65."""
    n_layer, C, d_h = 4, 128, 32
    params = generated("docs/results.md", "fair256-params")
    assert params["mha"][1] == f"{4 * C * C:,}"                    # q, k, v, c_proj
    assert params["mha_gate"][1] == f"{5 * C * C:,}"               # + the sigmoid gate, n_embd x n_embd
    assert params["mha_gate"][2] == f"{int(params['mha'][2].replace(',', '')) + n_layer * C * C:,}"
    bf16, fp32 = 2, 4
    card = generated("docs/results.md", "fair256-scorecard")
    assert card["mha"][7] == f"{n_layer * 2 * 4 * d_h * bf16:,}"                   # K and V, 4 heads
    assert card["gqa"][7] == f"{n_layer * 2 * 2 * d_h * bf16:,}"
    assert card["mla"][7] == f"{n_layer * (64 + 16) * bf16:,}"                      # latent + RoPE key (d_h / 2)
    assert card["gla"][8] == f"{n_layer * 4 * d_h * d_h * fp32:,}"                  # the fp32 state


def test_the_answer_tables_memory_is_the_formula_at_gpt2_124m():
    """docs/answer.md: 12 layers, 12 heads of 64; bf16 K/V per token, a window's cache stops at 4,096 tokens,
    a constant fp32 state spread over the context."""
    L, H, D, bf16, fp32 = 12, 12, 64, 2, 4

    def kib(b):
        return f"{b / 1024:,.1f} KiB" if b >= 1024 else f"{b:,.0f} B"
    rows = {r[1].strip("`"): r for r in table_rows("docs/answer.md", "answer")}
    mha = L * 2 * H * D * bf16
    assert rows["mha"][5] == f"{kib(mha)} / {kib(mha)}"
    assert rows["gqa"][5] == f"{kib(mha * 2 / H)} / {kib(mha * 2 / H)}"             # config/gqa.py: 2 KV heads
    assert rows["mqa"][5] == f"{kib(mha / H)} / {kib(mha / H)}"
    assert rows["swa"][5] == f"{kib(mha)} / {kib(mha * 4096 / 32768)}"
    state = L * H * D * D * fp32
    assert rows["retnet"][5] == f"{kib(state / 4096)} / {kib(state / 32768)}"
    card = generated("docs/results.md", "fair256-scorecard")
    for config in ("gla", "mla"):                              # the scorecard's "Δ [CI] verdict", reordered
        delta, verdict = card[config][4].rsplit(" ", 1)
        assert rows[config][2] == f"{verdict}, {delta}"


def test_the_scorecards_recall_is_the_mean_of_zoologys_stored_runs_own_test_accuracy():
    """results.md's scorecard: MQAR accuracy is the mean of the stored runs' test_eval.json over the seeds of
    Zoology's cell at loss.RECALL_PAIRS pairs, width 64 (mha: the anchor's 4-head mha4, the families' the
    rest), "-" where no run of that name is stored."""
    from tools.tables.loss import RECALL_PAIRS
    zoo = os.path.join(ROOT, "docs/results/zoology")

    def test_acc(folder, name):
        accs = []
        for run in sorted(glob.glob(os.path.join(zoo, folder, f"{name}-s[0-9]"))):
            with open(os.path.join(run, "test_eval.json")) as f:
                accs.append(json.load(f)[0]["test_acc"])
        return f"{sum(accs) / len(accs):.3f} ({RECALL_PAIRS})" if accs else "-"
    card = generated("docs/results.md", "fair256-scorecard")
    assert card["mha"][5] == test_acc(f"anchor-w64-p{RECALL_PAIRS}", "mha4") != "-"
    for config in ("gla", "bigbird", "mla"):
        assert card[config][5] == test_acc(f"w64-p{RECALL_PAIRS}", config)
    assert card["gla_nodecay"][5] == "-" and card["mha_gate"][5] == "-"


def test_the_convolution_table_reads_each_stored_run_and_the_byte_formula():
    """docs/linear.md's 2 x 2 (width 64: 2 layers, 4 heads of 16): bytes are the state (H D D fp32 per
    layer) plus, with 4 taps, the last 3 inputs of q, k and v (3 x 3 H D fp32 per layer); learning rates
    and accuracies are each stored run's own summary.json and test_eval.json."""
    H, D, layers = 4, 16, 2
    state, window = layers * H * D * D * 4, layers * 3 * 3 * H * D * 4
    want = set()
    for folder, configs in mqar.CONV_RUNS.items():
        for config in configs:
            run = os.path.join(ROOT, "docs/results/recall", folder, f"{config}-s1")
            with open(os.path.join(run, "summary.json")) as f, open(os.path.join(run, "test_eval.json")) as g:
                lr, acc = json.load(f)["learning_rate"], json.load(g)[0]["test_acc"]
            conv = config in ("gla_conv", "deltanet", "gated_deltanet")
            want.add((config, f"{state + window * conv:,}", fmt_sci(lr), f"{acc:.3f}"))
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in mqar.conv_ablation(ROOT)[2:]]
    assert {(r[0], r[3], r[4], r[5]) for r in rows} == want and len(rows) == len(want)


@pytest.mark.parametrize("summary, expected", [({"kv_cache_bytes_per_token": 4096, "dtype": "float32"}, 2048),
                                               ({"kv_cache_bytes_per_token": 2048, "dtype": "bfloat16"}, 2048),
                                               ({"kv_cache_bytes_per_token": 0}, 0),
                                               ({"kv_cache_bytes_per_token": 4096}, None)])
def test_compare_states_the_cache_in_bf16_whatever_the_run_trained_in(summary, expected):
    assert compare.cache_bytes_bf16(summary) == expected
    assert "KV cache B/token (bf16)" in compare.runs_header("mha")[0]


def fake_sweep(path, losses):
    """A sweep's folder as tools.sweep leaves it: per run summary.json, log.jsonl, test_eval.json and a
    checkpoint; losses {run: (best val, test)}."""
    for run, (val, test) in losses.items():
        d = path / run
        d.mkdir(parents=True)
        seed = int(run.rsplit("-s", 1)[1])
        (d / "summary.json").write_text(json.dumps({"attention": run.split("-")[0], "pos_encoding": "rope",
                                                    "params": 1000, "seed": seed, "best_val_loss": val,
                                                    "final_val_loss": val, "finished": True}))
        (d / "log.jsonl").write_text(json.dumps({"iter": 10, "val_loss": val}) + "\n")
        (d / "test_eval.json").write_text(json.dumps([{"length": 256, "test_loss": test}]))
        (d / "ckpt.pt").write_bytes(b"weights")
    (path / "plan.json").write_text(json.dumps({"inputs": {}, "configs": {"mha": {"overrides": []}}}))


def test_stored_runs_give_the_paired_differences_written_out_here(tmp_path):
    """store() copies the small files, never a checkpoint; the paired table over the stored runs holds
    the mean of the per-seed differences (mla minus mha) computed by hand."""
    losses = {"mha-s1": (1.80, 1.90), "mha-s2": (1.82, 1.93), "mha-s3": (1.81, 1.91),
              "mla-s1": (1.83, 1.95), "mla-s2": (1.84, 1.96), "mla-s3": (1.85, 1.97)}
    fake_sweep(tmp_path / "sweep", losses)
    (tmp_path / "docs").mkdir()
    written = store.store(str(tmp_path / "sweep"), "fake", configs={"mha", "mla"}, root=str(tmp_path))
    assert len(written) == 6 * 3 + 1 and not any(p.endswith(".pt") for p in written)
    for metric, col in (("test", 1), ("best_val", 0)):
        lines = stored.paired_table("fake", ["mha", "mla"], metric)(str(tmp_path))
        mean = sum(losses[f"mla-s{s}"][col] - losses[f"mha-s{s}"][col] for s in (1, 2, 3)) / 3
        assert lines[2].startswith(f"| mla | 3 | {mean:+.4f} |"), lines
    runs = stored.runs_table("fake", ["mha", "mla"])(str(tmp_path))
    assert runs[2].startswith("| mha | 3 |") and "1.9133 ± 0.0153" in runs[2]


def test_rung_steps_pair_upper_minus_lower_over_the_seeds_both_have(tmp_path):
    """Each step is the upper config minus the lower, per shared seed (mla lacks seed 3), on test."""
    losses = {"mha-s1": (1.80, 1.90), "mha-s2": (1.82, 1.93), "mha-s3": (1.81, 1.91),
              "gla-s1": (1.83, 1.95), "gla-s2": (1.84, 1.92), "gla-s3": (1.85, 1.99),
              "mla-s1": (1.79, 1.87), "mla-s2": (1.80, 1.89)}
    fake_sweep(tmp_path / "sweep", losses)
    store.store(str(tmp_path / "sweep"), "fake", root=str(tmp_path))
    steps = [("mha", "gla", "one"), ("gla", "mla", "two")]
    lines = stored.steps_table("fake", steps, "test")(str(tmp_path))
    one = sum(losses[f"gla-s{s}"][1] - losses[f"mha-s{s}"][1] for s in (1, 2, 3)) / 3
    two = sum(losses[f"mla-s{s}"][1] - losses[f"gla-s{s}"][1] for s in (1, 2)) / 2
    assert lines[2].startswith(f"| gla − mha (one) | 3 | {one:+.4f} ["), lines
    assert lines[3].startswith(f"| mla − gla (two) | 2 | {two:+.4f} ["), lines


def test_the_window_bound_pairs_each_run_with_itself(tmp_path):
    rows = [{"run": f"mha-s{s}", "length": 512, "test_loss": 1.8 + s / 100} for s in (1, 2, 3)]
    rows += [{"run": f"mha-s{s} [window 128]", "window": 128, "length": 512, "test_loss": 1.9 + s / 50}
             for s in (1, 2, 3)]
    (tmp_path / "docs/results/w").mkdir(parents=True)
    (tmp_path / "docs/results/w/eval.json").write_text(json.dumps(rows))
    line = stored.window_bound("w", "eval.json")(str(tmp_path))[2]
    mean = sum((1.9 + s / 50) - (1.8 + s / 100) for s in (1, 2, 3)) / 3
    assert f"| 512 tokens | 3 | {sum(1.8 + s / 100 for s in (1, 2, 3)) / 3:.4f} | {mean:+.4f} [" in line, line


def test_the_extension_tables_group_seeds_and_pair_each_setting_with_its_own_window(tmp_path):
    """Fabricated tools.eval and tools.passkey rows: the loss cells are the seeds' mean ± sd, the
    past-L cells the mean of (bucket minus the same setting's own sliding window), the passkey
    cells the pooled hits over trials with Wilson's interval, each written out here."""
    rows, keys = [], []
    for seed, shift in ((1, 0.0), (2, 0.1), (3, 0.05)):
        for setting, base in (("", 1.5), (" [yarn x4]", 1.7)):
            run = f"base10k-s{seed}{setting}"
            buckets = [{"start": 0, "end": 256, "loss": 9.0}, {"start": 256, "end": 512, "loss": base + shift - 0.2}]
            rows += [{"run": run, "length": 256, "block_size": 256, "test_loss": base + shift},
                     {"run": run, "length": 512, "block_size": 256, "test_loss": base + 2 * shift, "buckets": buckets},
                     {"run": run, "length": 256, "block_size": 256, "stride": 64, "test_loss": base + shift + 0.1}]
            keys += [{"run": run, "multiple": m, "hits": h, "trials": 50} for m, h in ((1, 50 - seed), (2, seed))]
    (tmp_path / "docs/results/ext256").mkdir(parents=True)
    (tmp_path / "docs/results/ext256/eval_x4.json").write_text(json.dumps(rows))
    (tmp_path / "docs/results/ext256/passkey.json").write_text(json.dumps(keys))
    loss = extension.loss_table(4)(str(tmp_path))
    assert loss[2] == "| base10k | 3 | 1.5500 ± 0.0500 | 1.6000 ± 0.1000 | 1.6500 ± 0.0500 | |"
    assert loss[3].startswith("| base10k [yarn x4] | 3 | 1.7500 ± 0.0500 |")
    past = extension.past_table(4)(str(tmp_path))
    assert past[0] == "| setting | [256, 512) − own window |"
    assert past[2].startswith("| base10k | -0.300 [-0.300, -0.300]")
    key = extension.passkey_table(str(tmp_path))
    (lo, hi), (lo6, hi6) = stats.wilson(144, 150), stats.wilson(6, 150)
    assert key[2] == f"| base10k | 144/150 = 0.96 [{lo:.2f}, {hi:.2f}] | 6/150 = 0.04 [{lo6:.2f}, {hi6:.2f}] |"


def test_the_reach_table_keeps_the_configs_a_pattern_limits(tmp_path):
    """tools.reach rows: a config in reach everywhere gets no row; content-chosen ones say so."""
    def row(config, pairs, field, direct, ceiling):
        return {"config": config, "row_len": 64, "pairs": pairs, "field": field, "direct": direct, "ceiling": ceiling}
    rows = [row("mha", 4, 1, 1, 1), row("mha", 8, 1, 1, 1), row("swa", 4, 0.5, 0.25, 0.625),
            row("swa", 8, 0.25, 0.125, 0.5), row("bigbird", 4, 1, 1, 1), row("bigbird", 8, 1, 0.75, 1),
            row("moba", 4, None, None, None), row("moba", 8, None, None, None)]
    (tmp_path / "docs/results/recall/reach").mkdir(parents=True)
    (tmp_path / "docs/results/recall/reach/reach.json").write_text(json.dumps(rows))
    lines = mqar.reach(str(tmp_path))
    assert lines[0] == "| config | 64 tokens, 4 pairs | 64 tokens, 8 pairs |"
    assert lines[2:] == ["| swa | 0.500 / 0.250 / 0.625 | 0.250 / 0.125 / 0.500 |",
                         "| bigbird | 1.000 / 1.000 / 1.000 | 1.000 / 0.750 / 1.000 |",
                         "| moba | content-chosen | content-chosen |"]


def test_the_reach_cost_table_splits_a_limited_run_by_query_class(tmp_path):
    """A group whose pattern leaves pairs out and whose reach kept accuracies gets a row: share and accuracy
    per class (in the field only = field - direct, outside = 1 - field); others get none."""
    def group(config, reach):
        return {"config": config, "width": 64, "row_len": 64, "pairs": 16, "acc": 0.5, "reach": reach}
    accs = {"acc_direct": 0.9, "acc_indirect": 0.4, "acc_outside": 0.01}
    groups = [group("mha4", {"field": 1, "direct": 1, "ceiling": 1, "acc_direct": 0.8, "acc_indirect": None,
                             "acc_outside": None}),
              group("bigbird", {"field": 0.75, "direct": 0.5, "ceiling": 0.8, **accs}),
              group("swa", {"field": 0.25, "direct": 0.25, "ceiling": 0.3, **accs, "acc_indirect": None}),
              group("kept", {"field": 0.5, "direct": 0.5, "ceiling": 0.6})]   # counted without a checkpoint
    (tmp_path / "docs/results/recall/study").mkdir(parents=True)
    (tmp_path / "docs/results/recall/study/recall.json").write_text(json.dumps(groups))
    lines = mqar.reach_cost(str(tmp_path))
    cell = "| 64 | 64 tokens, 16 pairs | 0.500 |"
    assert lines[2:] == [f"| bigbird {cell} 0.500: 0.900 | 0.250: 0.400 | 0.250: 0.010 | 0.800 |",
                         f"| swa {cell} 0.250: 0.900 | - | 0.750: 0.010 | 0.300 |"]


def test_a_stored_sweep_restores_into_a_fresh_folder_without_touching_what_is_there(tmp_path):
    """store() keeps the runs and the lr/ probes; restore() copies back those the sweep folder lacks,
    byte for byte, and leaves a run the folder already has as it is."""
    fake_sweep(tmp_path / "sweep", {"mha-s1": (1.80, 1.90), "gla-s1": (1.85, 1.95), "mla-s1": (1.9, 2.0)})
    fake_sweep(tmp_path / "sweep" / "lr", {"mha-lr0.001-s1": (1.7, 1.8)})
    training = tmp_path / "sweep" / "mla-s1" / "summary.json"   # a run still training: not a result
    training.write_text(json.dumps({**json.loads(training.read_text()), "finished": False}))
    (tmp_path / "docs").mkdir()
    written = store.store(str(tmp_path / "sweep"), "s", root=str(tmp_path))
    assert len(written) == 3 * 3 + 1 and not any("mla-s1" in p for p in written)
    fresh = tmp_path / "fresh"
    (fresh / "gla-s1").mkdir(parents=True)
    (fresh / "gla-s1" / "summary.json").write_text("{}")
    restored = store.restore("s", str(fresh), root=str(tmp_path))
    assert sorted(os.path.relpath(p, fresh) for p in restored) == sorted(
        [f"{run}/{name}" for run in ("mha-s1", "lr/mha-lr0.001-s1") for name in ("summary.json", "log.jsonl",
                                                                                "test_eval.json")] + ["plan.json"])
    for p in restored:
        with open(p) as a, open(tmp_path / "sweep" / os.path.relpath(p, fresh)) as b:
            if p.endswith("plan.json"):   # rewritten by store (merged), the same JSON
                assert json.load(a) == json.load(b)
            else:
                assert a.read() == b.read()
    assert (fresh / "gla-s1" / "summary.json").read_text() == "{}"


def sweep_plan(configs, **inputs):
    """plan.json as tools.sweep writes it for configs planned alone at borrowed rates (no budget matched)."""
    base = {"configs": [f"config/recall/{c}.py" for c in configs], "overrides": ["--n_embd=64"], "match": [],
            "lr_grid": None, "lr_fraction": None, "probe_iters": None, "lr_from": "tune/plan.json"}
    return {"inputs": {**base, **inputs},
            "configs": {c: {"overrides": ["--learning_rate=0.01"], "learning_rate": 0.01} for c in configs}}


def test_more_seeds_of_a_stored_cell_land_beside_it_and_a_plan_of_other_settings_is_refused(tmp_path, capsys,
                                                                                            monkeypatch):
    """A second sweep of the same settings (other seeds, fewer configs) stores beside the first: the stored
    plan names the configs of both, as tools.sweep's own resumed plan would; one of other settings is
    refused in one line with exit 2, before anything is written."""
    fake_sweep(tmp_path / "first", {"mha-s1": (1.8, 1.9), "gla-s1": (1.9, 2.0)})
    (tmp_path / "first" / "plan.json").write_text(json.dumps(sweep_plan(["mha", "gla"])))
    fake_sweep(tmp_path / "seeds", {"gla-s2": (1.85, 1.95), "gla-s3": (1.86, 1.96)})
    (tmp_path / "seeds" / "plan.json").write_text(json.dumps(sweep_plan(["gla"])))
    (tmp_path / "docs").mkdir()
    store.store(str(tmp_path / "first"), "cell", root=str(tmp_path))
    store.store(str(tmp_path / "seeds"), "cell", root=str(tmp_path))
    cell = tmp_path / "docs" / "results" / "cell"
    assert sorted(p.name for p in cell.glob("*-s*")) == ["gla-s1", "gla-s2", "gla-s3", "mha-s1"]
    plan = json.loads((cell / "plan.json").read_text())
    assert plan["inputs"]["configs"] == ["config/recall/gla.py", "config/recall/mha.py"]
    assert sorted(plan["configs"]) == ["gla", "mha"]
    grown = sweep_plan(["gla"])                  # the same sweep later: its entry grew, its rate is the same
    grown["configs"]["gla"]["lr_grid"] = {"0.01": 0.5}
    (tmp_path / "seeds" / "plan.json").write_text(json.dumps(grown))
    store.store(str(tmp_path / "seeds"), "cell", root=str(tmp_path))
    plan = json.loads((cell / "plan.json").read_text())
    assert plan["configs"]["gla"]["lr_grid"] == {"0.01": 0.5} and sorted(plan["configs"]) == ["gla", "mha"]
    other_rate = sweep_plan(["gla"])
    other_rate["configs"]["gla"]["learning_rate"] = 0.003
    (tmp_path / "seeds" / "plan.json").write_text(json.dumps(other_rate))
    with pytest.raises(store.PlanClash, match="planned gla otherwise"):
        store.store(str(tmp_path / "seeds"), "cell", root=str(tmp_path))
    fake_sweep(tmp_path / "other", {"gla-s4": (1.8, 1.9)})
    (tmp_path / "other" / "plan.json").write_text(json.dumps(sweep_plan(["gla"], overrides=["--n_embd=128"])))
    monkeypatch.setattr(store, "HERE", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        store.main([str(tmp_path / "other"), "cell"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "overrides differ" in err[0] and "another study name" in err[0]
    assert not (cell / "gla-s4").exists() and json.loads((cell / "plan.json").read_text()) == plan


def test_restore_of_a_study_never_stored_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        store.main(["sweeps/nothing", "no-such-study", "--restore"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "holds no stored run" in err[0]


def test_store_runs_naming_no_finished_config_is_one_line_and_exit_2(tmp_path, capsys):
    """--runs takes config names; a run folder's name (or a config still training) matches none, and
    storing only plan.json would pass silently."""
    fake_sweep(tmp_path / "sweep", {"mha-s1": (1.80, 1.90), "gla-s1": (1.85, 1.95)})
    training = tmp_path / "sweep" / "gla-s1" / "summary.json"
    training.write_text(json.dumps({**json.loads(training.read_text()), "finished": False}))
    for name in ("mha-s1", "gla"):
        with pytest.raises(SystemExit) as e:
            store.main([str(tmp_path / "sweep"), "never-written", f"--runs={name}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f"--runs={name}" in err[0] and "mha" in err[0]
    assert not os.path.exists(os.path.join(store.results_dir(store.HERE, "never-written")))


def test_the_tuning_grid_marks_the_rate_the_plan_chose_and_the_probe_running(tmp_path):
    folder = tmp_path / "docs/results/recall/tune-w64-t64-p4"
    accs = {("mha4", 0.001): 0.97, ("mha4", 0.003): 0.99, ("gla", 0.001): 0.30}
    for (config, lr), acc in accs.items():
        d = folder / "lr" / f"{config}-lr{lr}-s1"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"attention": config.rstrip("4"), "learning_rate": lr,
                                                    "best_val_acc": acc, "finished": True}))
    lines = mqar.tune_status(str(tmp_path))
    assert lines[2:] == ["| mha4 | 0.970 | 0.990 |", "| gla | 0.300 | (running) |"]
    (folder / "plan.json").write_text(json.dumps({"inputs": {}, "configs": {
        "mha4": {"overrides": [], "learning_rate": 0.003}, "gla": {"overrides": [], "learning_rate": 0.001}}}))
    assert mqar.tune_status(str(tmp_path))[2:] == ["| mha4 | 0.970 | 0.990 (chosen) |",
                                                   "| gla | 0.300 (chosen) | (running) |"]


def test_a_study_cell_names_accuracy_interval_solved_and_steps():
    """One config in one cell (tools.recall's group): accuracy [interval] where seeds are several, solved
    k/n, the median step where some seed reached stop_val_acc; no group is '-', chance its accuracy."""
    def group(acc, n=1, interval=None, solved=0, steps=None):
        return {"config": "mha4", "n": n, "acc": acc, "acc_interval": interval or [acc, acc], "solved": solved,
                "steps": steps}
    assert mqar.study_cell(group(0.98, n=3, interval=[0.97, 0.99], solved=3, steps=1300)) == \
        "0.980 [0.970, 0.990]; 3/3; step 1,300"
    assert mqar.study_cell(group(0.5)) == "0.500; 0/1"
    assert mqar.study_cell(None) == "-"
    assert mqar.study_cell({"config": "chance", "acc": 0.125}) == "0.125"
