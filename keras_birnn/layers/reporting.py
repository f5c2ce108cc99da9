"""What every layer that runs loops offers: `loop_report()`.

The counts themselves live in the engine (`recurrence.compile_policy.ShapeCounter`);
this mixin gives a layer its counter and the public report of it.
"""

from keras_birnn.recurrence.compile_policy import ShapeCounter


class LoopReporting:
    """For layers that run loops: their `ShapeCounter` and `loop_report()`."""

    @property
    def shape_counter(self) -> ShapeCounter:
        counter = self.__dict__.get("_shape_counter")
        if counter is None:
            # Set past the layer's attribute tracking: nothing to save or export.
            counter = self.__dict__["_shape_counter"] = ShapeCounter()
        return counter

    def loop_report(self) -> dict:
        """How this layer's loops ran.

        Returns:
            A dict with `"plans"`: each plan that ran (`recurrence.tensorflow.plan.LoopPlan`:
            path, loop form, runner, caller, rows, time padding, empty case,
            lockstep, memory) with its `calls`, counted each time a graph was
            traced or an eager call made; `"traced"`: the same counts per path (`"counted"`: chosen per
            call at run time; `"inference"`: plain loops, uncounted, for
            inference traced for any length; `"compiled"`: XLA for a static shape or an
            export; `"plain"`: under `kb.xla_disabled()`; `"inside-xla"`:
            part of an XLA-compiled caller; `"higher-order"`,
            `"forward-mode"`: for derivatives of derivatives;
            `"forward-only"`: traced for an export), with counts;
            and `"shapes"`: per loop shape met by counted calls (`batch`,
            `time` after time buckets, `training`), its `calls` and whether
            it now runs `compiled`.

        Example:

        ```python
        model.fit(dataset, epochs=2)
        bi.loop_report()["shapes"][:1]
        # [{'batch': 32, 'time': 24, 'training': True, 'calls': 212, 'compiled': True}]
        ```
        """
        return self.shape_counter.report()
