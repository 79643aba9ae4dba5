#!/usr/bin/env bash
# Every GPU check of the op's kernels in one short run, for a GPU machine
# lent for minutes (issue 39): correctness, determinism, the sanitizers and
# the launchers' agreement in parallel first, then the timings alone.
#
#   benchmarks/gpu/session.sh PREBUILT OUT
#
# PREBUILT holds what can be built without a GPU (benchmarks/gpu/README.md
# says how): librt.so (xent_capi.cu + xent_kernels.cu.cc, nvcc, sm_90),
# libdrv.so (xent_capi_driver.cc, g++), cubins/ (xent_gpu.py export-cubins:
# CUDA 12's NVRTC, as pip users get it), cases.npz (cpu_vs_gpu.py inputs);
# optionally libold.so (the previous kernels: the speed table's baseline) and
# any other lib<NAME>.so runtime library, timed beside them as NAME
# (libhostexp.so, built with -DEQUIVTOOL_XENT_GPU_HOST_EXP, is also dumped
# for cpu_vs_gpu.py). A library that does not load there is rebuilt from the
# checkout. REPEAT=N times every variant N times, interleaved; SPEED=0 runs
# the checks only. OUT gets the logs, a summary and everything in results.tgz.
set -u
PRE=${1:?usage: session.sh PREBUILT OUT}
OUT=${2:?usage: session.sh PREBUILT OUT}
H=benchmarks/gpu/xent_gpu.py
PY=${PYTHON:-python3}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export PYTHONUNBUFFERED=1 EQUIVTOOL_CACHE_DIR="$W/cache"
mkdir -p "$OUT"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2; $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  compute-sanitizer --version | head -2; uname -r; nproc; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt" >> "$OUT/summary.txt"

# The prebuilt libraries, or built here.
LIBS="$W/libs"; mkdir -p "$LIBS"; cp "$PRE"/*.so "$LIBS"/
if ! $PY -c "import ctypes, sys; [ctypes.CDLL(p) for p in sys.argv[1:]]" "$LIBS"/*.so 2>"$W/load.txt"; then
  say "prebuilt libraries do not load here ($(tail -1 "$W/load.txt")): building"
  $PY $H build --lib "$LIBS/librt.so" --out "$W/build" >/dev/null &
  $PY $H build --lib "$LIBS/libhostexp.so" --define EQUIVTOOL_XENT_GPU_HOST_EXP --out "$W/build" >/dev/null &
  $PY $H build --launcher driver --driver-lib "$LIBS/libdrv.so" --out "$W/build" >/dev/null &
  wait
  rm -f "$LIBS/libold.so"
fi
# This machine's NVRTC, for the agreement check's compile on the spot.
NV=$(ls /usr/local/cuda/lib64/libnvrtc.so.[0-9]* 2>/dev/null | sort | tail -1)
[ -n "$NV" ] && export EQUIVTOOL_NVRTC="$NV"
DRV="--launcher driver --driver-lib $LIBS/libdrv.so --cubins $PRE/cubins"

san() {  # tool: compute-sanitizer over the driver launcher's sanitize cases, our kernels only
  local tool=$1 log="$W/sanitize-$1.txt" rc
  timeout 150 compute-sanitizer --tool "$tool" --kernel-name kns=equivtool_xent --error-exitcode 9 \
    $PY $H sanitize $DRV --out "$W/san-$tool" > "$log" 2>&1
  rc=$?
  if ! grep -q "cases ran" "$log"; then  # an older sanitizer without that filter: every kernel
    mv "$log" "$log.filtered"
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      $PY $H sanitize $DRV --out "$W/san-$tool" > "$log" 2>&1
    rc=$?
  fi
  echo "sanitize $tool: exit $rc; $(grep -E 'cases ran' "$log" | tail -1); $(grep -E 'SUMMARY' "$log" | tail -1)"
}

t0=$(date +%s)
( timeout 300 $PY $H check $DRV --out "$W/check-driver" > "$W/check-driver.txt" 2>&1; echo "check driver: exit $?" ) > "$W/s1" &
( timeout 300 $PY $H determinism $DRV --out "$W/det-driver" > "$W/det-driver.txt" 2>&1; echo "determinism driver: exit $?" ) > "$W/s2" &
( timeout 300 $PY $H check --quick --lib "$LIBS/librt.so" --out "$W/check-runtime" > "$W/check-runtime.txt" 2>&1; echo "check runtime (quick): exit $?" ) > "$W/s3" &
( timeout 300 $PY $H agree $DRV --lib "$LIBS/librt.so" --out "$W/agree" > "$W/agree.txt" 2>&1; echo "agree: exit $?" ) > "$W/s4" &
san memcheck > "$W/s5" &
san racecheck > "$W/s7" &
san synccheck > "$W/s8" &
( timeout 200 $PY $H dump $DRV --inputs "$PRE/cases.npz" --out "$W/dump" > "$W/dump.txt" 2>&1
  echo "dump: exit $?"
  if [ -f "$LIBS/libhostexp.so" ]; then
    timeout 200 $PY $H dump --lib "$LIBS/libhostexp.so" --inputs "$PRE/cases.npz" --out "$W/dump-hostexp" > "$W/dump-hostexp.txt" 2>&1
    echo "dump hostexp: exit $?"
  fi ) > "$W/s6" &
wait
cat "$W"/s[1-8] | tee -a "$OUT/summary.txt"
say "phase 1 (parallel): $(( $(date +%s) - t0 )) s"
for f in check-driver check-runtime det-driver agree; do
  grep -E '^(FAIL|check:|determinism:|agree:|RESULT|Traceback|[A-Za-z]*Error)' "$W/$f.txt" | head -20 | sed "s/^/$f: /" >> "$OUT/summary.txt"
done
cp "$W/dump/gpu_outputs.npz" "$OUT/gpu_outputs.npz" 2>/dev/null
cp "$W/dump-hostexp/gpu_outputs.npz" "$OUT/gpu_outputs_hostexp.npz" 2>/dev/null

# Timings alone on the GPU (SPEED=0 skips them).
if [ "${SPEED:-1}" = 0 ]; then
  tar -czf "$OUT/results.tgz" -C "$W" --exclude='*.so' --exclude=cache --exclude='*.npz' . 2>/dev/null
  say "speed: skipped (SPEED=0); total $(( $(date +%s) - t0 )) s"
  exit 0
fi
t1=$(date +%s)
OTHERS="--time-driver --driver-lib $LIBS/libdrv.so --cubins $PRE/cubins --repeat ${REPEAT:-1}"
[ -f "$LIBS/libold.so" ] && OTHERS="$OTHERS --baseline-lib $LIBS/libold.so"
for lib in "$LIBS"/lib*.so; do
  name=$(basename "$lib" .so); name=${name#lib}
  case $name in rt|drv|old) ;; *) OTHERS="$OTHERS --other $name=$lib" ;; esac
done
timeout 300 $PY $H speed --lib "$LIBS/librt.so" $OTHERS --out "$W/speed" > "$W/speed.txt" 2>&1
say "speed: exit $? in $(( $(date +%s) - t1 )) s"
grep -E '^\|' "$W/speed.txt" >> "$OUT/summary.txt"
cp "$W/speed/speed.json" "$OUT/" 2>/dev/null
tar -czf "$OUT/results.tgz" -C "$W" --exclude='*.so' --exclude=cache --exclude='*.npz' . 2>/dev/null
say "total $(( $(date +%s) - t0 )) s"
