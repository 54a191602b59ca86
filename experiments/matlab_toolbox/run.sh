#!/usr/bin/env bash
# The whole cross-check: cases + MMA-Sim, the toolbox under Octave, tcemu, the table and the data file.
#   experiments/matlab_toolbox/run.sh TOOLBOX_GIT [WORK]
# TOOLBOX_GIT: a clone (or bare mirror) of north-numerical-computing/MATLAB-tensor-core with its
# history; MMASIM_PYTHON: a Python with mmasim==2.1.1, torch and numpy (default python);
# TCEMU_PYTHON: a Python with tcemu installed (default python). Run from the repository root.
set -euo pipefail
TB=$1
WORK=${2:-/tmp/mtc-work}
HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=b12b5a700957655375a1b0c1d0c26e76065da015   # the toolbox's HEAD when this was run
rm -rf "$WORK"
mkdir -p "$WORK/toolbox" "$WORK/shim"
git -C "$TB" archive "$COMMIT" | tar -x -C "$WORK/toolbox"
# MI300XMC.m calls MI300MC.m, deleted in d12a5b3: restore it from that commit's parent, unchanged
git -C "$TB" show d12a5b3^:models/MI300MC.m > "$WORK/shim/MI300MC.m"
cp "$HERE"/shim/*.m "$WORK/shim/"
"${MMASIM_PYTHON:-python}" "$HERE/make_cases.py" --work "$WORK/cases" --seed 2027
octave-cli --no-gui "$HERE/run_toolbox.m" "$WORK/cases" "$WORK/toolbox" "$WORK/shim" > /dev/null 2> "$WORK/octave.log"
"${TCEMU_PYTHON:-python}" "$HERE/compare.py" --work "$WORK/cases" --out tests/data/matlab_toolbox_amd.npz \
  --toolbox-commit "$COMMIT" --octave "$(octave-cli --version | head -1 | awk '{print $NF}')" | tee "$WORK/compare.txt"
