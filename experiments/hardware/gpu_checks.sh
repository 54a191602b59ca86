#!/usr/bin/env bash
# On a GPU machine (device tool): tcemu's hardware-comparison tests on the GPU backend (same bits
# as on CPU?), the benchmarks, and the SASS of the instructions whose numerics are compiled code.
#   OUT=/some/dir TCEMU_PEER_VECTORS=.carry/peer-vectors bash experiments/hardware/gpu_checks.sh
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tcemu-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
part=${1:-all}
if [ "$part" = all ] || [ "$part" = sass ]; then
  python3 experiments/hardware/kernels.py /tmp/capture.cu
  nvcc -cubin -gencode arch=compute_90a,code=sm_90a -o /tmp/capture.cubin /tmp/capture.cu
  for k in wm_sync_aligned_row_col_m16n16k8_f32_tf32_tf32_f32 ms_m16n8k8_row_col_f32_tf32_tf32_f32 \
           ms_m16n8k32_row_col_f32_e4m3_e4m3_f32 ms_m8n8k4_row_col_f32_f16_f16_f32 \
           ms_m8n8k4_row_col_f16_f16_f16_f16 wm_sync_aligned_row_col_m16n16k16_f16_f32 \
           wm_sync_aligned_row_col_m8n8k4_rn_f64_f64_f64_f64; do
    echo "== $k"; cuobjdump -sass -fun "$k" /tmp/capture.cubin | grep -oE "(HMMA|DMMA|IMMA|FFMA|FADD|F2F|F2FP|HADD2|HFMA2)[.A-Z0-9]*" | sort | uniq -c
  done > "$OUT/sass.txt" 2>&1
  cat "$OUT/sass.txt"
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  python3 benchmarks/bench_mma.py --tiles 131072 --repeats 10 2>&1 | tee "$OUT/bench_mma_gpu.txt"
  python3 benchmarks/bench_wmma_ldst.py --warps 100000 --repeats 10 2>&1 | tee "$OUT/bench_ldst_gpu.txt"
fi
if [ "$part" = all ] || [ "$part" = gemm-bench ]; then
  python3 benchmarks/bench_gemm.py --sizes 512,1024,2048,4096,8192 --rounds 2 2>&1 | tee "$OUT/bench_gemm_gpu.txt"
fi
if [ "$part" = all ] || [ "$part" = gemm-families ]; then
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_gemm.py --sizes ${SIZES:-8192} --rounds 1 --repeats 2 2>&1 \
    | tee "$OUT/bench_gemm_families_gpu.txt"
fi
if [ "$part" = all ] || [ "$part" = sharding ]; then
  python3 benchmarks/bench_sharding.py 2>&1 | tee "$OUT/bench_sharding_gpu.txt"
fi
if [ "$part" = all ] || [ "$part" = cpu-kernel ]; then
  # the compiled CPU kernel on this machine's CPU (its widest vectors: AVX-512 on the GPU hosts)
  # against the pure-JAX engine
  grep -o -m1 -E "avx512f|avx2" /proc/cpuinfo
  JAX_PLATFORMS=cpu TCEMU_NATIVE=1 timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_native.py \
    2>&1 | tail -5 | tee "$OUT/tests_cpu_kernel.txt"
fi
if [ "$part" = all ] || [ "$part" = tests ]; then
  # TCEMU_X64 unset: the hardware-comparison modules run with x64 off and on (tests/conftest.py);
  # TCEMU_X64=0 once with x64 off, to fit a shorter time limit
  timeout 560 python3 -m pytest -q -n 8 -p no:cacheprovider --junitxml="$OUT/junit_gpu.xml" \
    tests/test_wmma_mma_hw.py tests/test_mma_sync_hw.py tests/test_peer_vectors.py \
    tests/test_wmma_layouts.py tests/test_engine_exact.py tests/test_wgmma_hw.py tests/test_matrix_move.py \
    tests/test_signed_zeros_hw.py tests/test_gemm.py tests/test_x64.py tests/test_validation_api.py \
    tests/test_validation_isa.py tests/test_fuzz_api.py tests/test_wgmma_regs_hw.py tests/test_wgmma_regs.py \
    tests/test_mma_sp_hw.py tests/test_mma_sp.py 2>&1 | tail -15 | tee "$OUT/tests_gpu.txt"
fi
