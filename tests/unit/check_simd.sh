#!/usr/bin/env bash
# Checks the generated code of the reduction kernels (common/reduce.c):
# the float32 sum and average kernels are vectorised in each clone (AVX-512F
# on zmm, AVX2 on ymm, baseline SSE on xmm), float16 conversion uses F16C,
# and nothing was contracted into an FMA (results must not depend on the
# clone that runs).
#   check_simd.sh OBJECT BUILD_TYPE
# Exit 77 (SKIP) where the check cannot apply: no objdump, not x86-64 gcc,
# or an unoptimised (Debug) build, which vectorises nothing by design.
set -u
obj=$1 type=${2:-}
command -v objdump >/dev/null || { echo "SKIP: no objdump"; exit 77; }
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: not x86-64"; exit 77; }
case "$type" in Debug | "") echo "SKIP: unoptimised build ($type)"; exit 77 ;; esac
[ -r "$obj" ] || { echo "FAIL: $obj not found"; exit 1; }
dis=$(objdump -d --no-show-raw-insn "$obj")
grep -q '<sum_f32.avx2>:' <<<"$dis" || { echo "SKIP: no target clones (not gcc?)"; exit 77; }
fn() { awk -v f="<$1>:" '$2 == f { on = 1; next } on && /^$/ { exit } on' <<<"$dis"; }
status=0
need() { # FUNCTION REGEX WHAT
  if fn "$1" | grep -Eq "$2"; then
    echo "ok: $1: $3"
  else
    echo "FAIL: $1 has no $3 (instructions matching /$2/)"
    status=1
  fi
}
need sum_f32.avx512f 'vaddps .*%zmm' "512-bit float adds"
need sum_f32.avx2 'vaddps .*%ymm' "256-bit float adds"
need sum_f32.default '[^v]addps .*%xmm' "128-bit packed float adds"
need sum_div_f32.avx2 'vdivps .*%ymm' "256-bit float divisions (fused average)"
need sum_div_mul_f32.avx2 'vmulps .*%ymm' "256-bit float multiplies (fused postscale)"
need sum_f64.avx2 'vaddpd .*%ymm' "256-bit double adds"
need sum_i32.avx2 'vpaddd .*%ymm' "256-bit int32 adds"
need f32_to_bf16.avx2 '%ymm' "256-bit bfloat16 rounding"
need h2f_f16c 'vcvtph2ps' "F16C half to float"
need f2h_f16c 'vcvtps2ph' "F16C float to half"
if grep -Eq 'vfn?m(add|sub)[0-9]' <<<"$dis"; then
  echo "FAIL: FMA instructions found: a clone would round differently"
  status=1
else
  echo "ok: no FMA contraction"
fi
exit $status
