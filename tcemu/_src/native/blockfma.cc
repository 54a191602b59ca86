// Chains of fused block FMAs on the CPU: the hot loop of tcemu's emulated GEMMs as an XLA FFI
// custom call. It computes, bit for bit, what tcemu/_src/numerics/engine.py computes for the
// models listed in tcemu/_src/native/__init__.py (supports): per output, per block of L products,
// the alignment exponent E (largest product or accumulator exponent), every product truncated
// toward zero F bits below E, an exact integer sum with the aligned accumulator (int32 groups as
// fused_block._group_sums, added as two words when one int32 word cannot hold the block), and one
// rounding (rounding.round_pack32); outputs whose block has a NaN/inf operand or accumulator take
// the engine's special-value path (NaN, or an infinity).
//
// Operands: the bit patterns of A (M, K) and B (K, N) with their formats (exponent and fraction
// bits, shift, NaN/inf encoding), optional int32 exponents added per element or per block of K
// (the ue8m0 scales of kind::mxf8f6f4). The kernel decodes them as fused_block.prepare_operand does
// (exponent sentinels: zero -2**18, NaN/inf +2**20), A once per batch entry and B by strips of W
// columns (W: one native vector register of 32-bit lanes). A term is trunc(va * vb * 2**(F - E))
// from the exact element values where their float32 products are exact (Kind, below), else
// trunc(sa * sb * 2**(ea + eb - fab - fbb + F - E)) from the signed integer significands (at most
// 12 bits), the scale clamped at 2**-126, where every term truncates to 0 anyway. The block's sum
// is rounded by a float32 conversion where that is exact (the fast finish), else in integers.
// Output (K / chain_k, M, N) uint32: per chain of chain_k elements of K, the accumulator bits after
// its first lens[chain] elements (whole blocks; the rest is padding that does not run), from the
// addend C (M, N) float32 bits, or from +0 (has_c 0; absent operands are one dummy element).
// Leading batch axes: every operand may have them, or not have them (then it is shared by the
// whole batch); the output has them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "blockfma.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace tcemu;

// output columns per vector: one native vector register of 32-bit lanes (wider generic vectors are
// split, and partly scalarised, by the compiler)
#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX2__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif
constexpr int R = 4;   // output rows sharing the loads of B
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint32_t vu __attribute__((vector_size(4 * W)));
typedef float vf __attribute__((vector_size(4 * W)));
typedef int16_t vh __attribute__((vector_size(4 * W)));  // 2 W int16 lanes: the exponents of two rows

constexpr int64_t kThreadsFrom = int64_t(1) << 21;  // products of a call worth several threads


struct Params {
  int64_t M, N, K, chain_k, block, F;
  int64_t group;            // products per int32 partial sum (fused_block._group_sums)
  int kind;                 // Kind: how strip() reads the operands
  int64_t sblock;           // exponents added per block of sblock elements along K (0: per element)
  int32_t ab_shift;         // fab + fbb (split mode)
  bool zero_policy;         // zero products count with zero_exp
  int32_t zero_exp;         // exponent of a zero accumulator (zero_exponent, or -2**20)
  bool has_min_exp;
  int32_t min_exp;
  int mode;                 // 0 rz, 1 rne, 2 rna, 3 ru, 4 rd
  int p;                    // fraction bits of the accumulator format (shift = 23 - p)
  bool subnormals, overflow_ieee, flush_c;  // flush_c: subnormal inputs (operands and C) read as 0
  Fmt fa, fb;
  bool transposed;          // operands, C and D stored transposed (worker)
};

inline vi splat(int32_t x) { return (vi){} + x; }
inline vu splatu(uint32_t x) { return (vu){} + x; }
inline vi vmax(vi a, vi b) { return a > b ? a : b; }
inline vi vmin(vi a, vi b) { return a < b ? a : b; }

// x >> n and x << n for 0 <= n, giving 0 from n >= 32 (as rounding.shr/shl)
inline vu shr(vu x, vi n) {
  vi c = vmin(vmax(n, splat(0)), splat(31));
  return n >= 32 ? splatu(0) : x >> (vu)c;
}
inline vu shl(vu x, vi n) {
  vi c = vmin(vmax(n, splat(0)), splat(31));
  return n >= 32 ? splatu(0) : x << (vu)c;
}

inline bool any(vi x) {  // some lane nonzero
#if defined(__AVX512F__)
  __m512i v;
  std::memcpy(&v, &x, sizeof v);
  return _mm512_test_epi32_mask(v, v) != 0;
#elif defined(__AVX2__)
  __m256i v;
  std::memcpy(&v, &x, sizeof v);
  return !_mm256_testz_si256(v, v);
#else
  int32_t r = 0;
  for (int i = 0; i < W; i++) r |= x[i];
  return r != 0;
#endif
}

inline vi clz(vu x) {  // 32 for 0
#if defined(__AVX512CD__) && defined(__AVX512F__)
  static_assert(sizeof(vu) == sizeof(__m512i), "one AVX-512 vector");
  __m512i v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm512_lzcnt_epi32(v);
  vi out;
  std::memcpy(&out, &v, sizeof out);
  return out;
#else  // the exponent of the top 16 bits (or, where they are 0, of the low 16) as a float32
  const vu hi = x >> 16u;
  const vi upper = (vi)(hi != 0);
  const vf f = __builtin_convertvector((vi)(upper ? hi : (x & 0xFFFFu)), vf);
  vi e;
  std::memcpy(&e, &f, sizeof e);
  const vi r = (upper ? splat(15 + 127) : splat(31 + 127)) - (e >> 23);
  return (x == 0) ? splat(32) : r;
#endif
}

// rounding.round_pack32 + _finish for the accumulator format (8 exponent bits, bias 127, emin
// -126, emax 127, infinities), then exact_zero "+0".
template <int Mode>
__attribute__((always_inline)) inline vu round_pack(vi neg, vu m, vi q, const Params& P) {
  const int p = P.p;
  vi lz = clz(m);
  {  // the usual case, every lane nonzero with a normal result that cannot overflow: constant shifts
    vi x = q + 31 - lz;
    if (!any(~((x >= -126) & (x <= 126) & (vi)(m != 0)))) {
      const uint32_t r = 31 - p;
      vu top = m << (vu)lz;
      vu n = top >> r;
      vi rbit = (vi)((top >> (r - 1)) & 1u);
      vi sticky = (top & ((1u << (r - 1)) - 1u)) != 0;
      vi inc;
      switch (Mode) {
        case 0: inc = splat(0); break;
        case 1: inc = rbit & (sticky | (vi)(n & 1u)); break;
        case 2: inc = rbit; break;
        case 3: inc = (rbit | (sticky & 1)) & ~neg; break;
        default: inc = (rbit | (sticky & 1)) & neg; break;
      }
      if (Mode != 0) {
        n = n + (vu)inc;
        vi carry = (vi)(n >> (uint32_t)(p + 1));
        n = n >> (vu)carry;
        x = x + carry;
      }
      vu sbit = neg ? splatu(1u << (8 + p)) : splatu(0);
      return (sbit | ((vu)(x + 127) << (uint32_t)p) | (n & ((1u << p) - 1u))) << (uint32_t)(23 - p);
    }
  }
  vu top = m << (vu)vmin(lz, splat(31));
  vi x = vmax(q + 31 - lz, splat(-126));
  vi r = x - p - q + lz;
  vu rbit = shr(top, r - 1) & 1u;
  vi sticky = (top & (shl(splatu(1), r - 1) - 1u)) != 0;
  vu n = shr(top, r);
  vi inc;
  switch (Mode) {
    case 0: inc = splat(0); break;
    case 1: inc = (rbit != 0) & (sticky | (vi)((n & 1u) != 0)); break;
    case 2: inc = (vi)(rbit != 0); break;
    case 3: inc = ((vi)(rbit != 0) | sticky) & ~neg; break;
    default: inc = ((vi)(rbit != 0) | sticky) & neg; break;
  }
  n = n + ((vu)inc & 1u);
  vi carry = (n >> (uint32_t)(p + 1)) != 0;
  n = carry ? n >> 1u : n;
  x = x + (carry & 1);
  vi normal = (n >> (uint32_t)p) != 0;
  vu biased = (vu)(normal ? x + 127 : splat(0));
  vu frac = n & (uint32_t)((1u << p) - 1u);
  if (!P.subnormals) frac = normal ? frac : splatu(0);
  vu sbit = neg ? splatu(1u << (8 + p)) : splatu(0);
  vu body = sbit | (biased << (uint32_t)p) | frac;
  vi too_big = (x > 127) & (vi)(m != 0);
  vu inf = sbit | (255u << p);
  vu big = inf;
  if (P.overflow_ieee) {
    vu maxf = sbit | ((254u << p) | ((1u << p) - 1u));
    vi to_inf;
    switch (Mode) {
      case 0: to_inf = splat(0); break;
      case 3: to_inf = ~neg; break;
      case 4: to_inf = neg; break;
      default: to_inf = splat(-1); break;
    }
    big = to_inf ? inf : maxf;
  }
  body = too_big ? big : body;
  vu bits = body << (uint32_t)(23 - p);
  return bits == 0x80000000u ? splatu(0) : bits;
}

