#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run:
#   1. the `gpu`-marked tests (.venv/bin/pytest -m gpu -q): NVML, GPM, doctor, instrument(),
#      an on-demand profile of a CUDA job (its kernels, its operators by GPU time);
#   2. world-size-1 NCCL DDP and FSDP jobs with instrument(), printing comm seconds,
#      exposed seconds and bytes per step as measured with CUDA events;
#   3. GPM activity of GPU 0 under a bf16 matmul load and under sleep (bench.gpm_check;
#      Hopper or newer: older GPUs print why they have no GPM series);
#   4. the per-call cost of every NVML call the daemon makes (bench.nvml_call_cost).
# Run from the repository root after `make test` (which builds .venv):
#   bash bench/gpu_check.sh
# Without a GPU it says so and exits 0 without running anything (skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[[ -x "$PY" ]] || { echo "gpu_check: $PY missing; run 'make test' first" >&2; exit 2; }

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA GPU visible to torch; skipped"
    exit 0
fi
"$PY" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

.venv/bin/pytest -m gpu -q -p no:cacheprovider

work=$(mktemp -d /tmp/tm-gpu-XXXX)
trap 'rm -rf "$work"' EXIT
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for mode in ddp fsdp; do
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    TRAINMON_ENDPOINT="unix://$work/none.sock" \
        "$PY" -m testkit.ddp_job "$mode" --device cuda:0 --steps 50 \
        --width 2048 --depth 8 --result "$work/$mode.json" 2>"$work/$mode.log" \
        || { cat "$work/$mode.log" >&2; exit 1; }
    "$PY" - "$mode" "$work/$mode.json" <<'PYEOF'
import json, sys
mode, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))["report"]
steps = report["steps"]
comm, exposed = report.get("comm_seconds"), report.get("comm_exposed_seconds")
if comm is None:
    sys.exit(f"gpu_check: {mode}: no communication measured")
print(f"gpu_check: {mode} NCCL world size 1, {steps} steps of {report['step_seconds'] / steps * 1e3:.2f} ms: "
      f"comm {comm / steps * 1e3:.3f} ms/step, "
      f"exposed {'unknown' if exposed is None else f'{exposed / steps * 1e3:.3f} ms/step'}, "
      f"{report['comm_bytes'] // steps:,} bytes/step")
PYEOF
done

"$PY" -m bench.gpm_check --seconds 10 || echo "gpu_check: no GPM on this GPU (see above)"
"$PY" -m bench.nvml_call_cost --seconds 30
