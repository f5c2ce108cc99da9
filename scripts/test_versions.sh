#!/usr/bin/env bash
# Honest versions: installs each named combination of TensorFlow, Keras and
# NumPy into a fresh virtual environment and runs a subset of the tests on it.
# `oldest` must equal pyproject.toml's lower bounds; `newest` is the newest on
# the registry. Exits nonzero if any combination fails (install or tests).
#
#   scripts/test_versions.sh                        # every combination, $SUBSET
#   scripts/test_versions.sh --only oldest          # one (comma-separated names)
#   scripts/test_versions.sh --reuse                # keep an existing venv
#   scripts/test_versions.sh --combo "try 2.19.0 3.8.0 2.1.3"  # ad hoc, instead
#   scripts/test_versions.sh tests/tensorflow_only/test_crf.py -x   # paths and pytest args
#
# Paths given replace $SUBSET; other arguments go to pytest after $PYTEST_ARGS.
# Venvs live under $VERSIONS_DIR (default .versions/, git-ignored).
set -uo pipefail

# name     tensorflow-cpu  keras    numpy
COMBOS=(
  "oldest  2.21.0          3.15.1   2.4.0"
  "newest  2.21.0          3.15.1   2.4.6"
)
# A representative subset, small enough for a shared CPU: the layer contract
# (every public layer: config, serialization, symbolic shapes, masks), the
# Keras-equivalence and masking maths, and the CRF.
SUBSET=(
  tests/tensorflow_only/test_layers_contract.py
  tests/tensorflow_only/test_layers_keras_equivalence.py
  tests/tensorflow_only/test_masking.py
  tests/tensorflow_only/test_crf.py
)
# Every case of these files (the fast subset, -m "not slow", keeps only the
# first case of each parametrized test: too little to judge a version by).
PYTEST_ARGS=(-p no:cacheprovider)
# The test extra's test runners (pyproject.toml); its exporters (tf2onnx,
# onnxruntime, ai-edge-litert) pin their own TensorFlow-adjacent versions and
# only the export tests need them.
TEST_DEPS=("pytest>=9.2" "hypothesis>=6.170")
PYTHON=${PYTHON:-python3}

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
VERSIONS_DIR=${VERSIONS_DIR:-$ROOT/.versions}
export TF_CPP_MIN_LOG_LEVEL=3 KERAS_BACKEND=tensorflow

only="" reuse=0 paths=() extra=()
while (($#)); do
  case $1 in
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --reuse) reuse=1; shift ;;
    --combo) COMBOS=("$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    tests/*|tests) paths+=("$1"); shift ;;
    *) extra+=("$1"); shift ;;
  esac
done
((${#paths[@]})) || paths=("${SUBSET[@]}")
for p in "${paths[@]}"; do
  [[ -e ${p%%::*} ]] || { echo "no such test path: $p" >&2; exit 2; }
done

mkdir -p "$VERSIONS_DIR"
rows=() status=0 ran=0
for combo in "${COMBOS[@]}"; do
  read -r name tf keras numpy <<<"$combo"
  if [[ -n $only && ",$only," != *",$name,"* ]]; then continue; fi
  ran=1
  venv=$VERSIONS_DIR/$name log=$VERSIONS_DIR/$name.log
  start=$SECONDS
  echo "=== $name: tensorflow-cpu==$tf keras==$keras numpy==$numpy ($venv)"
  ok=1
  if ((!reuse)) || [[ ! -x $venv/bin/python ]]; then
    rm -rf "$venv"
    { "$PYTHON" -m venv "$venv" &&
      "$venv/bin/python" -m pip install --upgrade pip &&
      "$venv/bin/python" -m pip install "tensorflow-cpu==$tf" "keras==$keras" "numpy==$numpy" "${TEST_DEPS[@]}" &&
      "$venv/bin/python" -m pip install --no-deps -e .; } >"$venv.install.log" 2>&1 ||
      { ok=0; tail -20 "$venv.install.log"; }
  fi
  if ((ok)); then
    # What actually got imported (a resolver surprise shows here).
    got=$("$venv/bin/python" -c 'import tensorflow as t, keras as k, numpy as n; print(t.__version__, k.__version__, n.__version__)' 2>/dev/null) || ok=0
  fi
  if ((!ok)); then
    rows+=("$name|$tf|$keras|$numpy|INSTALL FAILED|-|$(( (SECONDS - start + 30) / 60 ))")
    status=1
    continue
  fi
  read -r tf keras numpy <<<"$got"
  "$venv/bin/python" -m pytest "${paths[@]}" "${PYTEST_ARGS[@]}" "${extra[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  # pytest's last line, e.g. "3 failed, 250 passed, 2 skipped in 301.2s".
  summary=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)' "$log" | tail -1)
  count() { grep -oE "[0-9]+ $1" <<<"$summary" | grep -oE '^[0-9]+' || echo 0; }
  counts="$(count passed) passed / $(( $(count failed) + $(count error) )) failed"
  result=pass
  ((rc == 0)) || { result="FAIL (rc $rc)"; status=1; }
  rows+=("$name|$tf|$keras|$numpy|$result|$counts|$(( (SECONDS - start + 30) / 60 ))")
done
((ran)) || { echo "no combination named: $only" >&2; exit 2; }

echo
echo "$(date -u +%F) Python $("$PYTHON" -c 'import platform; print(platform.python_version())') | tests: ${paths[*]} ${PYTEST_ARGS[*]} ${extra[*]}"
{
  echo "name|tensorflow|keras|numpy|result|passed/failed|minutes"
  printf '%s\n' "${rows[@]}"
} | column -t -s '|' -o ' | '
exit $status
