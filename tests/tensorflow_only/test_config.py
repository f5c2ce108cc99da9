"""`kb.LoopConfig`: one configuration per context, its checks, and the
shorthands that set it."""

import threading
import warnings

import pytest

import keras_birnn as kb
from keras_birnn.recurrence import compile_policy


def test_defaults_and_shorthands():
    config = kb.loop_config()
    assert (config.xla, config.custom_gradient, config.concurrent_directions) == (True, True, True)
    assert (config.compile_after, config.max_compiled_shapes) == ("auto", 16)
    with kb.for_export():
        assert (kb.loop_config().xla, kb.loop_config().custom_gradient) == (False, False)
        with kb.lockstep_directions(), kb.compilation(compile_after=3, max_compiled_shapes=2):
            inner = kb.loop_config()
            assert (inner.concurrent_directions, inner.compile_after, inner.max_compiled_shapes) == (False, 3, 2)
            assert compile_policy.settings() == {"compile_after": 3, "max_compiled_shapes": 2}
        assert kb.loop_config().concurrent_directions
    assert kb.loop_config() == config


def test_fused_directions_is_a_deprecated_alias_of_lockstep_directions():
    """The old name still sets the same switch, for the block only, and
    warns naming the new one; the new name does not warn."""
    with pytest.warns(DeprecationWarning, match=r"kb\.lockstep_directions\(\)"):
        context = kb.fused_directions()
    with context:
        assert not kb.loop_config().concurrent_directions
    assert kb.loop_config().concurrent_directions
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with kb.lockstep_directions():
            assert not kb.loop_config().concurrent_directions
    assert {"fused_directions", "lockstep_directions"} <= set(kb.__all__)


@pytest.mark.parametrize("changes, error, message", [
    ({"compile_after": 0}, ValueError, '`compile_after` must be an integer >= 1 or "auto", received 0'),
    ({"compile_after": "often"}, ValueError, "received 'often'"),
    ({"max_compiled_shapes": -1}, ValueError, "`max_compiled_shapes` must be an integer >= 0, received -1"),
    ({"loop_cache_size": 0}, ValueError, "`loop_cache_size` must be an integer >= 1, received 0"),
    ({"auto_compile_steps": 2.5}, ValueError, "`auto_compile_steps` must be an integer >= 1, received 2.5"),
    ({"xla": "no"}, TypeError, "`xla` must be a bool, received 'no'"),
    ({"max_counted_shapes": True}, ValueError, "received True"),
    ({"xla_enabled": False}, TypeError, "unknown settings ['xla_enabled']"),
])
def test_bad_settings_name_the_field_and_the_value(changes, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        with kb.configure_loops(**changes):
            pass
    assert kb.loop_config() == kb.LoopConfig()  # nothing left set


def test_a_block_holds_in_its_own_thread_only():
    seen, inside, leave = {}, threading.Event(), threading.Event()

    def hold():
        with kb.xla_disabled():
            seen["holder"] = kb.loop_config().xla
            inside.set()
            leave.wait(timeout=10)

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(timeout=10)
    seen["main"] = kb.loop_config().xla
    other = threading.Thread(target=lambda: seen.update(other=kb.loop_config().xla))
    other.start()
    other.join()
    leave.set()
    holder.join()
    assert seen == {"holder": False, "main": True, "other": True}