// One strip of W columns, rows [m0, m0 + R), every chain. bs/es: the strip of B packed (K, W).
// A signed sum held as two int32 words, hi * 2**split + lo (any lo): its sign, and its magnitude
// brought to one uint32 word m with the bits shifted out (sh of them) ORed into bit 0 as a sticky
// bit, so that round_pack(neg, m, q + sh) rounds it exactly (the kept bits lie above bit 0).
template <int Split>
__attribute__((always_inline)) inline void norm2(vi hi, vi lo, vi& neg, vu& m, vi& sh) {
  constexpr int32_t mask = (1 << Split) - 1;
  hi = hi + (lo >> Split);
  lo = lo & mask;
  neg = hi < 0;
  vi nz = lo != 0;
  vu mlo = (vu)((neg & nz) ? (1 << Split) - lo : lo);
  vu mhi = (vu)(neg ? -hi + nz : hi);  // nz is -1 where lo != 0
  vi bits = 32 - clz(mhi);             // magnitude < 2**(Split + bits)
  sh = vmax(bits - (32 - Split), splat(0));
  vu s = (vu)sh;
  vu lost = mlo & ((splatu(1) << s) - 1u);
  m = (mhi << (vu)(Split - sh)) | (mlo >> s) | (vu)((vi)(lost != 0) & 1);
}

// fused_block.prepare_operand of W elements' bits (fm.decode, flushing subnormals if asked) with `add` added to
// the exponents (ue8m0 scales): the exact value sig * 2**(exp + add - fb) (scaled in two exact
// steps; NaN/inf give a finite placeholder), the signed significand, and the exponent with the
// sentinels. Bits 0 (also the padding beyond M and N) decode to value 0 with the zero sentinel.
// Returns the lanes whose value a float32 cannot hold exactly (scales beyond its range).
inline vi decode(vu bits, const Fmt& f, bool flush, vi add, vf& v, vf& sg, vi& e) {
  const vu u = bits >> (uint32_t)f.shift;
  vi frac = (vi)(u & ((1u << f.fb) - 1u));
  const vi ef = (vi)((u >> (uint32_t)f.fb) & ((1u << f.eb) - 1u));
  const vi neg = (vi)((u >> (uint32_t)(f.fb + f.eb)) & 1u) != 0;
  const int32_t top = (1 << f.eb) - 1, bias = (1 << (f.eb - 1)) - 1;
  vi special = splat(0);
  if (f.has_nan) special = f.has_inf ? (ef == top) : ((ef == top) & (frac == (1 << f.fb) - 1));
  const vi normal = ef != 0;
  if (flush) frac = normal ? frac : splat(0);
  const vi sig = normal ? (frac | (1 << f.fb)) : frac;
  const vi exp0 = normal ? ef - bias : splat(1 - bias), exp = exp0 + add;
  sg = __builtin_convertvector(neg ? -sig : sig, vf);
  const vi x = vmin(vmax(exp - f.fb, splat(-149)), splat(127)), h = x >> 1;
  const vu p1 = (vu)(h + 127) << 23u, p2 = (vu)(x - h + 127) << 23u;
  vf s1, s2;
  std::memcpy(&s1, &p1, sizeof p1);
  std::memcpy(&s2, &p2, sizeof p2);
  const vi zero = sig == 0;
  v = zero ? (vf){} : (sg * s1) * s2;
  e = (zero ? splat(kZeroSentinel) : special ? splat(kBig) : exp0) + add;
  return ~(zero | special) & ((exp - f.fb < -149) | (exp > 127));
}

// One batch entry's operands as strip() reads them.
struct Entry {
  const float* va;       // A decoded, (M rounded up to R, K); rows beyond M are 0
  const float* va2;      // hybrid: A's signed significands (va holds the values)
  const int32_t* ea;
  const int32_t* ea2;    // A's exponents of row pairs (2r, 2r + 1) as int16 pairs (pack16), (M / 2, K)
  const uint32_t* a;     // A's bits (M, K), for the special-value path
  const float* bs;       // B's strip decoded, packed (K, W)
  const float* bs2;      // hybrid: B's signed significands
  const int32_t* es;
  const int32_t* es2;    // B's strip exponents as int16 pairs, each twice (K, W)
  const uint32_t* b;     // B's bits (K, N)
  const uint32_t* c;     // C (M, N) float32 bits, or null for +0
  const int32_t* lens;   // valid elements per chain
  uint32_t* out;         // (K / chain_k, M, N)
};

