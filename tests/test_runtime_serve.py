"""rules/runtime/serve.py on the CPU: a recorded specialization and the bundle entry built from it match; a
miss says what to record; a served kernel gets the runtime arguments in order. (Serving on a GPU:
bench/zero_jit.py.)"""
import json

from kforge_runtime import record, serve
from tests.test_runtime_record import ARGS, ATTRS, CONSTANTS, OPTIONS, SIGNATURE

LINE = record.record_line("tk.scale", "scale_kernel", ARGS, SIGNATURE, CONSTANTS, ATTRS, OPTIONS, "sm_90a")
ENTRY = {"arch": "sm_90a", "source": {"module": "tk.scale", "entry": "scale_kernel"},
         "signature": [{"name": "x_ptr", "type": "*bf16"}, {"name": "y_ptr", "type": "*bf16"},
                       {"name": "n", "type": "i32"}],
         "constexprs": {"scale": 1, "bias": None, "X_dtype": "bf16", "ACT": "tests.test_runtime_record:relu",
                        "BLOCK": 256},
         "divisible_by_16": ["y_ptr", "x_ptr"], "options": {"num_warps": 8}}


def test_a_record_and_the_bundle_entry_built_from_it_have_one_identity():
    assert serve.record_identity(LINE) == serve.entry_identity(ENTRY)   # num_stages 3 is Triton's default here


def test_any_difference_is_another_identity():
    for change in ({"options": {"num_warps": 4}}, {"divisible_by_16": ["x_ptr"]}, {"arch": "gfx942"},
                   {"constexprs": {**ENTRY["constexprs"], "BLOCK": 128}}):
        assert serve.entry_identity({**ENTRY, **change}) != serve.record_identity(LINE)


def test_an_unreadable_entry_has_no_identity():
    assert serve.entry_identity({"arch": "sm_90a"}) is None


def test_a_strict_miss_names_the_kernel_the_specialization_and_how_to_record_it():
    message = serve.miss_message(LINE)
    assert message.startswith("kforge serve (strict): no prebuilt tk.scale:scale_kernel for sm_90a with ")
    assert json.dumps(LINE["constexprs"]) in message and "python -m kforge_runtime.record" in message


def test_a_served_kernel_launches_with_the_runtime_arguments_in_order():
    calls = []
    served = serve.Served(lambda grid, *args, stream: calls.append((grid, args, stream)), [0, 1, 2])
    served.run(4, 1, 1, 77, None, None, None, None, None, "x", "y", 1000, 1, None, "bf16", "relu", 256)
    assert calls == [((4, 1, 1), ("x", "y", 1000), 77)] and served.launch_metadata((4,), 77) is None
