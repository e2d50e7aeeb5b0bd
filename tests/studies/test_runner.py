"""The study runner: resume gives the same bytes, pairing by draw, checks before any run."""

import json
import os
import random
import re
import shutil

import pytest

from moejax.errors import ConfigError
from moejax.evaluation import stats
from moejax.studies import report, runner, scoring
from tests.helpers import training_workdir
from tests.studies import toy


@pytest.fixture(autouse=True)
def toy_scorer():
  with scoring.SCORERS.temporarily("toy", toy.Toy):
    yield


def run(config, out, **kwargs):
  spec, scorer = runner.prepare(config)
  stored = runner.check_output(spec, out)
  return runner.run(
    spec, scorer, out, stored=stored, plot=False, log=lambda _: None, **kwargs
  ), scorer


def read(out):
  with open(os.path.join(out, runner.RESULTS), "rb") as f:
    return f.read()


@pytest.mark.parametrize("stop_after", [1, 4, 14])
def test_stopped_and_resumed_study_writes_the_same_bytes(tmp_path, monkeypatch, stop_after):
  straight, _ = run(toy.config(), str(tmp_path / "straight"))
  stopped = str(tmp_path / "stopped")
  monkeypatch.setattr(toy.Toy, "stop_after", stop_after)
  with pytest.raises(KeyboardInterrupt):
    run(toy.config(), stopped)
  partial = json.loads(read(stopped))
  assert len(partial["runs"]) == 2 * stop_after  # two arms per (level, draw) call
  monkeypatch.setattr(toy.Toy, "stop_after", None)
  resumed, scorer = run(toy.config(), stopped)
  assert len(scorer.calls) == 15 - stop_after  # only the unfinished (level, draw) pairs
  assert read(stopped) == read(str(tmp_path / "straight"))
  assert resumed == straight
  history = json.load(open(os.path.join(stopped, runner.PROVENANCE)))
  assert [entry["runs"] for entry in history] == [2 * stop_after, 30 - 2 * stop_after]
  assert history[0]["stopped"] and not history[1]["stopped"]


def test_interrupted_runs_resume_without_rerunning(tmp_path):
  out = str(tmp_path / "out")
  first, scorer = run(toy.config(), out)
  again, scorer = run(toy.config(), out)
  assert scorer.calls == [] and again == first


def test_claims_pair_by_draw_not_by_position(tmp_path):
  results, _ = run(toy.config(), str(tmp_path / "out"))
  spec, _ = runner.prepare(toy.config())
  gap = next(r for r in results["claims"] if r["text"] == "up is higher" and r["level"]["x"] == 4)
  assert gap["verdict"] == "reproduces"
  assert gap["interval"]["mean"] == pytest.approx(0.4, abs=0.03)  # shift * x, noise 0.01
  assert gap["interval"]["hi"] - gap["interval"]["lo"] < 0.1  # the offsets cancel
  shuffled = list(results["runs"])
  random.Random(0).shuffle(shuffled)
  assert report.claim_rows(spec, shuffled) == results["claims"]
  # pairing by list position instead of by draw would not cancel the offsets
  by_position = [
    [r["metrics"]["loss"] for r in shuffled if r["arm"] == arm and r["level"]["x"] == 4]
    for arm in ("up", "base")
  ]
  wrong = stats.paired_difference(*by_position)
  assert wrong.hi - wrong.lo > 1.0


def test_a_misaligned_pairing_is_detected(tmp_path):
  with pytest.raises(report.StudyError, match=r"different data at x=1, draw 0"):
    run(toy.config(settings={"misalign": "up"}), str(tmp_path / "out"))


