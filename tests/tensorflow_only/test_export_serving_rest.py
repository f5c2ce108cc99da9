"""The REST request bodies of docs/deploy.md, fed to the exported signature.

The bodies are read out of the page's `curl -d '...'` lines, so the ones a
reader copies are the ones tested. No model server runs here: the mapper
below follows TF Serving's JSON <-> tensor rules (its REST API page and
`tensorflow_serving/util/json_tensor.cc`) for what these bodies use, numbers
into float and integer tensors in row (`instances`) and columnar (`inputs`)
form, and refuses what TF Serving refuses there, so a body a server would
reject (an input name the signature lacks, a decimal length, rows of
different sizes) fails here too. The answers are shaped as TF Serving
shapes them and checked against the Keras model and against the answer the
page describes.
"""

import copy
import json
import os
import re
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.demo import build_bigru
from keras_birnn.export.saved_model import SIGNATURE_DEFAULT
from helpers import REPO

DEPLOY_MD = os.path.join(REPO, "docs", "deploy.md")
ROW, COLUMNAR = "row", "columnar"
Json = Any


# --- TF Serving's JSON -> tensor mapping, for numeric dense tensors ------------------


def _json_shape(value: Json) -> List[int]:
    """The shape TF Serving reads off a nested list: the sizes along first elements.

    Every other list must then match it; a ragged list is an error, never
    padded.
    """
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _json_number(value: Json, dtype: tf.DType, where: str) -> Json:
    """One leaf, type-checked as TF Serving does: float tensors take any JSON number,
    integer tensors only whole JSON numbers (`5`, not `5.0`) in range; booleans
    are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    elif dtype.is_floating:
        ok = True
    elif dtype.is_integer:
        ok = isinstance(value, int) and dtype.min <= value <= dtype.max
    else:
        raise ValueError(f"{where}: dtype {dtype.name} is not handled by this mapper")
    if not ok:
        raise ValueError(f"{where}: JSON value {value!r} is not of the expected type {dtype.name}")
    return value


def json_to_array(value: Json, dtype: tf.DType, where: str) -> np.ndarray:
    """A JSON value (scalar or nested lists) as a dense array of `dtype`."""
    shape = _json_shape(value)
    flat: List[Json] = []

    def walk(item: Json, level: int) -> None:
        if isinstance(item, list):
            if level >= len(shape) or len(item) != shape[level]:
                expected = shape[level] if level < len(shape) else "a value, not a list"
                raise ValueError(
                    f"{where}: list of size {len(item)} at nesting level {level}; expected {expected}"
                )
            for element in item:
                walk(element, level + 1)
        elif level != len(shape):
            raise ValueError(f"{where}: value {item!r} at nesting level {level}; expected level {len(shape)}")
        else:
            flat.append(_json_number(item, dtype, where))

    walk(value, 0)
    return np.array(flat, dtype=dtype.as_numpy_dtype).reshape(shape)


def _rows_to_tensors(instances: Json, specs: Mapping[str, tf.TensorSpec]) -> Dict[str, tf.Tensor]:
    """Row form: each instance names every input; each name is stacked over the
    instances along a new 0th (batch) axis, so its shape must agree across them."""
    if not isinstance(instances, list) or not instances:
        raise ValueError("'instances' must be a non-empty list")
    names = set(specs)
    stacked: Dict[str, List[np.ndarray]] = {name: [] for name in specs}
    for i, instance in enumerate(instances):
        if not isinstance(instance, dict):
            # TF Serving takes plain values for single-input signatures; not needed here.
            raise ValueError(f"instance {i} is not an object naming the inputs {sorted(names)}")
        if set(instance) != names:
            raise ValueError(
                f"instance {i} has keys {sorted(instance)}; each instance names exactly "
                f"the signature's inputs {sorted(names)}"
            )
        for name, value in instance.items():
            array = json_to_array(value, specs[name].dtype, f"instance {i}, {name!r}")
            if stacked[name] and array.shape != stacked[name][0].shape:
                raise ValueError(
                    f"instance {i}, {name!r}: shape {array.shape}, but instance 0 has "
                    f"{stacked[name][0].shape}; row form stacks equal shapes"
                )
            stacked[name].append(array)
    return {name: tf.constant(np.stack(arrays)) for name, arrays in stacked.items()}


def _columns_to_tensors(inputs: Json, specs: Mapping[str, tf.TensorSpec]) -> Dict[str, tf.Tensor]:
    """Columnar form: each name maps to its whole tensor, batch axis included.

    TF Serving ignores keys that name no input here (only missing ones are
    errors); `test_documented_bodies_name_exactly_the_signature_inputs` is
    stricter for the page's bodies.
    """
    if not isinstance(inputs, dict):
        # TF Serving takes a plain value for single-input signatures; not needed here.
        raise ValueError(f"'inputs' is not an object naming the inputs {sorted(specs)}")
    missing = sorted(set(specs) - set(inputs))
    if missing:
        raise ValueError(f"'inputs' misses the signature's inputs {missing}")
    return {
        name: tf.constant(json_to_array(inputs[name], spec.dtype, f"'inputs' {name!r}"))
        for name, spec in specs.items()
    }


def rest_to_tensors(body: Json, signatures: Mapping[str, Any]) -> Tuple[str, str, Dict[str, tf.Tensor]]:
    """A predict request body as (signature name, row or columnar, input tensors).

    The dtypes come from the signature, as TF Serving takes them from the
    SignatureDef: JSON has no dtypes of its own.
    """
    if not isinstance(body, dict):
        raise ValueError("the request body is not a JSON object")
    name = body.get("signature_name", SIGNATURE_DEFAULT)
    if not isinstance(name, str):
        raise ValueError("'signature_name' must be a string")
    if name not in signatures:
        raise ValueError(f"no signature {name!r}; the export has {sorted(signatures)}")
    specs = signatures[name].structured_input_signature[1]
    if ("instances" in body) == ("inputs" in body):
        raise ValueError("the body needs exactly one of 'instances' (row form) and 'inputs' (columnar form)")
    if "instances" in body:
        return name, ROW, _rows_to_tensors(body["instances"], specs)
    return name, COLUMNAR, _columns_to_tensors(body["inputs"], specs)


def tensors_to_rest(outputs: Mapping[str, tf.Tensor], form: str) -> Json:
    """The answer TF Serving writes, after a JSON round trip.

    Row form: `{"predictions": [...]}`, one entry per batch row (the value
    itself for a single output, an object keyed by output name for
    several, which must share their batch size). Columnar form:
    `{"outputs": ...}`, the whole tensor for a single output, an object
    keyed by output name for several.
    """
    arrays = {name: np.asarray(tensor) for name, tensor in outputs.items()}
    if form == COLUMNAR:
        value = (
            next(iter(arrays.values())).tolist()
            if len(arrays) == 1
            else {name: array.tolist() for name, array in arrays.items()}
        )
        answer = {"outputs": value}
    else:
        batch_sizes = {array.shape[0] if array.ndim else None for array in arrays.values()}
        if len(batch_sizes) != 1 or None in batch_sizes:
            raise ValueError(f"row form needs outputs with one batch size; got {batch_sizes}")
        if len(arrays) == 1:
            predictions = list(next(iter(arrays.values())).tolist())
        else:
            predictions = [
                {name: array[i].tolist() for name, array in arrays.items()} for i in range(batch_sizes.pop())
            ]
        answer = {"predictions": predictions}
    return json.loads(json.dumps(answer))


# --- the page -------------------------------------------------------------------------


def documented_requests() -> List[Tuple[Json, str]]:
    """Each `curl -d '<body>'` of docs/deploy.md, parsed, with the prose after it.

    The prose runs to the next curl line or heading: it is where the page
    describes that request's answer.
    """
    with open(DEPLOY_MD, encoding="utf-8") as f:
        text = f.read()
    matches = list(re.finditer(r"curl -d '([^']*)'", text))
    requests = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        after = text[match.end() : end].split("\n## ", 1)[0]
        requests.append((json.loads(match.group(1)), after))
    return requests


def documented_answer(prose: str, key: str) -> Json:
    """The page's answer template, e.g. `{"outputs": [[[p_out, p_in], ...], ...]}`,
    made JSON: `...` dropped, placeholder names as 0."""
    match = re.search(r'`(\{"%s":[^`]*\})`' % key, prose)
    assert match, f'the page describes no answer `{{"{key}": ...}}` after this curl line'
    template = re.sub(r",\s*\.\.\.", "", match.group(1))
    template = re.sub(r'(?<![\w"])[A-Za-z_]\w*(?![\w"])', "0", template)
    return json.loads(template)


REQUESTS = documented_requests()


def _form(body: Json) -> str:
    return ROW if "instances" in body else COLUMNAR


def _documented(form: str) -> Json:
    return copy.deepcopy(next(body for body, _ in REQUESTS if _form(body) == form))


# --- the export and the checks ------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The demo's BiGRU tagger (small, untrained) and its reloaded signatures."""
    model = build_bigru(8)
    path = kb.export_saved_model(model, str(tmp_path_factory.mktemp("export") / "run_of_ones"))
    return model, tf.saved_model.load(path).signatures