// Rare: lanes with a NaN/inf operand or accumulator take special_value (out of the hot loop);
// lanes beyond N (padding) are left as they are.
__attribute__((noinline)) vu specials(const Params& P, const Entry& X, vu bits, vi special, vu c, int64_t m,
                                      int64_t n0, int64_t k0) {
  for (int j = 0; j < W && n0 + j < P.N; j++)
    if (special[j])
      bits[j] = special_value(X.a + m * P.K, X.b + n0 + j, P.N, P.fa, P.fb, k0, P.block, c[j]);
  return bits;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
inline __m256i lanes_below(int64_t n) {  // the AVX2 lane mask of lanes [0, n)
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

// The first n (up to W) lanes of v to p.
template <typename T, typename V>
inline void store_part(T* p, V v, int64_t n) {
  static_assert(sizeof(T) == 4 && sizeof(V) == sizeof(vu), "W 32-bit lanes");
  if (n >= W) {
    std::memcpy(p, &v, sizeof v);
    return;
  }
#if defined(__AVX512F__)
  __m512i x;
  std::memcpy(&x, &v, sizeof x);
  _mm512_mask_storeu_epi32(p, (__mmask16)((1u << n) - 1u), x);
#elif defined(__AVX2__)
  __m256i x;
  std::memcpy(&x, &v, sizeof x);
  _mm256_maskstore_epi32(reinterpret_cast<int*>(p), lanes_below(n), x);
#else
  for (int64_t j = 0; j < n; j++) p[j] = v[j];
#endif
}

// Up to W uint32 values from p (n of them; zeros after).
inline vu load_part(const void* p, int64_t n) {
  vu v;
  if (n >= W) {
    std::memcpy(&v, p, sizeof v);
    return v;
  }
#if defined(__AVX512F__)
  __m512i x = _mm512_maskz_loadu_epi32((__mmask16)((1u << (n > 0 ? n : 0)) - 1u), p);
  std::memcpy(&v, &x, sizeof v);
#elif defined(__AVX2__)
  __m256i x = _mm256_maskload_epi32(static_cast<const int*>(p), lanes_below(n));
  std::memcpy(&v, &x, sizeof v);
#else
  v = splatu(0);
  for (int64_t j = 0; j < n; j++) v[j] = static_cast<const uint32_t*>(p)[j];
#endif
  return v;
}

// The largest exponent sum of a block is found on int16 lanes, two rows per vector (a row pair's
// A exponents packed into one int32): pack16 clamps an exponent to int16 sentinels (NaN/inf
// 16000, zero -4000; real exponents, scales included, lie within +-300). A sum above kSpecialE
// has a NaN/inf factor (also times zero: 12000); one below -2048 is a zero product, which the
// alignment never takes over a real one (the accumulator's exponent is at least -126, or
// zero_exp). strip() keeps these sums as its E; finish() reads them so.
inline vi clamp16(vi e) { return e > 4096 ? splat(16000) : e < -4096 ? splat(-4000) : e; }
inline vi pack16(vi lo, vi hi) { return (vi)(((vu)clamp16(lo) & 0xFFFFu) | ((vu)clamp16(hi) << 16u)); }
constexpr int32_t kSpecialE = 8192;

// Kind (blockfma.h): kHybrid reads exact values where F - 125 <= E <= 126 (a term that counts is a
// normal float32, one that does not stays below 1), significands (kSplit) in the other blocks and
// for entries whose values a float32 cannot hold.

// The fast finish rounds a block's integer sum by converting it to float32 in the rounding mode
// of the model (MXCSR), then sets the exponent with an integer add. RoundingMode switches the
// thread's MXCSR for the kernel's lifetime on the stack (denormals kept: no FTZ/DAZ) and restores
// it; every other float operation of the kernel is exact or truncated explicitly.
#if defined(__SSE__)
struct RoundingMode {
  unsigned saved;
  explicit RoundingMode(int mode) : saved(_mm_getcsr()) {
    const unsigned rc = mode == 0 ? 0x6000u : mode == 3 ? 0x4000u : mode == 4 ? 0x2000u : 0u;
    _mm_setcsr((saved & ~(0x6000u | 0x8000u | 0x0040u)) | rc);
  }
  ~RoundingMode() { _mm_setcsr(saved); }
};
constexpr bool kFastFinish = true;
#else
struct RoundingMode {
  explicit RoundingMode(int) {}
};
constexpr bool kFastFinish = false;
#endif

// The product loops: S += trunc(a * b * 2**(F - E)) over elements [k0, k0 + L), from exact values
// (scale: 2**(F - E)) or from significands (base: the per-product power of two less the products'
// exponents). Wide: the int32 group sums are added as two 16-bit-split words.
template <bool Wide, int Lc>
__attribute__((always_inline)) inline void terms_values(const Params& P, const float* pa, const float* bs, int64_t K,
                                                        int64_t k0, const vf* scale, vi* S, vi* Shi, vi* Slo) {
  const int64_t L = Lc ? Lc : P.block, step = Wide ? P.group : L;
  for (int64_t g0 = k0; g0 < k0 + L; g0 += step) {
    const int64_t g1 = g0 + step < k0 + L ? g0 + step : k0 + L;
    for (int64_t k = g0; k < g1; k++) {
      vf b;
      std::memcpy(&b, bs + k * W, sizeof b);
      for (int r = 0; r < R; r++) S[r] += __builtin_convertvector((b * pa[r * K + k]) * scale[r], vi);
    }
    if (Wide)
      for (int r = 0; r < R; r++) Shi[r] += S[r] >> 16, Slo[r] += S[r] & 0xFFFF, S[r] = splat(0);
  }
}

template <bool Wide, int Lc>
__attribute__((always_inline)) inline void terms_split(const Params& P, const float* pa, const int32_t* pe,
                                                       const float* bs, const int32_t* es, int64_t K, int64_t k0,
                                                       const vi* E, vi* S, vi* Shi, vi* Slo) {
  const int64_t L = Lc ? Lc : P.block;
  const int32_t split_bias = (int32_t)(P.F + 127) - P.ab_shift;
  vi base[R];
  for (int r = 0; r < R; r++) base[r] = split_bias - E[r];
  const int64_t step = Wide ? P.group : L;
  for (int64_t g0 = k0; g0 < k0 + L; g0 += step) {
    const int64_t g1 = g0 + step < k0 + L ? g0 + step : k0 + L;
    for (int64_t k = g0; k < g1; k++) {
      vf b;
      vi e;
      std::memcpy(&b, bs + k * W, sizeof b);
      std::memcpy(&e, es + k * W, sizeof e);
      for (int r = 0; r < R; r++) {
        vi x = vmax(e + (pe[r * K + k] + base[r]), splat(1));
        vu u = (vu)x << 23u;
        vf s;
        std::memcpy(&s, &u, sizeof u);
        S[r] += __builtin_convertvector((b * pa[r * K + k]) * s, vi);
      }
    }
    if (Wide)
      for (int r = 0; r < R; r++) Shi[r] += S[r] >> 16, Slo[r] += S[r] & 0xFFFF, S[r] = splat(0);
  }
}

// The mask under which a float32 accumulator's bits are 0 where it counts as zero (subnormals too
// where subnormal inputs are flushed), its exponent for the block's alignment (zero: zero_exp), and
// its value (flushed to 0 if subnormal inputs are).
inline vu zero_mask(bool flush) { return splatu(flush ? 0x7F800000u : 0x7FFFFFFFu); }
inline vi acc_exponent(vu acc, vu zmask, int32_t zero_exp) {
  return (acc & zmask) != 0 ? vmax((vi)((acc >> 23u) & 255u), splat(1)) - 127 : splat(zero_exp);
}
inline vf acc_value(vu acc, bool flush) {
  vf c;
  std::memcpy(&c, &acc, sizeof c);
  return flush && (vi)((acc >> 23u) & 255u) == 0 ? (vf){} : c;
}

// A float32 accumulator's exponent field, significand (flushed if asked) and exponent.
inline void decode_acc(vu acc, bool flush, vi& ce, vi& csig, vi& cexp) {
  ce = (vi)((acc >> 23u) & 255u);
  const vi frac = (vi)(acc & 0x7FFFFFu);
  csig = (ce != 0) ? (frac | 0x800000) : frac;
  if (flush) csig = (ce != 0) ? csig : splat(0);
  cexp = (ce != 0) ? ce - 127 : splat(-126);
}

// The general finish of one output row's block (rounding.round_pack32 on the exact sum with the
// aligned accumulator), then the special-value path where a lane has a NaN/inf operand or
// accumulator.
template <int Mode, bool Wide>
__attribute__((noinline)) vu finish(const Params& P, const Entry& X, vi S, vi Shi, vi Slo, vi E, vu acc, int64_t m,
                                    int64_t n0, int64_t k0) {
  const int F = (int)P.F;
  vi ce, csig, cexp;
  decode_acc(acc, P.flush_c, ce, csig, cexp);
  vi cs = F >= 23 ? csig << (F - 23) : csig;
  vi sh = vmin(vmax(E - cexp + (F >= 23 ? 0 : 23 - F), splat(0)), splat(31));
  vi tc = cs >> sh;
  tc = ((vi)acc < 0) ? -tc : tc;
  vu bits;
  if (Wide) {  // the exact sum in two words, brought to one with a sticky bit
    vi neg, sh2;
    vu m32;
    norm2<16>(Shi + (tc >> 16), Slo + (tc & 0xFFFF), neg, m32, sh2);
    bits = round_pack<Mode>(neg, m32, E - F + sh2, P);
  } else {  // |sum| < 2**32: one int32 sum with wrap-around, the sign from the overflow
    vi s = (vi)((vu)S + (vu)tc);
    vi neg = (((S ^ s) & (tc ^ s)) < 0) ? (S < 0) : (s < 0);
    vu u = (vu)s;
    vu mag = neg ? 0u - u : u;
    bits = round_pack<Mode>(neg, mag, E - F, P);
  }
  vi special = (E > kSpecialE) | (ce == 255);
  return any(special) && m < P.M ? specials(P, X, bits, special, acc, m, n0, k0) : bits;
}

typedef vu (*Finish)(const Params&, const Entry&, vi, vi, vi, vi, vu, int64_t, int64_t, int64_t);

template <bool Wide>
Finish finish_for(int mode) {
  return mode == 0 ? finish<0, Wide> : mode == 1 ? finish<1, Wide> : mode == 2 ? finish<2, Wide>
         : mode == 3 ? finish<3, Wide> : finish<4, Wide>;
}

// The fast finish's pieces for one row: the accumulator's term trunc(c * scale) (Masked: 0 where
// it counts as zero, zmask), and the block's exact sum with it as one int32 word, with the lanes
// where one word does not hold it (|hi| >= 2**14 of two words; a wrapped sum) ORed into bad.
template <bool Masked>
inline vi acc_term(vu acc, vf scale, vu zmask) {
  vf c;
  std::memcpy(&c, &acc, sizeof c);
  const vi t = __builtin_convertvector(c * scale, vi);
  return Masked ? ((acc & zmask) != 0 ? t : splat(0)) : t;
}
// The fast finish's result: the one-word sum s converted to float32 in the model's direction
// (MXCSR), the fraction bits a narrower accumulator lacks cleared (Keep), times 2**(E - F) read off
// the scale 2**(F - E): exact where the fast finish holds (a normal number; +0 for s = 0).
template <bool Keep>
inline vu fast_result(vi s, vf scale, int32_t keep) {
  vf f = __builtin_convertvector(s, vf);
  if (Keep) {
    vi fb;
    std::memcpy(&fb, &f, sizeof fb);
    fb &= keep;
    std::memcpy(&f, &fb, sizeof f);
  }
  vu iu;
  std::memcpy(&iu, &scale, sizeof iu);
  iu = splatu(254u << 23) - iu;
  vf inv;
  std::memcpy(&inv, &iu, sizeof inv);
  const vf r = f * inv;
  vu bits;
  std::memcpy(&bits, &r, sizeof bits);
  return bits;
}
template <bool Wide>
__attribute__((always_inline)) inline vi one_word(vi S, vi Shi, vi Slo, vi tc, bool wraps, vi& bad) {
  if (Wide) {  // hi * 2**16 + lo + tc as one word where |hi| < 2**14: below 2**31
    bad |= (Shi >= (1 << 14)) | (Shi <= -(1 << 14));
    return (vi)(((vu)Shi << 16u) + (vu)(Slo + tc));
  }
  const vi s = (vi)((vu)S + (vu)tc);
  if (wraps) bad |= ((S ^ s) & (tc ^ s)) < 0;
  return s;
}

// One block of the R rows, the careful way (out of the hot loop): scales clamped to float32's
// range, exact values or significands as the block allows (kHybrid), the fast finish for the rows
// whose lanes it holds for, finish() for the others. E: the block's alignment exponents; acc: the
// accumulators, updated. The fast finish (sums that fit one int32 word, a binary32 accumulator
// with an IEEE rounding direction, or a narrower one with RZ) converts the block's sum to float32
// in the model's direction (clearing the fraction bits a narrower accumulator lacks) and scales it
// by 2**(E - F) (fast_result). It holds for a lane when F - 126 <= E <= F + 96 (the result is then a normal
// number, the accumulator's term trunc(c * 2**(F - E)) is exact, and E is no special-value
// sentinel) and the sum did not wrap.
template <int How, bool Wide, int Lc>
__attribute__((noinline)) void careful_block(const Params& P, const Entry& X, int64_t m0, int64_t n0, int64_t k0,
                                             const vi* E, vu* acc, bool fast, bool wraps, Finish slow) {
  const int64_t K = P.K;
  const int F = (int)P.F;
  const int32_t keep = ~((1 << (23 - P.p)) - 1);
  const vu zmask = zero_mask(P.flush_c);
  vi S[R], Shi[R], Slo[R];
  vf scale[R];
  for (int r = 0; r < R; r++) {
    S[r] = splat(0);
    if (Wide) Shi[r] = Slo[r] = splat(0);
    vu u = (vu)vmin(vmax(F - E[r] + 127, splat(1)), splat(254)) << 23u;
    std::memcpy(&scale[r], &u, sizeof u);
  }
  const float* pa = X.va + m0 * K;
  const int32_t* pe = X.ea + m0 * K;
  vi range = splat(0);
  for (int r = 0; r < R; r++) range |= (E[r] < F - 125) | (E[r] > 126);
  if (How == kSafe || (How == kHybrid && !any(range)))
    terms_values<Wide, Lc>(P, pa, X.bs, K, k0, scale, S, Shi, Slo);
  else if (How == kSplit)
    terms_split<Wide, Lc>(P, pa, pe, X.bs, X.es, K, k0, E, S, Shi, Slo);
  else
    terms_split<Wide, Lc>(P, X.va2 + m0 * K, pe, X.bs2, X.es, K, k0, E, S, Shi, Slo);
  for (int r = 0; r < R; r++) {
    vi bad = (E[r] < F - 126) | (E[r] > F + 96);
    vu bits = acc[r];
    if (fast) {
      const vi s = one_word<Wide>(S[r], Shi[r], Slo[r], acc_term<true>(acc[r], scale[r], zmask), wraps, bad);
      bits = fast_result<true>(s, scale[r], keep);  // the clamped scale is exact where it holds
    }
    acc[r] = fast && !any(bad) ? bits
                               : slow(P, X, S[r], Wide ? Shi[r] : S[r], Wide ? Slo[r] : S[r], E[r], acc[r], m0 + r, n0,
                                      k0);
  }
}

// Output rows [m0, m0 + R) of one strip of W columns, every chain, blocks of Lc (0: P.block). Per
// block: the alignment exponents E (the accumulators' and the largest product exponent, found on
// int16 lanes, two rows per vector: pack16), then, where the fast finish holds for every lane of
// the R rows (and kHybrid's exact values may be read), the hot path: unclamped scales, the terms,
// the fast finish as careful_block's, its result scaled by a float32 product with 2**(E - F) (exact:
// a normal number). Any other block runs careful_block. The rows are unrolled, so that a block's
// state stays in registers. Simple (strip_for): a zero accumulator's exponent -126 (so every
// accumulator's is max(e, -126)), no flushed inputs, no minimum exponent, a binary32 accumulator,
// a one-word sum that cannot wrap.
template <int How, bool Wide, int Lc, bool Simple>
void strip(const Params& P, const Entry& X, int64_t m0, int64_t n0, bool fast, bool wraps, Finish slow) {
  const int64_t K = P.K, N = P.N, M = P.M, L = Lc ? Lc : P.block, nw = N - n0 < W ? N - n0 : W;
  const float* pa = X.va + m0 * K;  // the R rows
  const int32_t* pe = X.ea + m0 * K;
  const int32_t* pe2 = X.ea2 + m0 / 2 * K;
  const int32_t* lens = X.lens;
  const int F = (int)P.F;
  const int32_t keep = ~((1 << (23 - P.p)) - 1);  // the fast finish: RZ to an accumulator of p fraction bits
  const vu zmask = zero_mask(P.flush_c);
  const vi min_exp = splat(P.has_min_exp ? P.min_exp : -(1 << 30));
  // the hot path's exponents: the fast finish's, and kHybrid's exact values (E >= F - 125)
  const int32_t lo_ok = F - 126 + (How == kHybrid), hi_ok = F + 96;
  static_assert(R % 2 == 0, "row pairs");
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    vu acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      acc[r] = splatu(0);
      if (X.c && m0 + r < M) acc[r] = load_part(X.c + (m0 + r) * N + n0, nw);
    }
    const int64_t end = c0 + lens[c0 / P.chain_k];
    for (int64_t k0 = c0; k0 < end; k0 += L) {
      vi E[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; r++)
        E[r] = Simple ? vmax((vi)((acc[r] >> 23u) & 255u) - 127, splat(-126))
                      : acc_exponent(acc[r], zmask, P.zero_exp);
      {  // the largest product exponent: int16 sums of pack16 sentinels (NaN/inf >= 12000, zero <= -3700)
        vh top[R / 2];
#pragma GCC unroll 2
        for (int q = 0; q < R / 2; q++) top[q] = (vh){} + (int16_t)-32768;
#pragma GCC unroll 8
        for (int64_t k = k0; k < k0 + L; k++) {
          vh e;
          std::memcpy(&e, X.es2 + k * W, sizeof e);
#pragma GCC unroll 2
          for (int q = 0; q < R / 2; q++) {
            const vi pair = splat(pe2[q * K + k]);
            vh a;
            std::memcpy(&a, &pair, sizeof a);
            const vh t = e + a;
            top[q] = top[q] > t ? top[q] : t;
          }
        }
#pragma GCC unroll 2
        for (int q = 0; q < R / 2; q++) {
          vi x;
          std::memcpy(&x, &top[q], sizeof x);
          E[2 * q] = vmax(E[2 * q], (x << 16) >> 16);
          E[2 * q + 1] = vmax(E[2 * q + 1], x >> 16);
        }
      }
      if (P.zero_policy) {  // zero products count with zero_exp: only a block below it changes
        for (int r = 0; r < R; r++) {
          if (!any(E[r] < P.zero_exp)) continue;
          vi zero = splat(0);
          for (int64_t k = k0; k < k0 + L; k++) {
            vi e;
            std::memcpy(&e, X.es + k * W, sizeof e);
            zero |= (e + pe[r * K + k]) < kZeroBelow;
          }
          E[r] = zero ? vmax(E[r], splat(P.zero_exp)) : E[r];
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; r++)
        if (!Simple) E[r] = vmax(E[r], min_exp);
      vi lo = E[0], hi = E[0];
#pragma GCC unroll 4
      for (int r = 1; r < R; r++) lo = vmin(lo, E[r]), hi = vmax(hi, E[r]);
      bool hot = fast && !any((lo < lo_ok) | (hi > hi_ok));
      if (__builtin_expect(hot, 1)) {
        vi S[R], Shi[R], Slo[R];
        vf scale[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          S[r] = splat(0);
          if (Wide) Shi[r] = Slo[r] = splat(0);
          const vu u = (vu)(F + 127 - E[r]) << 23u;  // in range: 31 <= F + 127 - E <= 253
          std::memcpy(&scale[r], &u, sizeof u);
        }
        if (How == kSplit)
          terms_split<Wide, Lc>(P, pa, pe, X.bs, X.es, K, k0, E, S, Shi, Slo);
        else
          terms_values<Wide, Lc>(P, pa, X.bs, K, k0, scale, S, Shi, Slo);
        vu bits[R];
        vi worst = splat(0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          // Simple: every accumulator's term counts (a zero one is 0 anyway), no sum wraps
          const vi s = one_word<Wide>(S[r], Shi[r], Slo[r], acc_term<!Simple>(acc[r], scale[r], zmask),
                                      !Simple && wraps, worst);
          bits[r] = fast_result<!Simple>(s, scale[r], keep);
        }
        if (__builtin_expect(!any(worst), 1)) {
#pragma GCC unroll 4
          for (int r = 0; r < R; r++) acc[r] = bits[r];
          continue;
        }
      }
      vu tmp[R];  // copies: acc and E, never address-taken, stay in registers on the hot path
      vi et[R];
      for (int r = 0; r < R; r++) tmp[r] = acc[r], et[r] = E[r];
      careful_block<How, Wide, Lc>(P, X, m0, n0, k0, et, tmp, fast, wraps, slow);
      for (int r = 0; r < R; r++) acc[r] = tmp[r];
    }
    const int64_t chain = c0 / P.chain_k;
    for (int r = 0; r < R; r++) {
      if (m0 + r < M) store_part(X.out + (chain * M + m0 + r) * N + n0, acc[r], nw);
    }
  }
}

typedef void (*Strip)(const Params&, const Entry&, int64_t, int64_t, bool, bool, Finish);

template <int How, bool Wide, bool Simple>
Strip strip_for(int64_t block) {
  return block == 4 ? strip<How, Wide, 4, Simple> : block == 8 ? strip<How, Wide, 8, Simple>
         : block == 16 ? strip<How, Wide, 16, Simple> : block == 32 ? strip<How, Wide, 32, Simple>
         : strip<How, Wide, 0, Simple>;
}

// simple: the usual models (usual_model) with one word that cannot wrap (never Wide), whose
// accumulator handling needs no masks (strip's Simple)
template <int How>
Strip strip_for(int64_t block, bool wide, bool simple) {
  return wide ? strip_for<How, true, false>(block) : simple ? strip_for<How, false, true>(block)
              : strip_for<How, false, false>(block);
}

// Batch entries per entry of each operand. An operand's batch axes are leading axes of the
// output's (jax.vmap prepends its axes to every operand): entry bt reads the operand's entry
// bt / div (div = the whole batch for an operand without batch axes).
struct Strides {
  int64_t lens, a, b, c;
  int64_t at(int64_t div, int64_t bt, int64_t per) const { return bt / div * per; }
};

struct Operands {
  const int32_t* lens;
  const uint32_t *a, *b, *c;  // c: null for +0
  const int32_t *a_exp, *b_exp;  // null for none
};

// One entry of A (M, K) decoded into va (values), va2 (kHybrid: significands) and ea (rows up to a
// multiple of R beyond M are left as they are: their outputs are not stored). Returns whether
// every value is exact (kHybrid reads the values only then).
bool decode_a(const Params& P, const uint32_t* a, const int32_t* ae, float* va, float* va2, int32_t* ea) {
  const int64_t K = P.K, sb = P.sblock, KB = sb ? K / sb : K;
  vi inexact = splat(0);
  for (int64_t m = 0; m < P.M; m++) {
    for (int64_t k = 0; k < K; k += W) {
      const int64_t i = m * K + k, n = K - k;
      vi add = splat(0);
      if (ae && !sb) {
        add = (vi)load_part(ae + i, n);
      } else if (ae) {  // one exponent per block of sb elements
        for (int j = 0; j < W && j < n; j++) add[j] = ae[m * KB + (k + j) / sb];
      }
      vf v, sg;
      vi e;
      inexact |= decode(load_part(a + i, n), P.fa, P.flush_c, add, v, sg, e);
      store_part(va + i, v, n);
      if (va2) store_part(va2 + i, sg, n);
      store_part(ea + i, e, n);
    }
  }
  return !any(inexact);
}

// A decoded for strip(): (M rounded up to R, K) values or significands, significands (kHybrid),
// exponents.
struct DecodedA {
  std::vector<float> v, sg;
  std::vector<int32_t> e, e2;
  bool exact = false;
  void size(const Params& P) {
    const int64_t n = (P.M + R - 1) / R * R * P.K;
    v.resize(n);
    sg.resize(P.kind == kHybrid ? n : 0);
    e.resize(n);
    e2.resize(n / 2);
  }
  void decode(const Params& P, const uint32_t* a, const int32_t* ae) {
    exact = decode_a(P, a, ae, v.data(), sg.empty() ? nullptr : sg.data(), e.data());
    const int64_t K = P.K;
    for (int64_t q = 0; q < (int64_t)e2.size() / K; q++)
      for (int64_t k = 0; k < K; k += W) {
        const vi lo = (vi)load_part(&e[2 * q * K + k], K - k), hi = (vi)load_part(&e[(2 * q + 1) * K + k], K - k);
        store_part(&e2[q * K + k], pack16(lo, hi), K - k);
      }
  }
};

// dst (cols, rows) = src (rows, cols) transposed
template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t c = 0; c < cols; c++)
    for (int64_t r = 0; r < rows; r++) dst[c * rows + r] = src[r * cols + c];
}