def test_slope_and_wilson_claims(tmp_path):
  results, _ = run(toy.config(), str(tmp_path / "out"))
  slope = next(r for r in results["claims"] if r["text"] == "the gap grows with x")
  assert slope["level"] == {} and slope["verdict"] == "reproduces"
  assert slope["interval"]["mean"] == pytest.approx(0.1, abs=1e-12)  # noise is per draw
  hits = next(r for r in results["claims"] if r["text"] == "up hits")
  assert hits["interval"]["n"] == 5 and hits["interval"]["mean"] == 1.0
  assert hits["interval"]["lo"] == pytest.approx(stats.wilson(5, 5).lo)
  p = [r["interval"]["p"] for r in results["claims"]]
  assert [r["p_holm"] for r in results["claims"]] == stats.holm(p)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (
      dict(claims=[dict(arm="nope", metric="loss", text="t")]),
      r"study.claims\[0\].arm='nope' is not an arm of the study; arms: base, up",
    ),
    (
      dict(claims=[dict(arm="up", metric="accuracy", text="t")]),
      r"study.claims\[0\].metric='accuracy' is not a metric of the scorer; metrics: loss, hit",
    ),
    (
      dict(claims=[dict(arm="up", reference="ref", metric="loss", text="t")]),
      r"study.claims\[0\].reference='ref' is not an arm",
    ),
    (dict(draws=0), r"study.draws=0 must be an integer >= 1"),
    (dict(scorer="nope"), r"study.scorer='nope' is not known; valid: .*spy"),
    (
      dict(settings={"nois": 1}),
      r"study.settings.nois is not a setting of scorer 'spy'; "
      r"valid: misalign, model_shift, noise, offset",
    ),
    (
      dict(arms=[{"name": "base", "shfit": 1}, {"name": "up"}]),
      r"study.arms\[0\].shfit \(arm 'base'\) is not an arm setting; valid: shift",
    ),
    (dict(reference="other"), r"study.reference='other' is not an arm"),
    (
      dict(claims=[dict(arm="up", metric="loss", text="t", at={"x": 3})]),
      r"study.claims\[0\].at=\{'x': 3\} matches no level",
    ),
    (
      dict(claims=[dict(arm="up", metric="loss", text="t", interval="slope")]),
      r"study.claims\[0\].over=None must name a level axis: x",
    ),
  ],
)
def test_bad_studies_are_refused_before_any_run(tmp_path, overrides, message):
  calls = []
  with scoring.SCORERS.temporarily(
    "spy", type("Spy", (toy.Toy,), {"score": lambda self, *a: calls.append(a)})
  ):
    with pytest.raises(ConfigError, match=message):
      runner.prepare(toy.config(**{"scorer": "spy", **overrides}))
  assert calls == []


def test_outputs_that_hold_something_else_are_refused(tmp_path):
  out = str(tmp_path / "out")
  run(toy.config(), out)
  spec, _ = runner.prepare(toy.config(name="other"))
  with pytest.raises(ConfigError, match="holds the results of study 'toy', not 'other'"):
    runner.check_output(spec, out)
  spec, _ = runner.prepare(toy.config(draws=6))
  with pytest.raises(ConfigError, match=r"study.draws is 6 here but 5 in .*results.json"):
    runner.check_output(spec, out)
  with open(os.path.join(out, runner.RESULTS), "r+") as f:
    f.truncate(100)  # cut off by a kill outside the runner
  spec, _ = runner.prepare(toy.config())
  with pytest.raises(ConfigError, match="is not a complete results file"):
    runner.check_output(spec, out)
  (tmp_path / "foreign").mkdir()
  (tmp_path / "foreign" / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match="not empty and holds no study results"):
    runner.check_output(spec, str(tmp_path / "foreign"))
  with pytest.raises(ConfigError, match="is a file"):
    runner.check_output(spec, str(tmp_path / "foreign" / "notes.txt"))


def test_markdown_labels_claims_not_from_the_paper(tmp_path):
  out = str(tmp_path / "out")
  run(toy.config(), out)
  text = open(os.path.join(out, runner.MARKDOWN)).read()
  assert "up hits (threshold from our spec, not the paper's)" in text
  assert "up is higher |" in text and "30 of 30 runs" in text


def test_a_verdict_that_does_not_survive_holm_is_marked(tmp_path):
  out = str(tmp_path / "out")
  results, _ = run(toy.config(), out)
  hits = next(r for r in results["claims"] if r["text"] == "up hits")
  # 5 of 5: Wilson's interval [0.566, 1] excludes 0.5, the exact binomial p = 2 / 32 does not
  assert hits["verdict"] == "reproduces" and hits["interval"]["p"] == pytest.approx(0.0625)
  assert hits["not_after_holm"]
  assert not any(r["not_after_holm"] for r in results["claims"] if r["text"] != "up hits")
  text = open(os.path.join(out, runner.MARKDOWN)).read()
  assert "| reproduces (not after Holm) |" in text


MODELS = [{"model_shift": 0.0}, {"model_shift": 0.05}, {"model_shift": -0.02}]


