#!/usr/bin/env bash
# GPU validation, run on the device machine from the repo root (see README "GPU validation").
# Writes its logs and JSON records to $OUT (or ./gpu_out).
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, cupy, platform
print("python", platform.python_version(), "torch", torch.__version__, "cupy", cupy.__version__)
print("gpu", torch.cuda.get_device_name(0), "cupy sees cuda:", cupy.cuda.is_available())
PY
if ls .whl/nvfuser*.whl > /dev/null 2>&1; then
  python -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvf .whl/nvfuser*.whl > "$OUT/nvfuser_install.log" 2>&1
  PYTHONPATH=/tmp/nvf timeout 300 python perf/nvfuser_probe.py > "$OUT/nvfuser_probe.txt" 2>&1
  echo "nvfuser probe exit $?" >> "$OUT/nvfuser_probe.txt"
  tail -5 "$OUT/nvfuser_probe.txt"
fi
timeout ${TEST_TIMEOUT:-240} python -m pytest -q tests/test_gpu.py ${EXTRA_TESTS:-} 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