// Units [u_begin, u_end) of the batch's column strips (unit u: batch entry u / strips, strip
// u % strips). Each strip of B is decoded once; A is shared (decoded before the threads: one
// entry for the whole batch) or decoded once per entry a thread meets. P.transposed: every
// operand is stored transposed (A as (K, M), B as (N, K), C and D as (N, M): native.chains' narrow
// outputs, D^T = B^T A^T; no exponents); the thread reads each entry into row-major buffers of its
// own and writes its strips of D back transposed.
void worker(const Params& P, const Strides& S, const Operands& O, const DecodedA* shared, int64_t strips,
            uint32_t* out, int64_t u_begin, int64_t u_end) {
  const RoundingMode rounding(P.mode);
  const int64_t K = P.K, N = P.N, M = P.M, KE = P.sblock ? K / P.sblock : K;  // KE: exponents along K
  const bool wide = P.group < P.block || P.block * (int64_t(1) << (P.F + 2)) + (int64_t(1) << (P.F + 1)) >
                                             (int64_t(1) << 32);
  // the fast finish: sums of at most 31 bits (one word, or two words checked per block), a binary32
  // accumulator with an IEEE direction or a narrower one with RZ; wraps: the block's one-word sum
  // with the accumulator may pass 2**31
  const int64_t top = P.block * (int64_t(1) << (P.F + 2));
  const bool fast = kFastFinish && (P.p == 23 ? P.mode != 2 : P.mode == 0) && (wide || top <= (int64_t(1) << 31));
  const bool wraps = top + (int64_t(1) << (P.F + 1)) > (int64_t(1) << 31);
  const bool simple = !wraps && usual_model(P.zero_exp, P.flush_c, P.has_min_exp, P.p);
  const Strip run = P.kind == kSafe ? strip_for<kSafe>(P.block, wide, simple)
                                    : strip_for<kHybrid>(P.block, wide, simple);
  const Strip split = strip_for<kSplit>(P.block, wide, simple);  // kHybrid where a value is not exact
  const Finish slow = wide ? finish_for<true>(P.mode) : finish_for<false>(P.mode);
  DecodedA own;
  if (!shared) own.size(P);
  const DecodedA& A = shared ? *shared : own;
  std::vector<float> bs(K * W), bs2(P.kind == kHybrid ? K * W : 0);
  std::vector<int32_t> es(K * W), es2(K * W);
  const uint32_t* decoded = nullptr;
  const int64_t C = K / P.chain_k;
  const bool tr = P.transposed;
  std::vector<uint32_t> ta(tr ? M * K : 0), tb(tr ? K * N : 0), tc(tr && O.c ? M * N : 0), tout(tr ? C * M * N : 0);
  const uint32_t *b_read = nullptr, *c_read = nullptr;  // the entries in tb and tc
  for (int64_t u = u_begin; u < u_end; u++) {
    const int64_t bt = u / strips, n0 = (u % strips) * W;
    const uint32_t* a_src = O.a + S.at(S.a, bt, M * K);
    const uint32_t* a = tr ? ta.data() : a_src;
    if (!shared && a_src != decoded) {
      const int32_t* ae = O.a_exp ? O.a_exp + S.at(S.a, bt, M * KE) : nullptr;
      if (tr) transpose(a_src, K, M, ta.data());
      own.decode(P, a, ae);
      decoded = a_src;
    }
    const uint32_t* b = O.b + S.at(S.b, bt, K * N);
    const int32_t* be = O.b_exp ? O.b_exp + S.at(S.b, bt, KE * N) : nullptr;
    const uint32_t* c = O.c ? O.c + S.at(S.c, bt, M * N) : nullptr;
    if (tr && b != b_read) {
      transpose(b, N, K, tb.data());
      b_read = b;
    }
    if (tr && c && c != c_read) {
      transpose(c, N, M, tc.data());
      c_read = c;
    }
    if (tr) b = tb.data(), c = c ? tc.data() : nullptr;
    vi inexact = splat(0);
    for (int64_t k = 0; k < K; k++) {
      vi add = be ? (vi)load_part(be + (P.sblock ? k / P.sblock : k) * N + n0, N - n0) : splat(0);
      vf v, sg;
      vi e;
      inexact |= decode(load_part(b + k * N + n0, N - n0), P.fb, P.flush_c, add, v, sg, e);
      std::memcpy(&bs[k * W], &v, sizeof v);
      if (P.kind == kHybrid) std::memcpy(&bs2[k * W], &sg, sizeof sg);
      std::memcpy(&es[k * W], &e, sizeof e);
      const vi e2 = pack16(e, e);
      std::memcpy(&es2[k * W], &e2, sizeof e2);
    }
    uint32_t* o = out + bt * C * M * N;
    const Entry X{A.v.data(), A.sg.empty() ? nullptr : A.sg.data(), A.e.data(), A.e2.data(), a, bs.data(),
                  bs2.empty() ? nullptr : bs2.data(), es.data(), es2.data(), b, c,
                  O.lens + S.at(S.lens, bt, C), tr ? tout.data() : o};
    if (P.kind == kHybrid && !(A.exact && !any(inexact))) {  // significands only
      Entry Xs = X;
      Xs.va = X.va2;
      Xs.bs = X.bs2;
      for (int64_t m0 = 0; m0 < M; m0 += R) split(P, Xs, m0, n0, fast, wraps, slow);
    } else {
      for (int64_t m0 = 0; m0 < M; m0 += R) run(P, X, m0, n0, fast, wraps, slow);
    }
    if (tr)  // this strip's columns of D, transposed
      for (int64_t ch = 0; ch < C; ch++)
        for (int64_t n = n0; n < N && n < n0 + W; n++)
          for (int64_t m = 0; m < M; m++) o[(ch * N + n) * M + m] = tout[(ch * M + m) * N + n];
  }
}

