"""The one configuration of how loops are built: switches, compile settings
and tuning constants, held per context.

`LoopConfig` is a frozen dataclass kept in a `contextvars.ContextVar`, so a
`with kb.xla_disabled():` block changes what is traced in its own thread
(and its own asyncio task) only, as Keras keeps its global state per
thread. A new thread starts from the defaults. Every setting is read when
functions are traced: loops already traced keep what they were built with.

The tuning constants were set by measurements on the project's 2-core
development machine; each names the section of benchmarks/README.md that
holds them. They are settings, not promises: `kb.configure_loops(...)`
changes them for a block, and the loops built under other values are
cached apart (`recurrence.tensorflow.plan.Build`).

Example:

```python
with kb.configure_loops(max_compiled_shapes=4, loop_cache_size=64):
    model.fit(dataset)
kb.loop_config().max_compiled_shapes  # 16 again here
```
"""

import contextlib
import contextvars
import dataclasses
import warnings
from typing import Iterator, Union


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How loops are built. Change it with `kb.configure_loops(...)` or the
    shorthands (`kb.xla_disabled()`, `kb.for_export()`,
    `kb.lockstep_directions()`, `kb.compilation(...)`).

    Args:
        xla: Loops may run XLA-compiled. False under `kb.xla_disabled()`.
        custom_gradient: Loops carry the hand-written BPTT as a custom
            gradient. False under `kb.for_export()`: forward loops alone,
            plain TensorFlow, for serving graphs.
        concurrent_directions: In graphs, each direction of a
            bidirectional layer is its own loop, run at the same time as
            the other. False under `kb.lockstep_directions()`.
        compact_rows: Sequence-level encoders leave rows without a valid
            step out of their loops. False when tracing for LiteRT.
        empty_case: Loops may sit under a `tf.cond` for a zero-length time
            axis (and `kb.NestedEncoder` may branch on its item count).
            False when tracing for LiteRT, whose converter cannot see
            weights through a branch.
        compile_after: A loop shape runs XLA-compiled from the
            `compile_after`-th time a layer meets it, or (`"auto"`) once the
            layer has run `auto_compile_steps` time steps at it.
        max_compiled_shapes: At most this many shapes per layer are
            compiled (0: none).
        auto_compile_steps: Time steps (calls times the bucketed time
            size) at one shape before `"auto"` compiles it. Set from the
            compile's price over the plain loop's rent per step
            (benchmarks/README.md, "What a compilation costs and saves").
        inline_step_limit: Multiply-adds of one step's matmuls up to which
            a one-direction XLA inference loop reads its inputs inside the
            step (benchmarks/README.md, "Design measurements": small inference
            steps on one thread).
        functional_step_limit: Multiply-adds of one step (all rows) up to
            which a plain loop runs as a functional `While` rather than
            lowered (benchmarks/README.md, "Plain loops: functional or lowered").
        functional_row_limit: Multiply-adds per row above which a plain
            loop is never functional (same section).
        functional_training_rows: Rows (Keras's default batch size) that
            a training loop's batch must allow in the functional form for
            that form to be built at all, and the batch exports are laid
            out for (benchmarks/README.md, "The first step").
        bucket_shortest: Time steps of the shortest time bucket
            (`bucketing`).
        buckets_per_doubling: Time buckets per doubling of the length.
        grouped_from_items: Valid items from which `kb.NestedEncoder`'s
            inference call encodes in length groups: between one sentence's
            items (one call faster) and 64 sentences' (the groups faster;
            benchmarks/README.md, "The examples with `--layers keras`").
        loop_cache_size: Entries (traced loop functions and runners) the
            process-wide loop cache keeps, least recently used dropped
            first (`kb.clear_loop_cache()` drops them all).
        max_counted_shapes: Shapes per layer whose calls are counted for
            the compile policy; shapes met after that run plain, uncounted.
        vendor_kernels: On PyTorch, eligible loops run PyTorch's own
            GRU/LSTM/RNN kernels on packed sequences
            (`recurrence.vendor.torch_kernels`); on JAX with a GPU, eligible
            LSTMs run cuDNN's (`recurrence.vendor.jax_kernels`). False: the
            scan engine's step loop. Read per call. (`fused_kernels=`, its
            old name, still works in `configure_loops` and warns.)
    """

    xla: bool = True
    custom_gradient: bool = True
    concurrent_directions: bool = True
    compact_rows: bool = True
    empty_case: bool = True
    compile_after: Union[int, str] = "auto"
    max_compiled_shapes: int = 16
    auto_compile_steps: int = 6_000
    inline_step_limit: int = 5_000_000
    functional_step_limit: int = 1_000_000
    functional_row_limit: int = 50_000
    functional_training_rows: int = 32
    bucket_shortest: int = 8
    buckets_per_doubling: int = 2
    grouped_from_items: int = 256
    loop_cache_size: int = 512
    max_counted_shapes: int = 4_096
    vendor_kernels: bool = True

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is bool:
                if not isinstance(value, bool):
                    raise TypeError(f"`{field.name}` must be a bool, received {value!r}.")
            elif field.name == "compile_after":
                if value != "auto" and not _is_count(value, 1):
                    raise ValueError(f'`compile_after` must be an integer >= 1 or "auto", received {value!r}.')
            elif not _is_count(value, _MINIMUM.get(field.name, 1)):
                minimum = _MINIMUM.get(field.name, 1)
                raise ValueError(f"`{field.name}` must be an integer >= {minimum}, received {value!r}.")

    @property
    def fused_kernels(self) -> bool:
        """Deprecated name of `vendor_kernels` (warns)."""
        warnings.warn("LoopConfig.fused_kernels is deprecated and will be removed after this release; "
                      "use LoopConfig.vendor_kernels.", DeprecationWarning, stacklevel=2)
        return self.vendor_kernels


_MINIMUM = {"max_compiled_shapes": 0, "inline_step_limit": 0, "functional_step_limit": 0,
            "functional_row_limit": 0, "functional_training_rows": 0, "buckets_per_doubling": 1,
            "grouped_from_items": 0}


def _is_count(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


_CONFIG: contextvars.ContextVar = contextvars.ContextVar("keras_birnn_loop_config", default=LoopConfig())


def loop_config() -> LoopConfig:
    """The `LoopConfig` in force in this context (thread, task)."""
    return _CONFIG.get()


@contextlib.contextmanager
def configure_loops(**changes) -> Iterator[LoopConfig]:
    """Sets `LoopConfig` fields for the `with` block, in this context only.

    Args:
        **changes: `LoopConfig` fields and their values; checked like the
            dataclass's own arguments.

    Example:

    ```python
    with kb.configure_loops(compile_after=1, max_compiled_shapes=4):
        model.fit(dataset)
    ```
    """
    changes = _with_new_names(changes)
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(LoopConfig)})
    if unknown:
        raise TypeError(f"`configure_loops` got unknown settings {unknown}; LoopConfig has "
                        f"{[f.name for f in dataclasses.fields(LoopConfig)]}.")
    token = _CONFIG.set(dataclasses.replace(_CONFIG.get(), **changes))
    try:
        yield _CONFIG.get()
    finally:
        _CONFIG.reset(token)


# Settings renamed: each old name still works in `configure_loops` and warns.
_RENAMED = {"fused_kernels": "vendor_kernels"}


def _with_new_names(changes: dict) -> dict:
    """`changes` with renamed settings under their new names, each old name
    warning (DeprecationWarning) that it is deprecated."""
    renamed = dict(changes)
    for old, new in _RENAMED.items():
        if old in renamed:
            warnings.warn(f"configure_loops({old}=...) is deprecated and will be removed after this release; "
                          f"use configure_loops({new}=...).", DeprecationWarning, stacklevel=4)
            if new in renamed:
                raise TypeError(f"configure_loops() received both `{old}` (deprecated) and `{new}`: pass `{new}` only.")
            renamed[new] = renamed.pop(old)
    return renamed


def xla_disabled():
    """Runs loops traced inside the block as plain TensorFlow graphs instead
    of XLA clusters (part of `for_export`, which exports use, so that
    serving needs no XLA JIT). This context only."""
    return configure_loops(xla=False)


@contextlib.contextmanager
def for_export() -> Iterator[None]:
    """Builds the loops traced inside the block for an exported serving graph.

    Plain TensorFlow `While` loops (no XLA cluster, as `xla_disabled`), and
    the forward pass alone, without the training path's custom gradient
    and hand-written BPTT: a model server needs no XLA JIT, reloading
    prints no "unsaved custom gradients" warning, and a gradient asked of
    the reloaded graph comes from TensorFlow's autodiff through the loops.
    `kb.export_saved_model` traces this way; use it around Keras's own
    `model.export` or `keras.export.ExportArchive.add_endpoint`. This
    context only, read when functions are traced.

    Example:

    ```python
    with kb.for_export():
        model.export("saved_models/tagger/1")
    ```
    """
    with configure_loops(xla=False, custom_gradient=False):
        yield


def lockstep_directions():
    """Builds bidirectional layers with both directions in lockstep, advancing
    in the same iteration of one loop, even in graphs, instead of one loop
    per direction run concurrently: slower, but for a GRU a training step's
    peak memory is lower (for an LSTM it is not; benchmarks/README.md,
    "Memory"), for very long sequences. This context only, read when
    functions are traced.

    Example:

    ```python
    with kb.lockstep_directions():
        model.fit(dataset)
    ```
    """
    return configure_loops(concurrent_directions=False)


def fused_directions():
    """Deprecated name of `lockstep_directions` (the same context)."""
    warnings.warn("kb.fused_directions() is deprecated and will be removed after this release; "
                  "use kb.lockstep_directions().", DeprecationWarning, stacklevel=2)
    return lockstep_directions()


def rows_kept():
    """Sequence-level encoders run every row instead of leaving rows without
    a valid step out (`bucketing.valid_rows`). For `litert.export_tflite`:
    the row compaction's DynamicPartition / ScatterNd are no LiteRT builtin
    ops, and a batch of dynamic size would make the loops' TensorLists
    dynamic. Exact either way: a fully masked row changes nothing."""
    return configure_loops(compact_rows=False)


def no_empty_case():
    """Loops traced inside have no branch for a zero-length time axis, and
    no layer puts them under a `tf.cond`, for `litert.export_tflite`: a
    branch hides the weights from the converter, which then multiplies with
    slow BATCH_MATMULs, not FULLY_CONNECTED. Such a graph needs at least
    one time step (with none it fails, it is not silently wrong)."""
    return configure_loops(empty_case=False)