def test_the_page_has_a_row_and_a_columnar_request():
    """Both forms stay documented, so both stay tested."""
    assert sorted(_form(body) for body, _ in REQUESTS) == [COLUMNAR, ROW]


def test_documented_bodies_name_exactly_the_signature_inputs(served):
    """A columnar body may carry keys TF Serving ignores; the page's should not."""
    _, signatures = served
    for body, _ in REQUESTS:
        specs = signatures[body.get("signature_name", SIGNATURE_DEFAULT)].structured_input_signature[1]
        named = [set(body["inputs"])] if "inputs" in body else [set(row) for row in body["instances"]]
        assert named == [set(specs)] * len(named), (named, sorted(specs))


@pytest.mark.parametrize("index", range(len(REQUESTS)), ids=[_form(body) for body, _ in REQUESTS])
def test_documented_request_answers_as_documented(served, index):
    """The page's body, mapped and served, answers with the key and nesting the page
    describes, the Keras model's numbers at valid steps and zeros at padded ones."""
    model, signatures = served
    body, prose = REQUESTS[index]
    name, form, tensors = rest_to_tensors(body, signatures)
    answer = tensors_to_rest(signatures[name](**tensors), form)

    key = "predictions" if form == ROW else "outputs"
    assert list(answer) == [key]
    got = np.asarray(answer[key], np.float32)  # a single output: no names inside
    template = _json_shape(documented_answer(prose, key)[key])
    assert (len(template), template[-1]) == (got.ndim, got.shape[-1]), (template, got.shape)

    x, lengths = tensors["inputs"].numpy(), tensors["lengths"].numpy()
    assert got.shape == x.shape[:2] + (2,)
    assert 0 < lengths.min() and lengths.min() < x.shape[1], "the page's request should pad a row"
    for row, length in enumerate(lengths):
        # The Keras model on the row's valid steps alone: padding must not matter.
        expected = np.asarray(model(x[row : row + 1, :length], training=False))[0]
        np.testing.assert_allclose(got[row, :length], expected, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(got[row, length:], 0.0)


def test_row_and_columnar_bodies_are_the_same_request(served):
    """The page calls the row body "the same request": same tensors, same dtypes."""
    _, signatures = served
    _, _, row = rest_to_tensors(_documented(ROW), signatures)
    _, _, columnar = rest_to_tensors(_documented(COLUMNAR), signatures)
    assert sorted(row) == sorted(columnar)
    for name in row:
        assert row[name].dtype == columnar[name].dtype
        np.testing.assert_array_equal(row[name].numpy(), columnar[name].numpy())


def _renamed(body: Json, old: str, new: str) -> Json:
    for named in body["instances"] if "instances" in body else [body["inputs"]]:
        named[new] = named.pop(old)
    return body


def _set_row(body: Json, index: int, key: str, value: Json) -> Json:
    body["instances"][index][key] = value
    return body


def _drop_row_key(body: Json, index: int, key: str) -> Json:
    del body["instances"][index][key]
    return body


def _both_forms(body: Json) -> Json:
    body["inputs"] = _documented(COLUMNAR)["inputs"]
    return body


MALFORMED = {
    "row_input_name_the_signature_lacks": (ROW, lambda b: _renamed(b, "lengths", "length"), "keys"),
    "columnar_input_name_the_signature_lacks": (
        COLUMNAR,
        lambda b: _renamed(b, "lengths", "length"),
        "misses",
    ),
    "row_instances_with_different_keys": (
        ROW,
        lambda b: _drop_row_key(b, 1, "lengths"),
        "instance 1 has keys",
    ),
    "row_decimal_length": (ROW, lambda b: _set_row(b, 0, "lengths", 5.0), "int32"),
    "row_string_length": (ROW, lambda b: _set_row(b, 0, "lengths", "5"), "int32"),
    "row_boolean_bit": (ROW, lambda b: _set_row(b, 0, "inputs", [[True]] * 5), "float32"),
    "row_rows_of_different_time": (ROW, lambda b: _set_row(b, 1, "inputs", [[1], [1], [0]]), "shape"),
    "columnar_ragged_rows": (
        COLUMNAR,
        lambda b: b["inputs"].update(inputs=[[[0], [1]], [[1]]]) or b,
        "list of size 1",
    ),
    "both_forms": (ROW, _both_forms, "exactly one"),
    "unknown_signature": (ROW, lambda b: b.update(signature_name="serving") or b, "no signature"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_bodies_are_refused(served, case):
    """Mutations of the page's bodies that TF Serving refuses are refused here,
    so the mapper cannot pass a documented body a server would reject."""
    _, signatures = served
    form, mutate, message = MALFORMED[case]
    with pytest.raises(ValueError, match=message):
        rest_to_tensors(mutate(_documented(form)), signatures)
