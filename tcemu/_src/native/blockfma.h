// What blockfma.cc (CPU) and blockfma_gpu.cu (CUDA) share: the engine's exponent sentinels, element
// formats as the custom call's attributes encode them, the special-value path of one output, batch
// strides, and the attribute list of the tcemu_blockfma_chains custom call.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TCEMU_HD __host__ __device__
#define TCEMU_NOINLINE __noinline__
#else
#define TCEMU_HD
#define TCEMU_NOINLINE __attribute__((noinline))
#endif

namespace tcemu {

constexpr int32_t kBig = 1 << 20;              // engine._BIG: the exponent of NaN/inf operands
constexpr int32_t kZeroSentinel = -kBig / 4;   // the exponent of zero operands
constexpr int32_t kSpecialAbove = 1 << 19;     // engine._SPECIAL_ABOVE
constexpr int32_t kZeroBelow = -(1 << 17);     // engine._ZERO_BELOW

// How the kernels read the operands (attribute `kind`): kSafe, exact values whose float32 products
// are exact and far from the range limits (f16, fp8, fp6, fp4); kHybrid (bf16, tf32, scaled
// elements), exact values in blocks whose alignment exponent E keeps every term exact in float32,
// and kSplit, signed significands and a power of two per product, elsewhere.
enum Kind { kSplit = 0, kSafe = 1, kHybrid = 2 };

// An element format: exponent and fraction bits, the shift of its bits (tf32 in float32
// patterns: 13), infinities (IEEE-like), NaN (all ones exponent; without infinities, all ones).
struct Fmt {
  int32_t eb, fb, shift;
  bool has_inf, has_nan;
};

// A format attribute: eb | fb << 8 | shift << 16 | has_inf << 24 | has_nan << 25 (native._format).
inline Fmt unpack_format(int64_t x) {
  return Fmt{(int32_t)(x & 255), (int32_t)((x >> 8) & 255), (int32_t)((x >> 16) & 255), ((x >> 24) & 1) != 0,
             ((x >> 25) & 1) != 0};
}

// Classes of one element for the special-value path (engine._product_flags, without flushing):
// bit 0 zero, bit 1 infinity, bit 2 NaN, bit 3 sign.
TCEMU_HD inline int32_t element_class(uint32_t bits, const Fmt& f) {
  const uint32_t u = bits >> f.shift, frac = u & ((1u << f.fb) - 1u), ef = (u >> f.fb) & ((1u << f.eb) - 1u);
  const uint32_t top = (1u << f.eb) - 1u;
  bool nan = false, inf = false;
  if (f.has_nan && ef == top) {
    nan = f.has_inf ? frac != 0 : frac == (1u << f.fb) - 1u;
    inf = f.has_inf && frac == 0;
  }
  const bool zero = (u & ((1u << (f.eb + f.fb)) - 1u)) == 0;
  return (int32_t)zero | (int32_t)inf << 1 | (int32_t)nan << 2 | (int32_t)((u >> (f.fb + f.eb)) & 1u) << 3;
}

// The special-value path of fused_block.fused_block for one output: NaN if a product is NaN (a NaN factor, or
// inf * 0), the accumulator is NaN, or infinities of both signs meet; else the infinity's sign.
// arow: A's row (bits, along K); bcol: B's column (bits, stride n).
TCEMU_HD TCEMU_NOINLINE inline uint32_t special_value(const uint32_t* arow, const uint32_t* bcol, int64_t n,
                                                      const Fmt& fa, const Fmt& fb, int64_t k0, int64_t L, uint32_t c) {
  bool pos = false, neg = false, nan = false;
  for (int64_t k = k0; k < k0 + L; k++) {
    const int32_t a = element_class(arow[k], fa), b = element_class(bcol[k * n], fb);
    const bool pnan = (a & 4) || (b & 4) || ((a & 2) && (b & 1)) || ((a & 1) && (b & 2));
    const bool pinf = ((a & 2) || (b & 2)) && !pnan;
    nan |= pnan;
    if (pinf) ((a ^ b) & 8 ? neg : pos) = true;
  }
  const bool cinf = (c & 0x7FFFFFFFu) == 0x7F800000u, cnan = (c & 0x7FFFFFFFu) > 0x7F800000u;
  if (cinf) (c >> 31 ? neg : pos) = true;
  if (nan || cnan || (pos && neg)) return 0x7FFFFFFFu;
  return neg ? 0xFF800000u : 0x7F800000u;
}

// The usual models, which both kernels run without masks (their Simple instantiations): a zero
// accumulator's exponent -126, no flushed inputs, no minimum exponent, a binary32 accumulator.
inline bool usual_model(int64_t zero_exp, bool flush_c, bool has_min_exp, int64_t p) {
  return zero_exp == -126 && !flush_c && !has_min_exp && p == 23;
}

// Batch entries per entry of a buffer of `count` elements, `per` elements per entry: -1 when its
// entries do not divide the batch. An operand's batch axes are leading axes of the output's
// (jax.vmap prepends its axes to every operand): entry bt reads the operand's entry bt / div.
inline int64_t batch_stride(size_t count, int64_t per, int64_t batch) {
  const int64_t n = (int64_t)count / per;
  return (int64_t)count % per || n < 1 || batch % n ? -1 : batch / n;
}

}  // namespace tcemu

// The operands of tcemu_blockfma_chains (lens, A, B, A's and B's exponents, C) and its result, after
// what the kernel's binding takes first (the GPU kernel: its stream; then a second result).
#define TCEMU_CHAINS_ARGS(binding)                                                                      \
  binding.Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()           \
      .Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::S32>>().Arg<ffi::Buffer<ffi::F32>>()              \
      .Ret<ffi::Buffer<ffi::F32>>()

// The attributes of tcemu_blockfma_chains after its operands and results (both kernels bind them).
#define TCEMU_CHAINS_ATTRS(binding)                                                                         \
  binding.Attr<int64_t>("chain_k").Attr<int64_t>("block").Attr<int64_t>("F").Attr<int64_t>("group")       \
      .Attr<int64_t>("kind").Attr<int64_t>("ab_shift").Attr<int64_t>("zero_policy").Attr<int64_t>("zero_exp") \
      .Attr<int64_t>("has_min_exp").Attr<int64_t>("min_exp").Attr<int64_t>("mode").Attr<int64_t>("p")      \
      .Attr<int64_t>("subnormals").Attr<int64_t>("overflow_ieee").Attr<int64_t>("flush_c")                   \
      .Attr<int64_t>("a_format").Attr<int64_t>("b_format").Attr<int64_t>("has_c").Attr<int64_t>("has_a_exp") \
      .Attr<int64_t>("has_b_exp").Attr<int64_t>("scale_block").Attr<int64_t>("threads")           \
      .Attr<int64_t>("transposed")

// The attributes of tcemu_grouped_chains after its operands and result (both kernels bind them).
#define TCEMU_GROUPED_ATTRS(binding)                                                                       \
  binding.Attr<int64_t>("chain_k").Attr<int64_t>("block").Attr<int64_t>("group").Attr<int64_t>("F")     \
      .Attr<int64_t>("zero_exp").Attr<int64_t>("mode").Attr<int64_t>("subnormals")                         \
      .Attr<int64_t>("overflow_ieee").Attr<int64_t>("flush_c").Attr<int64_t>("threads")
