"""Tuned selection on CPU: the best config for a tuned shape, the nearest tuned shape's winner otherwise,
never a config that cannot handle the shape, and a clear error when none can."""
import pytest

from kforge_runtime.schema import TUNE_FORMAT
from kforge_runtime.select import NoTunedConfig, check_table, choose, distance

ENTRIES = {"big": {"divisible_by_16": ["K"]}, "small": {"divisible_by_16": ["K"]}, "any": {}}
TABLE = {"format": "kforge-tune-1", "kernel": "gemm", "shape_args": ["M", "N", "K"], "shapes": [
    {"shape": [4096, 4096, 4096], "ranking": [{"config_id": "big", "us": 900.0}, {"config_id": "any", "us": 1500.0}]},
    {"shape": [16, 4096, 4096], "ranking": [{"config_id": "small", "us": 40.0}, {"config_id": "big", "us": 90.0}]},
]}


def shape(m, n, k):
    return {"M": m, "N": n, "K": k}


def test_a_tuned_shape_gets_its_best_config():
    assert choose(TABLE, shape(4096, 4096, 4096), ENTRIES)[0] == "big"
    assert choose(TABLE, shape(16, 4096, 4096), ENTRIES) == ("small", "tuned for this shape, rank 1 there")


def test_an_unseen_shape_gets_the_nearest_tuned_shapes_winner():
    config, why = choose(TABLE, shape(32, 4096, 4096), ENTRIES)   # log2 distance 1 to [16,...], 7 to [4096,...]
    assert config == "small" and "nearest tuned shape [16, 4096, 4096]" in why
    assert choose(TABLE, shape(2048, 4096, 8192), ENTRIES)[0] == "big"
    assert distance([1024, 1, 1], [2048, 1, 1]) == distance([16, 1, 1], [32, 1, 1]) == 1.0


def test_a_config_that_cannot_handle_the_shape_is_never_chosen():
    config, why = choose(TABLE, shape(4096, 4096, 4100), ENTRIES)   # K not 16-divisible: only "any" can
    assert config == "any" and "rank 2" in why


def test_nothing_that_can_handle_the_shape_is_a_clear_error():
    table = {**TABLE, "shapes": TABLE["shapes"][1:]}
    with pytest.raises(NoTunedConfig, match=r"'K': 100}: no ranked config can handle .*tuned shapes: \[16, 4096, 4096\]"):
        choose(table, shape(16, 4096, 100), ENTRIES)
    with pytest.raises(NoTunedConfig, match="missing \\['K'\\]"):
        choose(TABLE, {"M": 1, "N": 1}, ENTRIES)


PER_DTYPE = {"format": "kforge-tune-1", "kernel": "gemm", "shape_args": ["M", "N", "K"], "shapes": [
    {"shape": [64, 64, 64], "where": {"dtype": "bf16"}, "ranking": [{"config_id": "bf16-a", "us": 1.0}]},
    {"shape": [64, 64, 64], "where": {"dtype": "fp16"}, "ranking": [{"config_id": "fp16-a", "us": 1.0}]},
]}
PER_DTYPE_ENTRIES = {"bf16-a": {}, "fp16-a": {}}


def test_where_picks_among_the_callers_kind_only():
    assert choose(PER_DTYPE, shape(64, 64, 64), PER_DTYPE_ENTRIES, {"dtype": "fp16"})[0] == "fp16-a"
    assert choose(PER_DTYPE, shape(99, 64, 64), PER_DTYPE_ENTRIES, {"dtype": "bf16"})[0] == "bf16-a"


def test_a_table_of_several_kinds_needs_where():
    with pytest.raises(NoTunedConfig, match=r'ranked separately .* say which with where=, e.g. where=\{"dtype": "bf16"\}'):
        choose(PER_DTYPE, shape(64, 64, 64), PER_DTYPE_ENTRIES)
    with pytest.raises(NoTunedConfig, match=r"nothing tuned where \{'dtype': 'fp8'\}"):
        choose(PER_DTYPE, shape(64, 64, 64), PER_DTYPE_ENTRIES, {"dtype": "fp8"})


def test_between_equally_near_tuned_shapes_the_config_good_on_both_wins():
    table = {"format": "kforge-tune-1", "kernel": "gemm", "shape_args": ["M", "N", "K"], "shapes": [
        {"shape": [256, 4096, 4096], "ranking": [{"config_id": "small", "us": 10.0}, {"config_id": "both", "us": 11.0},
                                                {"config_id": "big", "us": 30.0}]},
        {"shape": [1024, 4096, 4096], "ranking": [{"config_id": "big", "us": 20.0}, {"config_id": "both", "us": 21.0},
                                                 {"config_id": "small", "us": 50.0}]}]}
    entries = {"small": {}, "both": {}, "big": {}}
    config, why = choose(table, shape(512, 4096, 4096), entries)   # log2 distance 1 to each
    assert config == "both" and "equally near tuned shapes [256, 4096, 4096], [1024, 4096, 4096]" in why
    assert choose(table, shape(300, 4096, 4096), entries)[0] == "small"   # nearer to 256: its winner
    only_big = {"big": {}, "small": {"divisible_by_16": ["K"]}, "both": {"divisible_by_16": ["K"]}}
    assert choose(table, shape(512, 4096, 4100), only_big)[0] == "big"   # the others cannot handle K=4100
    table["shapes"][1]["ranking"] = []   # every config was rejected there: the other shape's winner
    assert choose(table, shape(512, 4096, 4096), entries)[0] == "small"


