"""utils.plots: titles, labels, one line per curve, clear errors (Agg backend, no display)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from utils.plots import _moving_average, bar_compare, plot_curves, plot_log_history  # noqa: E402

LOG_HISTORY = [  # what trainer.state.log_history looks like: train and eval logs are separate dicts
    {"loss": 2.0, "learning_rate": 1e-4, "step": 10},
    {"eval_loss": 1.9, "step": 10},
    {"loss": 1.5, "learning_rate": 9e-5, "step": 20},
    {"eval_loss": 1.6, "step": 20},
    {"loss": 1.2, "learning_rate": 8e-5, "step": 30},
    {"train_runtime": 12.0, "train_loss": 1.5, "step": 30},
]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_log_history_plots_train_and_eval_loss():
    ax = plot_log_history(LOG_HISTORY, title="SFT")
    assert ax.get_title() == "SFT"
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "loss / eval_loss"
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["loss", "eval_loss"]
    assert list(lines[0].get_xdata()) == [10, 20, 30] and list(lines[0].get_ydata()) == [2.0, 1.5, 1.2]
    assert list(lines[1].get_xdata()) == [10, 20]
    assert ax.get_legend() is not None


def test_log_history_skips_absent_keys_and_uses_given_axes():
    _, ax = plt.subplots()
    out = plot_log_history(LOG_HISTORY, keys=("loss", "reward"), ax=ax, ylabel="nats")
    assert out is ax and len(ax.get_lines()) == 1 and ax.get_ylabel() == "nats"


def test_log_history_error_lists_available_keys():
    with pytest.raises(ValueError, match="available keys.*eval_loss.*learning_rate"):
        plot_log_history(LOG_HISTORY, keys=("reward",))
    with pytest.raises(ValueError, match="empty log history"):
        plot_log_history([], keys=("loss",))


def test_plot_curves_lists_tuples_and_smoothing():
    ax = plot_curves({"train": [3.0, 2.0, 1.0], "eval": ([0, 5], [2.5, 1.5])}, title="Loss", ylabel="loss")
    assert ax.get_title() == "Loss" and ax.get_xlabel() == "step" and ax.get_ylabel() == "loss"
    train, evaluation = ax.get_lines()
    assert list(train.get_xdata()) == [1, 2, 3]  # a plain list is drawn against steps 1..N
    assert list(evaluation.get_xdata()) == [0, 5]

    ax = plot_curves({"train": [4.0, 2.0, 0.0, 2.0]}, title="Smoothed", smooth=2)
    raw, smooth = ax.get_lines()  # the raw curve faintly, then the moving average
    assert raw.get_alpha() < 1 and smooth.get_color() == raw.get_color()
    assert list(smooth.get_ydata()) == [4.0, 3.0, 1.0, 1.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train (avg 2)"]


def test_plot_curves_errors():
    with pytest.raises(ValueError, match="no curves"):
        plot_curves({}, title="x")
    with pytest.raises(ValueError, match="smooth"):
        plot_curves({"a": [1.0]}, title="x", smooth=0)
    with pytest.raises(ValueError, match="2 x values but 3 y values"):
        plot_curves({"a": ([1, 2], [1.0, 2.0, 3.0])}, title="x")


def test_moving_average_is_trailing_and_keeps_length():
    assert _moving_average([1.0, 2.0, 3.0, 4.0], 3) == [1.0, 1.5, 2.0, 3.0]


def test_bar_compare_annotates_values():
    ax = bar_compare({"before": 0.1, "after": 0.95}, title="Format compliance", ylabel="share", xlabel="model")
    assert ax.get_title() == "Format compliance" and ax.get_ylabel() == "share" and ax.get_xlabel() == "model"
    assert [p.get_height() for p in ax.patches] == [0.1, 0.95]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["before", "after"]
    assert [t.get_text() for t in ax.texts] == ["0.10", "0.95"]
    with pytest.raises(ValueError, match="no values"):
        bar_compare({}, title="x", ylabel="y")