def test_a_study_over_models_takes_its_interval_over_the_models(tmp_path):
  """Draws nested in models: the claim's interval is scipy's t-interval of the three
  models' mean paired differences; the draw-level interval pools all 15 pairs."""
  import numpy as np
  import scipy.stats

  results, scorer = run(toy.config(models=MODELS), str(tmp_path / "out"))
  assert len(results["runs"]) == 2 * 3 * 5 * 3 and {r["model"] for r in results["runs"]} == {
    0,
    1,
    2,
  }
  assert [m.settings["model_shift"] for m in scorer.models] == [0.0, 0.05, -0.02]
  row = next(r for r in results["claims"] if r["claim"] == 0 and r["level"] == {"x": 2})
  loss = {
    (r["arm"], r["model"], r["draw"]): r["metrics"]["loss"]
    for r in results["runs"]
    if r["level"] == {"x": 2}
  }
  diffs = np.array(
    [[loss[("up", m, d)] - loss[("base", m, d)] for d in range(5)] for m in range(3)]
  )
  means = diffs.mean(1)
  np.testing.assert_allclose(means, 2 * (0.1 + np.array([0.0, 0.05, -0.02])), atol=0.05)
  t = scipy.stats.ttest_1samp(means, 0.0)
  lo, hi = t.confidence_interval(0.95)
  got = row["interval"]
  assert got["n"] == 3
  np.testing.assert_allclose(
    [got["mean"], got["lo"], got["hi"], got["p"]], [means.mean(), lo, hi, t.pvalue], rtol=1e-12
  )
  pooled = scipy.stats.ttest_1samp(diffs.ravel(), 0.0).confidence_interval(0.95)
  assert row["interval_over_draws"]["n"] == 15
  np.testing.assert_allclose(
    [row["interval_over_draws"]["lo"], row["interval_over_draws"]["hi"]], pooled, rtol=1e-12
  )
  text = open(tmp_path / "out" / runner.MARKDOWN).read()
  assert "over models: mean ± std [95% CI]" in text and "3 models" in text


def test_a_study_over_models_resumes_to_the_same_bytes(tmp_path, monkeypatch):
  straight, _ = run(toy.config(models=MODELS), str(tmp_path / "straight"))
  stopped = str(tmp_path / "stopped")
  monkeypatch.setattr(toy.Toy, "stop_after", 4)  # per model's scorer: model 0 stops first
  with pytest.raises(KeyboardInterrupt):
    run(toy.config(models=MODELS), stopped)
  assert len(json.loads(read(stopped))["runs"]) == 2 * (3 * 3 + 1)
  monkeypatch.setattr(toy.Toy, "stop_after", None)
  resumed, scorer = run(toy.config(models=MODELS), stopped)
  assert sum(len(m.calls) for m in scorer.models) == 45 - 10
  assert read(stopped) == read(str(tmp_path / "straight")) and resumed == straight