@pytest.mark.parametrize("bad_row, why", [
    ("not a row", "is not an object"),
    ({"shape": [64], "ranking": []}, "needs 'shape': 2 positive integers"),
    ({"shape": [64, "x"], "ranking": []}, "needs 'shape': 2 positive integers"),
    ({"shape": [64, 0], "ranking": []}, "needs 'shape': 2 positive integers"),
    ({"shape": [64, 64], "where": [], "ranking": []}, "'where' that is not an object"),
    ({"shape": [64, 64]}, "needs a 'ranking' list"),
    ({"shape": [64, 64], "ranking": [{"config_id": "a"}]}, "a positive 'us' time"),
    ({"shape": [64, 64], "ranking": [{"config_id": "a", "us": 0}]}, "a positive 'us' time"),
    ({"shape": [64, 64], "ranking": [{"config_id": 7, "us": 1.0}]}, "a positive 'us' time"),
    ({"shape": [64, 64], "ranking": ["a"]}, "a positive 'us' time"),
    ({"shape": [64, 64], "ranking": [{"config_id": "a", "us": 10 ** 400}]}, "a positive 'us' time"),   # no float
])
def test_a_malformed_table_row_is_refused_with_no_tuned_config_not_a_crash_later(bad_row, why):
    """A table comes from a bundle: rows choose() would read and trip on (KeyError, TypeError,
    ZeroDivisionError in a log) are refused up front, naming the row."""
    table = {"format": TUNE_FORMAT, "kernel": "k", "shape_args": ["M", "N"],
             "shapes": [{"shape": [32, 32], "ranking": [{"config_id": "a", "us": 1.0}]}, bad_row]}
    with pytest.raises(NoTunedConfig, match=rf"t\.json: shapes\[1\] .*{why}"):
        check_table(table, "t.json")


@pytest.mark.parametrize("change, why", [
    ({"kernel": "a\nb" + "X" * 100_000}, "'kernel' must be the kernel's name"),
    ({"kernel": 7}, "'kernel' must be the kernel's name"),
    ({"shape_args": [f"a{i}" for i in range(200_000)]}, "1 to 16 argument names"),
    ({"shape_args": ["M\nN", "N"]}, "1 to 16 argument names"),
    ({"shapes": []}, "a non-empty 'shapes' list"),
])
def test_a_table_whose_names_would_make_a_message_of_pages_is_refused_in_a_short_line(change, why):
    """The kernel and argument names go into every message choose() gives: names, bounded, or the table is refused."""
    table = {"format": TUNE_FORMAT, "kernel": "k", "shape_args": ["M", "N"],
             "shapes": [{"shape": [32, 32], "ranking": [{"config_id": "a", "us": 1.0}]}], **change}
    with pytest.raises(NoTunedConfig, match=why) as raised:
        check_table(table, "t.json")
    assert len(str(raised.value)) < 300 and "\n" not in str(raised.value)


@pytest.mark.parametrize("table", [[], {"format": "kforge-tune-0"}, {"shape_args": ["M"]}])
def test_a_tuning_table_that_is_not_one_is_refused_in_one_line_naming_it(table):
    """select.py 27 (a bundle's tune/<kernel>.json that is no kforge-tune-1 object): reachable from an altered or
    foreign bundle, never run in the whole suite's coverage."""
    with pytest.raises(NoTunedConfig) as e:
        check_table(table, "b.whl: tune/gemm.json")
    assert str(e.value) == f"b.whl: tune/gemm.json: not a {TUNE_FORMAT} tuning table"


def test_between_equally_near_tuned_shapes_sharing_no_config_the_nearer_rows_best_wins():
    """select.py 120: tied shapes (1024 and 4096 around 2048) whose rankings share no config: no config good on
    both, so the first tied row's best that can run is chosen; never run in the whole suite's coverage."""
    table = {"format": TUNE_FORMAT, "kernel": "k", "shape_args": ["M"], "shapes": [
        {"shape": [1024], "ranking": [{"config_id": "a", "us": 1.0}]},
        {"shape": [4096], "ranking": [{"config_id": "b", "us": 2.0}]}]}
    check_table(table, "t")
    entries = {"a": {}, "b": {}}
    config_id, why = choose(table, {"M": 2048}, entries)
    assert config_id == "a" and why == "nearest tuned shape [1024] (log2 L1 distance 1.00), rank 1 there"
    config_id, why = choose(table, {"M": 2048}, {"b": {}})
    assert config_id == "b" and why == "nearest tuned shape [4096] (log2 L1 distance 1.00), rank 1 there"