// ----------------------------------------------------------------------------------------------
// Grouped block-scaled fp4 (tcemu/_src/numerics/grouped.py, kind::mxf4 / mxf4nvf4): per block of L
// products, every group of G consecutive products is summed exactly (e2m1 values times 2, as
// float32: every partial sum is an exact integer below 2**12), multiplied by its two scale
// significands and aligned by the scale exponents only (2**(F - 8 + e_g - E)), with the
// accumulator; the exact sum is rounded once. va (M, K) / vb (K, N): e2m1 values times 2; the
// products are the group sums' units (2**-2), the scale significands 2**-6 (hence F - 8).
// sas/sae (M, K / G), sbs/sbe (K / G, N): scale significands (times 2**3) and exponents; am (M,
// K / G) / bm (K / G, N): bit i set where element i of the group is nonzero (a group has a
// nonzero product where am & bm != 0).

struct GParams {
  int64_t M, N, K, chain_k, block, group, F;
  int32_t zero_exp;
  int mode, p;
  bool subnormals, overflow_ieee, flush_c;
};

// m * 2**sh truncated toward zero (m < 2**24, sh <= 31) as two words hi * 2**24 + lo (grouped._terms)
inline void terms24(vu m, vi sh, vi& hi, vi& lo) {
  vu mt = sh < 0 ? shr(m, -sh) : m;
  vi s2 = vmax(sh, splat(0));
  hi = (vi)(s2 >= 24 ? shl(mt, s2 - 24) : shr(mt, 24 - s2));
  lo = (vi)(shl(mt, s2) & 0xFFFFFFu);
}