@pytest.mark.parametrize(
  "models, message",
  [
    ([{"model_shift": 0.0}, {"nope": 1}], "study.models[1].nope is not a setting"),
    ([], "study.models=[] must be a non-empty list"),
    ([{"model_shift": 0.1}, {"model_shift": 0.1}], "study.models gives a model twice"),
    (
      [{"model_shift": 0.1}, {"model_shift": 2.0}],
      "study.models[1] (model_shift=2.0): study.settings.model_shift=2.0 must be <= 1",
    ),
  ],
)
def test_bad_models_are_refused_before_any_run(tmp_path, models, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    runner.prepare(toy.config(models=models))


def test_a_one_model_study_keeps_its_results_format(tmp_path):
  """No 'models' key in the study and no 'model' in the runs: a study stored before
  models existed resumes unchanged."""
  results, _ = run(toy.config(), str(tmp_path / "out"))
  assert "models" not in results["study"] and "model" not in results["runs"][0]
  assert "interval_over_draws" not in results["claims"][0]


def test_a_configs_settings_are_the_scorers_defaults_with_its_overrides():
  declared = scoring.get("kmeans").settings
  key = next(iter(declared))
  changed = scoring.defaults_with("kmeans", {key: "changed"})
  assert changed == {**declared, key: "changed"} and scoring.defaults_with("kmeans") == declared
  assert scoring.get("kmeans").settings == declared  # the declaration is not edited
  with pytest.raises(ConfigError, match="study.settings.nope is not a setting of scorer 'kmeans'"):
    scoring.defaults_with("kmeans", {"nope": 1})


class WorkdirToy(toy.Toy):
  """The toy scorer reading a trained model: its `workdir` setting."""

  settings = {**toy.Toy.settings, "workdir": ""}


def test_a_study_resumes_only_on_the_models_its_runs_used(tmp_path, monkeypatch, tiny_config):
  """The runs store each model's parameter digest; resuming on a model with other
  parameters (here: another initialisation seed) is refused before any run, and on
  the same parameters (a retrain from the same seed writes the same bytes) it goes on."""
  workdirs = [str(tmp_path / f"model_{i}") for i in range(2)]
  for i, workdir in enumerate(workdirs):
    config = tiny_config()
    config.seed = i
    training_workdir(workdir, config)
  models = [{"workdir": w} for w in workdirs]
  out = str(tmp_path / "out")
  with scoring.SCORERS.temporarily("workdir_toy", WorkdirToy):
    monkeypatch.setattr(toy.Toy, "stop_after", 2)
    with pytest.raises(KeyboardInterrupt):
      run(toy.config(scorer="workdir_toy", models=models), out)
    stored = json.loads(read(out))["model_digests"]
    assert len(stored) == 2 and stored[0] != stored[1] and len(stored[0]) == 64
    monkeypatch.setattr(toy.Toy, "stop_after", None)

    config = tiny_config()
    config.seed = 7  # model 1 is now another model
    shutil.rmtree(workdirs[1])
    training_workdir(workdirs[1], config)
    with pytest.raises(
      ConfigError,
      match=r"cannot resume: study\.models\[1\] \(workdir=.*model_1\) is not the model the",
    ):
      run(toy.config(scorer="workdir_toy", models=models), out)
    assert json.loads(read(out))["model_digests"] == stored  # nothing was changed

    config.seed = 1  # retrained as it was: the same digest, the study resumes
    shutil.rmtree(workdirs[1])
    training_workdir(workdirs[1], config)
    results, _ = run(toy.config(scorer="workdir_toy", models=models), out)
    assert len(results["runs"]) == 2 * 15 * 2 and results["model_digests"] == stored


def test_a_one_level_study_plots_each_arm_s_interval_and_replicates(tmp_path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  c = toy.config(levels=[{"x": 2}])
  c.claims = [c.claims[0]]
  results, _ = run(c, str(tmp_path / "out"))
  spec, _ = runner.prepare(c)
  fig, ax = plt.subplots()
  report.plot_arms(ax, spec, report.index_runs(results["runs"]), "loss")
  for a, arm in enumerate(spec.arm_names):
    found = [r["metrics"]["loss"] for r in results["runs"] if r["arm"] == arm]
    interval = stats.t_interval(found)
    point, caps, _ = ax.containers[a].lines  # errorbar's: the point, its caps, its bar
    assert point.get_xydata().tolist() == [[a, pytest.approx(interval.mean, abs=1e-12)]]
    np.testing.assert_allclose(
      sorted(y for cap in caps for y in cap.get_ydata()), [interval.lo, interval.hi], atol=1e-12
    )
    np.testing.assert_allclose(
      ax.collections[2 * a + 1].get_offsets(), [[a + 0.15, v] for v in found], atol=1e-12
    )
  assert [t.get_text() for t in ax.get_xticklabels()] == ["base", "up"]
  plt.close(fig)
  report.plot(spec, results["runs"], str(tmp_path / "plot.png"))
  assert (tmp_path / "plot.png").stat().st_size > 0


def test_notes_summarise_only_the_metrics_no_claim_tests(tmp_path):
  c = toy.config()
  c.claims = [c.claims[0]]  # claims test "loss" only
  results, _ = run(c, str(tmp_path / "out"))
  spec, _ = runner.prepare(c)
  notes = report.unclaimed_summaries(spec, results["runs"], ("loss", "hit"))
  assert notes == "## hit\n\n" + report.summary_table(spec, results["runs"], "hit")
  assert report.unclaimed_summaries(spec, results["runs"], ("loss",)) == ""
  assert report.unclaimed_summaries(spec, results["runs"], ("hit",), level=3).startswith("### hit")


@pytest.mark.parametrize(
  "value, positive, refused",
  [(0.5, True, False), (0, True, True), (0, False, False), (-1e-9, False, True),
   (float("nan"), False, True), (True, False, True), ("1", False, True)],
)  # fmt: skip
def test_number_settings_are_checked_with_a_one_line_error_naming_them(value, positive, refused):
  spec, scorer = runner.prepare(toy.config())
  scorer.settings = {**scorer.settings, "noise": value}
  if not refused:
    scorer.check_numbers(("noise",), positive=positive)
    return
  bound = ">" if positive else ">="
  with pytest.raises(ConfigError, match=rf"^study\.settings\.noise=.* must be a number {bound} 0$"):
    scorer.check_numbers(("noise",), positive=positive)


@pytest.mark.parametrize("value", [-1, 1.0, True, None])
def test_integer_settings_below_their_minimum_or_not_integers_are_refused(value):
  spec, scorer = runner.prepare(toy.config())
  scorer.settings = {**scorer.settings, "offset": value}
  with pytest.raises(ConfigError, match=r"^study\.settings\.offset=.* must be an integer >= 0$"):
    scorer.check_integers({"offset": 0})
  scorer.settings["offset"] = 0
  scorer.check_integers({"offset": 0})