constexpr int kMaxGroups = 8;

// The general finish of one row's block: the two-word exact sum of the aligned group sums T and
// the accumulator, rounded by round_pack; an infinite accumulator stays, a NaN one is canonical.
template <int Mode>
__attribute__((noinline)) vu gfinish(const GParams& P, int64_t ng, const vi* T, const vi* eg, vi E, vu acc) {
  Params rp{};
  rp.p = P.p;
  rp.subnormals = P.subnormals;
  rp.overflow_ieee = P.overflow_ieee;
  const int F = (int)P.F;
  vi ce, csig, cexp;
  decode_acc(acc, P.flush_c, ce, csig, cexp);
  vi Shi = splat(0), Slo = splat(0), h, l;
  for (int64_t g = 0; g < ng; g++) {
    vi t = T[g];
    terms24((vu)(t < 0 ? -t : t), F - 8 + eg[g] - E, h, l);
    Shi += t < 0 ? -h : h;
    Slo += t < 0 ? -l : l;
  }
  terms24((vu)csig, F - 23 + cexp - E, h, l);
  vi cneg = (vi)acc < 0;
  Shi += cneg ? -h : h;
  Slo += cneg ? -l : l;
  vi neg, sh;
  vu m32;
  norm2<24>(Shi, Slo, neg, m32, sh);
  vu bits = round_pack<Mode>(neg, m32, E - F + sh, rp);
  vu cmag = acc & 0x7FFFFFFFu;
  return (ce == 255) ? (cmag == 0x7F800000u ? acc : splatu(0x7FFFFFFFu)) : bits;
}

typedef vu (*GFinish)(const GParams&, int64_t, const vi*, const vi*, vi, vu);

#if defined(__AVX2__)
typedef double vd __attribute__((vector_size(8 * W)));  // W float64 lanes (two native vectors)

// x truncated toward zero, lane by lane
inline vf trunc_ps(vf x) {
#if defined(__AVX512F__)
  __m512 v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
#else
  __m256 v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
#endif
  std::memcpy(&x, &v, sizeof x);
  return x;
}
inline vd trunc_pd(vd x) {
#if defined(__AVX512F__)
  __m512d v[2];
  std::memcpy(v, &x, sizeof v);
  for (auto& h : v) h = _mm512_roundscale_pd(h, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
#else
  __m256d v[2];
  std::memcpy(v, &x, sizeof v);
  for (auto& h : v) h = _mm256_round_pd(h, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
#endif
  std::memcpy(&x, v, sizeof x);
  return x;
}

// The fast finish of the grouped model (AVX2 or AVX-512): each term trunc(x * 2**(F - E)) is
// exact in float32 (a group: T < 2**20 times a power of two) or in float64 (the accumulator),
// their sum is an exact float64 integer (below 2**53: see Grouped), converted to float32 in the
// model's direction (MXCSR), then E - F is added to its exponent field. Lanes whose result would
// not be a normal float32, or whose exponents leave the float32 scales, are flagged in `bad`.
// egs: the group exponents plus F - 8 + 127 (a term's scale field before E).
template <int NGc>
__attribute__((always_inline)) inline vu gfast(const GParams& P, int64_t ng, const vi* T, const vi* egs, vi E, vu acc,
                                               vi& bad) {
  const int F = (int)P.F;
  const vf c = acc_value(acc, P.flush_c);
  bad |= ((vi)((acc >> 23u) & 255u) == 255) | (E < -126) | (E > 126);
  vd sum = (vd){};
#pragma GCC unroll 8
  for (int64_t g = 0; g < (NGc ? NGc : ng); g++) {  // T * 2**(F - 8 + e_g - E): below 2**-126 it truncates to 0 anyway
    const vu s = (vu)vmax(egs[g] - E, splat(1)) << 23u;
    vf scale;
    std::memcpy(&scale, &s, sizeof s);
    sum += __builtin_convertvector(trunc_ps(__builtin_convertvector(T[g], vf) * scale), vd);
  }
  {  // the accumulator: trunc(c * 2**-E * 2**F) in float64
    const vu s = (vu)(127 - vmin(vmax(E, splat(-126)), splat(126))) << 23u;
    vf sc;
    std::memcpy(&sc, &s, sizeof s);
    sum += trunc_pd(__builtin_convertvector(c, vd) * __builtin_convertvector(sc, vd) * (double)(int64_t(1) << F));
  }
  const vf r = __builtin_convertvector(sum, vf);  // rounded in the model's direction (MXCSR)
  vi fb;
  std::memcpy(&fb, &r, sizeof fb);
  const vi zero = (fb & 0x7FFFFFFF) == 0;
  const vi be = ((fb >> 23) & 255) + (E - F);
  bad |= ~zero & ((be < 1) | (be > 254));
  return (vu)(zero ? splat(0) : fb + ((E - F) << 23));
}
constexpr bool kGroupedFast = true;
#else
template <int NGc>
inline vu gfast(const GParams&, int64_t, const vi*, const vi*, vi, vu acc, vi& bad) {
  bad = splat(-1);
  return acc;
}
constexpr bool kGroupedFast = false;
#endif

// Output rows [m0, m0 + R) of one strip of W columns of the grouped model, every chain; groups of
// Gc products, NGc per block (0: P's). The rows are unrolled and gfinish() sits in a cold branch,
// so that a block's state stays in registers.
template <int Gc, int NGc>
void gstrip(const GParams& P, const int32_t* lens, const float* va, const int32_t* am, const int32_t* sas,
            const int32_t* sae, const float* bs, const int32_t* bm, const int32_t* sbs, const int32_t* sbe,
            int64_t m0, int64_t n0, uint32_t* out, bool fast, GFinish slow) {
  const int64_t K = P.K, G = Gc ? Gc : P.group, ng = NGc ? NGc : P.block / G, L = ng * G, KG = K / G;
  const int32_t bias = (int32_t)P.F - 8 + 127;  // gfast's scale field of a group, less E
  const vu zmask = zero_mask(P.flush_c);
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    vu acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = splatu(0);
    const int64_t end = c0 + lens[c0 / P.chain_k];
    for (int64_t k0 = c0; k0 < end; k0 += L) {
      vi E[R], eg[R][kMaxGroups], T[R][kMaxGroups];
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) E[r] = acc_exponent(acc[r], zmask, P.zero_exp);
#pragma GCC unroll 8
      for (int64_t g = 0; g < ng; g++) {
        const int64_t kg0 = k0 + g * G, gi = kg0 / G;
        vf sum[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) sum[r] = (vf){};
#pragma GCC unroll 32
        for (int64_t k = kg0; k < kg0 + G; k++) {
          vf b;
          std::memcpy(&b, bs + k * W, sizeof b);
#pragma GCC unroll 4
          for (int r = 0; r < R; r++) sum[r] += b * va[(m0 + r) * K + k];  // exact: contracted to FMA
        }
        vi bsig, bexp, bmask;
        std::memcpy(&bsig, sbs + gi * W, sizeof bsig);
        std::memcpy(&bexp, sbe + gi * W, sizeof bexp);
        std::memcpy(&bmask, bm + gi * W, sizeof bmask);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          vi S = bsig * sas[(m0 + r) * KG + gi];
          T[r][g] = __builtin_convertvector(sum[r], vi) * S;
          eg[r][g] = (((bmask & am[(m0 + r) * KG + gi]) != 0) & (S != 0)) ? bexp + sae[(m0 + r) * KG + gi]
                                                                         : splat(P.zero_exp);
          E[r] = vmax(E[r], eg[r][g]);
        }
      }
      if (fast) {  // the fast finish where it holds for every lane of the R rows
        vu bits[R];
        vi bad[R], worst = splat(0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          vi egs[kMaxGroups];
#pragma GCC unroll 8
          for (int64_t g = 0; g < ng; g++) egs[g] = eg[r][g] + bias;
          bad[r] = splat(0);
          bits[r] = gfast<NGc>(P, ng, T[r], egs, E[r], acc[r], bad[r]);
          worst |= bad[r];
        }
        if (__builtin_expect(!any(worst), 1)) {
#pragma GCC unroll 4
          for (int r = 0; r < R; r++) acc[r] = bits[r];
          continue;
        }
        for (int r = 0; r < R; r++) acc[r] = any(bad[r]) ? slow(P, ng, T[r], eg[r], E[r], acc[r]) : bits[r];
      } else {
        for (int r = 0; r < R; r++) acc[r] = slow(P, ng, T[r], eg[r], E[r], acc[r]);
      }
    }
    const int64_t chain = c0 / P.chain_k;
    for (int r = 0; r < R; r++) {
      if (m0 + r < P.M) std::memcpy(out + (chain * P.M + m0 + r) * P.N + n0, &acc[r], sizeof acc[r]);
    }
  }
}

typedef void (*GStrip)(const GParams&, const int32_t*, const float*, const int32_t*, const int32_t*, const int32_t*,
                       const float*, const int32_t*, const int32_t*, const int32_t*, int64_t, int64_t, uint32_t*, bool,
                       GFinish);

ffi::Error Grouped(ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::F32> va, ffi::Buffer<ffi::S32> sas,
                   ffi::Buffer<ffi::S32> sae, ffi::Buffer<ffi::F32> vb, ffi::Buffer<ffi::S32> sbs,
                   ffi::Buffer<ffi::S32> sbe, ffi::ResultBuffer<ffi::U32> out, int64_t chain_k, int64_t block,
                   int64_t group, int64_t F, int64_t zero_exp, int64_t mode, int64_t subnormals,
                   int64_t overflow_ieee, int64_t flush_c, int64_t threads) {
  auto ad = va.dimensions(), bd = vb.dimensions();
  if (ad.size() != 2 || bd.size() != 2 || ad[1] != bd[0])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: A (M, K) and B (K, N) expected");
  GParams P{ad[0], bd[1], ad[1], chain_k, block, group, F, (int32_t)zero_exp, (int)mode, 23, subnormals != 0,
            overflow_ieee != 0, flush_c != 0};
  if (P.M % R || P.N % W || chain_k <= 0 || P.K % chain_k || group <= 0 || group > 32 || block % group ||
      block / group > kMaxGroups || chain_k % block || lens.element_count() != (size_t)(P.K / chain_k))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: bad shapes or attributes");
  const int64_t K = P.K, N = P.N, KG = K / group, strips = N / W;
  int64_t T = threads < 1 ? 1 : (threads > strips ? strips : threads);
  if (P.M * P.N * P.K < kThreadsFrom) T = 1;  // small calls: threads cost more than they save
  const float* a = va.typed_data();
  std::vector<int32_t> am(P.M * KG, 0);  // nonzero elements of A's groups
  for (int64_t g = 0; g < P.M * KG; g++) {
    int32_t m = 0;
    for (int64_t i = 0; i < group; i++) m |= int32_t(a[g * group + i] != 0) << i;
    am[g] = m;
  }
  // the fast finish needs the exact sum below 2**53: groups |T| < G * 144 * 2**8, times 2**(F - 8),
  // and the accumulator below 2**(F + 1)
  const double top = (double)(block / group) * group * 144 * 256 * std::ldexp(1.0, (int)F - 8);
  const bool fast = kGroupedFast && mode != 2 && top + std::ldexp(1.0, (int)F + 1) <= std::ldexp(1.0, 53);
  auto run = [&](int64_t s0, int64_t s1) {
    const RoundingMode rounding((int)mode);
    const GFinish slow = mode == 0 ? gfinish<0> : mode == 1 ? gfinish<1> : mode == 2 ? gfinish<2>
                         : mode == 3 ? gfinish<3> : gfinish<4>;
    // the presets' blocks of 64 in groups of 16 at compile time
    const GStrip strip = group == 16 && block == 64 ? gstrip<16, 4> : gstrip<0, 0>;
    std::vector<float> bsv(K * W);
    std::vector<int32_t> sbsv(KG * W), sbev(KG * W), bmv(KG * W);
    for (int64_t s = s0; s < s1; s++) {
      const int64_t n0 = s * W;
      for (int64_t g = 0; g < KG; g++) {
        vi m = splat(0);
        for (int64_t i = 0; i < group; i++) {
          const int64_t k = g * group + i;
          vf x;
          std::memcpy(&x, vb.typed_data() + k * N + n0, sizeof x);
          std::memcpy(&bsv[k * W], &x, sizeof x);
          m |= (vi)(x != 0) & (int32_t(1) << i);
        }
        std::memcpy(&bmv[g * W], &m, sizeof m);
      }
      for (int64_t g = 0; g < KG; g++) {
        std::memcpy(&sbsv[g * W], sbs.typed_data() + g * N + n0, W * sizeof(int32_t));
        std::memcpy(&sbev[g * W], sbe.typed_data() + g * N + n0, W * sizeof(int32_t));
      }
      for (int64_t m0 = 0; m0 < P.M; m0 += R)
        strip(P, lens.typed_data(), a, am.data(), sas.typed_data(), sae.typed_data(), bsv.data(), bmv.data(),
              sbsv.data(), sbev.data(), m0, n0, out->typed_data(), fast, slow);
    }
  };
  if (T == 1) {
    run(0, strips);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < T; t++) pool.emplace_back(run, strips * t / T, strips * (t + 1) / T);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
}

// a, b, c and out are 32-bit words typed float32: the caller's bitcasts from and to float32
// arrays then cancel in XLA (no copies); the kernel reads and writes them as bit patterns.
ffi::Error Chains(ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                  ffi::Buffer<ffi::S32> a_exp, ffi::Buffer<ffi::S32> b_exp, ffi::Buffer<ffi::F32> c,
                  ffi::ResultBuffer<ffi::F32> out, int64_t chain_k, int64_t block, int64_t F, int64_t group,
                  int64_t kind, int64_t ab_shift, int64_t zero_policy, int64_t zero_exp, int64_t has_min_exp,
                  int64_t min_exp, int64_t mode, int64_t p, int64_t subnormals, int64_t overflow_ieee,
                  int64_t flush_c, int64_t a_format, int64_t b_format, int64_t has_c, int64_t has_a_exp,
                  int64_t has_b_exp, int64_t scale_block, int64_t threads, int64_t transposed) {
  // transposed: A (..., K, M), B (..., N, K), C and D (..., N, M)
  auto ad = a.dimensions(), bd = b.dimensions();
  const size_t na = ad.size(), nb = bd.size();
  if (na < 2 || nb < 2 || (transposed ? ad[na - 2] != bd[nb - 1] : ad[na - 1] != bd[nb - 2]))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: A (..., M, K) and B (..., K, N) expected (transposed: (..., K, M), (..., N, K))");
  if (out->element_count() == 0) return ffi::Error::Success();
  // formats packed as eb | fb << 8 | shift << 16 | has_inf << 24 | has_nan << 25
  Params P{transposed ? ad[na - 1] : ad[na - 2], transposed ? bd[nb - 2] : bd[nb - 1],
           transposed ? ad[na - 2] : ad[na - 1], chain_k, block, F, group, (int)kind,
           scale_block > 0 ? scale_block : 0, (int32_t)ab_shift,
           zero_policy != 0, (int32_t)zero_exp, has_min_exp != 0, (int32_t)min_exp, (int)mode,
           (int)p, subnormals != 0, overflow_ieee != 0, flush_c != 0, unpack_format(a_format),
           unpack_format(b_format), transposed != 0};
  if (P.M < 1 || P.N < 1 || P.chain_k <= 0 || P.K % P.chain_k || P.block <= 0 || P.chain_k % P.block ||
      P.group <= 0 || P.F > 29 || (P.kind != kSafe && P.kind != kHybrid))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: K % chain_k and chain_k % block must be 0, F <= 29, kind safe or hybrid");
  const int64_t C = P.K / P.chain_k, MK = P.M * P.K, KN = P.K * P.N, MN = P.M * P.N;
  const int64_t batch = (int64_t)out->element_count() / (C * MN);
  const Strides S{batch_stride(lens.element_count(), C, batch), batch_stride(a.element_count(), MK, batch),
                  batch_stride(b.element_count(), KN, batch), batch_stride(c.element_count(), MN, batch)};
  const bool has_ae = has_a_exp != 0, has_be = has_b_exp != 0;
  const int64_t per = scale_block > 0 ? scale_block : 1;  // elements per exponent
  if (S.lens < 0 || S.a < 0 || S.b < 0 || (has_c != 0 && S.c < 0) || P.K % per || (P.transposed && (has_ae || has_be)) ||
      (has_ae && a_exp.element_count() * per != a.element_count()) ||
      (has_be && b_exp.element_count() * per != b.element_count()))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: one length per chain, operands and C per batch entry or shared");
  const int64_t strips = (P.N + W - 1) / W, units = batch * strips;
  int64_t T = threads < 1 ? 1 : threads;
  if (batch * MN * P.K < kThreadsFrom) T = 1;  // small calls: threads cost more than they save
  if (T > units) T = units;
  auto words = [](const float* x) { return reinterpret_cast<const uint32_t*>(x); };
  const Operands O{lens.typed_data(), words(a.typed_data()), words(b.typed_data()),
                   has_c != 0 ? words(c.typed_data()) : nullptr, has_ae ? a_exp.typed_data() : nullptr,
                   has_be ? b_exp.typed_data() : nullptr};
  uint32_t* o = reinterpret_cast<uint32_t*>(out->typed_data());
  // one entry of A for the whole batch (a GEMM): decoded once, read by every thread
  DecodedA shared;
  const bool share = S.a == batch && T > 1 && !P.transposed;
  if (share) {
    const RoundingMode rounding(P.mode);
    shared.size(P);
    shared.decode(P, O.a, O.a_exp);
  }
  const DecodedA* sh = share ? &shared : nullptr;
  if (T == 1) {
    worker(P, S, O, sh, strips, o, 0, units);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < T; t++)
      pool.emplace_back(worker, std::cref(P), std::cref(S), std::cref(O), sh, strips, o, units * t / T,
                        units * (t + 1) / T);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
}

}  // namespace

// output columns per vector: native.chains runs narrow outputs (N < W) transposed
extern "C" int tcemu_lanes() { return W; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_blockfma_chains, Chains,
                              TCEMU_CHAINS_ATTRS(TCEMU_CHAINS_ARGS(ffi::Ffi::Bind())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_grouped_chains, Grouped,
                              TCEMU_GROUPED_ATTRS(ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()));
