// Chains of fused block FMAs on the CPU: the hot loop of tcemu's emulated GEMMs as an XLA FFI
// custom call. It computes, bit for bit, what tcemu/_src/numerics/engine.py computes for the
// models listed in tcemu/_src/native/__init__.py (supports): per output, per block of L products,
// the alignment exponent E (largest product or accumulator exponent), every product truncated
// toward zero F bits below E, an exact integer sum with the aligned accumulator (int32 groups as
// the engine's _group_sums, added as two words when one int32 word cannot hold the block), and one
// rounding (rounding.round_pack32); outputs whose block has a NaN/inf operand or accumulator take
// the engine's special-value path (NaN, or an infinity).
//
// Operands: the bit patterns of A (M, K) and B (K, N) with their formats (exponent and fraction
// bits, shift, NaN/inf encoding), optional int32 exponents added per element (the ue8m0 scales of
// kind::mxf8f6f4). The kernel decodes them as engine._prepare does (exponent sentinels: zero
// -2**18, NaN/inf +2**20), A once per batch entry and B by strips of W columns.
// "safe" mode: the decoded values are the exact element values (their products are exact float32
// numbers far from the range limits), so a term is trunc(va * vb * 2**(F - E)). Otherwise they are
// the signed integer significands (at most 12 bits) and a term is trunc(va * vb * 2**(ea + eb - fab
// - fbb + F - E)); the scale is clamped at 2**-126, where every term truncates to 0 anyway.
// Output (K / chain_k, M, N) uint32: per chain of chain_k elements of K, the accumulator bits after
// its first lens[chain] elements (whole blocks; the rest is padding that does not run), from the
// addend C (M, N) float32 bits, or from +0 (has_c 0; absent operands are one dummy element). Leading batch axes: every operand may
// have them, or not have them (then it is shared by the whole batch); the output has them.
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int W = 16;  // output columns per vector
constexpr int R = 4;   // output rows sharing the loads of B
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint32_t vu __attribute__((vector_size(4 * W)));
typedef float vf __attribute__((vector_size(4 * W)));

constexpr int64_t kThreadsFrom = int64_t(1) << 21;  // products of a call worth several threads
constexpr int32_t kBig = 1 << 20;  // engine._BIG: the exponent of NaN/inf operands
constexpr int32_t kZeroSentinel = -kBig / 4;  // the exponent of zero operands
constexpr int32_t kSpecialAbove = 1 << 19;  // engine._SPECIAL_ABOVE
constexpr int32_t kZeroBelow = -(1 << 17);  // engine._ZERO_BELOW

// An element format: exponent and fraction bits, the shift of its bits (tf32 in float32
// patterns: 13), infinities (IEEE-like), NaN (all ones exponent; without infinities, all ones).
struct Fmt {
  int32_t eb, fb, shift;
  bool has_inf, has_nan;
};


struct Params {
  int64_t M, N, K, chain_k, block, F;
  int64_t group;            // products per int32 partial sum (the engine's _group_sums)
  bool safe;
  int32_t ab_shift;         // fab + fbb (split mode)
  bool zero_policy;         // zero products count with zero_exp
  int32_t zero_exp;         // exponent of a zero accumulator (zero_exponent, or -2**20)
  bool has_min_exp;
  int32_t min_exp;
  int mode;                 // 0 rz, 1 rne, 2 rna, 3 ru, 4 rd
  int p;                    // fraction bits of the accumulator format (shift = 23 - p)
  bool subnormals, overflow_ieee, flush_c;  // flush_c: subnormal inputs (operands and C) read as 0
  Fmt fa, fb;
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
#endif
  typedef int32_t half __attribute__((vector_size(2 * W)));
  half h[2];
  std::memcpy(h, &x, sizeof x);
  half o = h[0] | h[1];
  int64_t w[W / 4];
  std::memcpy(w, &o, sizeof o);
  int64_t r = 0;
  for (int i = 0; i < W / 4; i++) r |= w[i];
  return r != 0;
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
#endif
  vi r = splat(0);
  vu t;
  vi c;
  for (int s = 16; s >= 1; s >>= 1) {
    t = x >> (uint32_t)s;
    c = (vi)(t != 0);
    r += c & s;
    x = c ? t : x;
  }
  return (x == 0) ? splat(32) : 31 - r;
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

// engine._prepare of W elements' bits (fm.decode, flushing subnormals if asked): the value (safe:
// the exact element value; else the signed significand) and the exponent with the sentinels, plus
// `add`. Bits 0 (also the padding beyond M and N) decode to value 0 with the zero sentinel.
inline void decode(vu bits, const Fmt& f, bool flush, bool safe, vi add, vf& v, vi& e) {
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
  const vi exp = normal ? ef - bias : splat(1 - bias);
  vf x = __builtin_convertvector(neg ? -sig : sig, vf);
  if (safe) {
    const vu p = (vu)(exp - f.fb + 127) << 23u;
    vf scale;
    std::memcpy(&scale, &p, sizeof p);
    x = (sig == 0) ? (vf){} : x * scale;
  }
  v = x;
  e = ((sig == 0) ? splat(kZeroSentinel) : exp);
  e = (special ? splat(kBig) : e) + add;
}

// Classes of one element for the special-value path (engine._product_flags, without flushing):
// bit 0 zero, bit 1 infinity, bit 2 NaN, bit 3 sign.
inline int32_t element_class(uint32_t bits, const Fmt& f) {
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

// The special-value path of engine._fused for one output: NaN if a product is NaN (a NaN factor, or
// inf * 0), the accumulator is NaN, or infinities of both signs meet; else the infinity's sign.
// arow: A's row (bits, along K); bcol: B's column (bits, stride n).
__attribute__((noinline)) uint32_t special_value(const uint32_t* arow, const uint32_t* bcol, int64_t n,
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

// One batch entry's operands as strip() reads them.
struct Entry {
  const float* va;       // A decoded, (M rounded up to R, K); rows beyond M are 0
  const int32_t* ea;
  const uint32_t* a;     // A's bits (M, K), for the special-value path
  const float* bs;       // B's strip decoded, packed (K, W)
  const int32_t* es;
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
#else
  v = splatu(0);
  for (int64_t j = 0; j < n; j++) v[j] = static_cast<const uint32_t*>(p)[j];
#endif
  return v;
}

template <bool Safe, int Mode, bool Wide>
void strip(const Params& P, const Entry& X, int64_t m0, int64_t n0) {
  const int64_t K = P.K, N = P.N, M = P.M, L = P.block, nw = N - n0 < W ? N - n0 : W;
  const float* pa = X.va + m0 * K;  // the R rows
  const int32_t* pe = X.ea + m0 * K;
  const float* bs = X.bs;
  const int32_t* es = X.es;
  const int32_t* lens = X.lens;
  const int F = (int)P.F;
  const int32_t split_bias = (int32_t)(F + 127) - P.ab_shift;
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    vu acc[R];
    for (int r = 0; r < R; r++) {
      acc[r] = splatu(0);
      if (X.c && m0 + r < M) acc[r] = load_part(X.c + (m0 + r) * N + n0, nw);
    }
    const int64_t end = c0 + lens[c0 / P.chain_k];
    for (int64_t k0 = c0; k0 < end; k0 += L) {
      vi E[R], cexp[R], csig[R];
      vi cspecial[R];
      for (int r = 0; r < R; r++) {
        vi ce = (vi)((acc[r] >> 23u) & 255u);
        vi frac = (vi)(acc[r] & 0x7FFFFFu);
        vi sig = (ce != 0) ? (frac | 0x800000) : frac;
        if (P.flush_c) sig = (ce != 0) ? sig : splat(0);
        cspecial[r] = ce == 255;
        cexp[r] = (ce != 0) ? ce - 127 : splat(-126);
        csig[r] = sig;
        E[r] = (sig == 0) ? splat(P.zero_exp) : cexp[r];
      }
      for (int64_t k = k0; k < k0 + L; k++) {
        vi e;
        std::memcpy(&e, es + k * W, sizeof e);
        for (int r = 0; r < R; r++) {
          vi t = e + pe[r * K + k];
          if (P.zero_policy) t = (t < kZeroBelow) ? splat(P.zero_exp) : t;
          E[r] = vmax(E[r], t);
        }
      }
      vi S[R], Shi[R], Slo[R];  // Wide: the int32 group sums added as two 16-bit-split words
      for (int r = 0; r < R; r++) {
        if (P.has_min_exp) E[r] = vmax(E[r], splat(P.min_exp));
        S[r] = splat(0);
        if (Wide) Shi[r] = Slo[r] = splat(0);
      }
      if (Safe) {
        vf scale[R];
        for (int r = 0; r < R; r++) {
          vi x = vmin(vmax(F - E[r] + 127, splat(1)), splat(254));
          vu u = (vu)x << 23u;
          std::memcpy(&scale[r], &u, sizeof u);
        }
        for (int64_t k = k0; k < k0 + L; k++) {
          vf b;
          std::memcpy(&b, bs + k * W, sizeof b);
          for (int r = 0; r < R; r++)
            S[r] += __builtin_convertvector((b * pa[r * K + k]) * scale[r], vi);
          if (Wide && ((k - k0 + 1) % P.group == 0 || k + 1 == k0 + L))
            for (int r = 0; r < R; r++) Shi[r] += S[r] >> 16, Slo[r] += S[r] & 0xFFFF, S[r] = splat(0);
        }
      } else {
        vi base[R];
        for (int r = 0; r < R; r++) base[r] = split_bias - E[r];
        for (int64_t k = k0; k < k0 + L; k++) {
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
          if (Wide && ((k - k0 + 1) % P.group == 0 || k + 1 == k0 + L))
            for (int r = 0; r < R; r++) Shi[r] += S[r] >> 16, Slo[r] += S[r] & 0xFFFF, S[r] = splat(0);
        }
      }
      for (int r = 0; r < R; r++) {
        vi cs = F >= 23 ? csig[r] << (F - 23) : csig[r];
        vi sh = vmin(vmax(E[r] - cexp[r] + (F >= 23 ? 0 : 23 - F), splat(0)), splat(31));
        vi tc = cs >> sh;
        tc = ((vi)acc[r] < 0) ? -tc : tc;
        vu bits;
        if (Wide) {  // the exact sum in two words, brought to one with a sticky bit
          vi neg, sh;
          vu m32;
          norm2<16>(Shi[r] + (tc >> 16), Slo[r] + (tc & 0xFFFF), neg, m32, sh);
          bits = round_pack<Mode>(neg, m32, E[r] - F + sh, P);
        } else {  // |sum| < 2**32: one int32 sum with wrap-around, the sign from the overflow
          vi s = (vi)((vu)S[r] + (vu)tc);
          vi neg = (((S[r] ^ s) & (tc ^ s)) < 0) ? (S[r] < 0) : (s < 0);
          vu u = (vu)s;
          vu mag = neg ? 0u - u : u;
          bits = round_pack<Mode>(neg, mag, E[r] - F, P);
        }
        vi special = (E[r] > kSpecialAbove) | cspecial[r];
        acc[r] = any(special) && m0 + r < M ? specials(P, X, bits, special, acc[r], m0 + r, n0, k0) : bits;
      }
    }
    const int64_t chain = c0 / P.chain_k;
    for (int r = 0; r < R; r++) {
      if (m0 + r < M) store_part(X.out + (chain * M + m0 + r) * N + n0, acc[r], nw);
    }
  }
}

template <bool Safe, bool Wide>
auto pick(int mode) {
  return mode == 0 ? strip<Safe, 0, Wide> : mode == 1 ? strip<Safe, 1, Wide> : mode == 2 ? strip<Safe, 2, Wide>
         : mode == 3 ? strip<Safe, 3, Wide> : strip<Safe, 4, Wide>;
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

// One entry of A (M, K) decoded as one run of elements into va/ea (rows up to a multiple of R
// beyond M are left as they are: their outputs are not stored).
void decode_a(const Params& P, const uint32_t* a, const int32_t* ae, float* va, int32_t* ea) {
  const int64_t n = P.M * P.K;
  for (int64_t i = 0; i < n; i += W) {
    vf v;
    vi e;
    decode(load_part(a + i, n - i), P.fa, P.flush_c, P.safe, ae ? (vi)load_part(ae + i, n - i) : splat(0), v, e);
    store_part(va + i, v, n - i);
    store_part(ea + i, e, n - i);
  }
}

// Units [u_begin, u_end) of the batch's column strips (unit u: batch entry u / strips, strip
// u % strips). Each strip of B is decoded once; A is shared (decoded before the threads: one
// entry for the whole batch) or decoded once per entry a thread meets.
void worker(const Params& P, const Strides& S, const Operands& O, const float* va_shared, const int32_t* ea_shared,
            int64_t strips, uint32_t* out, int64_t u_begin, int64_t u_end) {
  const int64_t K = P.K, N = P.N, M = P.M, Mp = (M + R - 1) / R * R;
  const bool wide = P.group < P.block || P.block * (int64_t(1) << (P.F + 2)) + (int64_t(1) << (P.F + 1)) >
                                             (int64_t(1) << 32);
  auto run = P.safe ? (wide ? pick<true, true>(P.mode) : pick<true, false>(P.mode))
                    : (wide ? pick<false, true>(P.mode) : pick<false, false>(P.mode));
  std::vector<float> va(va_shared ? 0 : Mp * K), bs(K * W);
  std::vector<int32_t> ea(va_shared ? 0 : Mp * K), es(K * W);
  const uint32_t* decoded = nullptr;
  for (int64_t u = u_begin; u < u_end; u++) {
    const int64_t bt = u / strips, n0 = (u % strips) * W;
    const uint32_t* a = O.a + S.at(S.a, bt, M * K);
    if (!va_shared && a != decoded) {
      decode_a(P, a, O.a_exp ? O.a_exp + S.at(S.a, bt, M * K) : nullptr, va.data(), ea.data());
      decoded = a;
    }
    const uint32_t* b = O.b + S.at(S.b, bt, K * N);
    for (int64_t k = 0; k < K; k++) {
      vi add = O.b_exp ? (vi)load_part(O.b_exp + S.at(S.b, bt, K * N) + k * N + n0, N - n0) : splat(0);
      vf v;
      vi e;
      decode(load_part(b + k * N + n0, N - n0), P.fb, P.flush_c, P.safe, add, v, e);
      std::memcpy(&bs[k * W], &v, sizeof v);
      std::memcpy(&es[k * W], &e, sizeof e);
    }
    const Entry X{va_shared ? va_shared : va.data(), va_shared ? ea_shared : ea.data(), a, bs.data(), es.data(), b,
                  O.c ? O.c + S.at(S.c, bt, M * N) : nullptr, O.lens + S.at(S.lens, bt, K / P.chain_k),
                  out + bt * (K / P.chain_k) * M * N};
    for (int64_t m0 = 0; m0 < M; m0 += R) run(P, X, m0, n0);
  }
}

// ----------------------------------------------------------------------------------------------
// Grouped block-scaled fp4 (tcemu/_src/numerics/grouped.py, kind::mxf4 / mxf4nvf4): per block of L
// products, every group of G consecutive products is summed exactly (e2m1 values times 2, as
// float32: every partial sum is an exact integer below 2**12), multiplied by its two scale
// significands and aligned by the scale exponents only (2**(F - 8 + e_g - E)), with the
// accumulator; the exact two-word sum is rounded once. va (M, K) / vb (K, N): e2m1 values times 2;
// the products are the group sums' units (2**-2), the scale significands 2**-6 (hence F - 8).
// sas/sae (M, K / G), sbs/sbe (K / G, N): scale significands (times 2**3) and exponents.

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

template <int Mode>
void gstrip(const GParams& P, const int32_t* lens, const float* va, const float* vab, const int32_t* sas,
            const int32_t* sae, const float* bs, const float* bsa, const int32_t* sbs, const int32_t* sbe,
            int64_t m0, int64_t n0, uint32_t* out) {
  const int64_t K = P.K, M = P.M, L = P.block, G = P.group, KG = K / G;
  const int F = (int)P.F;
  Params rp{};
  rp.p = P.p;
  rp.subnormals = P.subnormals;
  rp.overflow_ieee = P.overflow_ieee;
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    vu acc[R];
    for (int r = 0; r < R; r++) acc[r] = splatu(0);
    const int64_t end = c0 + lens[c0 / P.chain_k];
    for (int64_t k0 = c0; k0 < end; k0 += L) {
      const int64_t ng = L / G;
      vi E[R], eg[R][8], T[R][8], cexp[R], csig[R], cspecial[R];
      for (int r = 0; r < R; r++) {
        vi ce = (vi)((acc[r] >> 23u) & 255u);
        vi frac = (vi)(acc[r] & 0x7FFFFFu);
        vi sig = (ce != 0) ? (frac | 0x800000) : frac;
        if (P.flush_c) sig = (ce != 0) ? sig : splat(0);
        cspecial[r] = ce == 255;
        cexp[r] = (ce != 0) ? ce - 127 : splat(-126);
        csig[r] = sig;
        E[r] = (sig == 0) ? splat(P.zero_exp) : cexp[r];
      }
      for (int64_t g = 0; g < ng; g++) {
        const int64_t kg0 = k0 + g * G, gi = kg0 / G;
        vf sum[R], mag[R];
        for (int r = 0; r < R; r++) sum[r] = mag[r] = (vf){};
        for (int64_t k = kg0; k < kg0 + G; k++) {
          vf b, ba;
          std::memcpy(&b, bs + k * W, sizeof b);
          std::memcpy(&ba, bsa + k * W, sizeof ba);
          for (int r = 0; r < R; r++) {
            sum[r] += b * va[(m0 + r) * K + k];
            mag[r] += ba * vab[(m0 + r) * K + k];
          }
        }
        vi bsig, bexp;
        std::memcpy(&bsig, sbs + gi * W, sizeof bsig);
        std::memcpy(&bexp, sbe + gi * W, sizeof bexp);
        for (int r = 0; r < R; r++) {
          vi S = bsig * sas[(m0 + r) * KG + gi];
          T[r][g] = __builtin_convertvector(sum[r], vi) * S;
          eg[r][g] = ((mag[r] != 0) & (S != 0)) ? bexp + sae[(m0 + r) * KG + gi] : splat(P.zero_exp);
          E[r] = vmax(E[r], eg[r][g]);
        }
      }
      for (int r = 0; r < R; r++) {
        vi Shi = splat(0), Slo = splat(0), h, l;
        for (int64_t g = 0; g < ng; g++) {
          vi t = T[r][g];
          terms24((vu)(t < 0 ? -t : t), F - 8 + eg[r][g] - E[r], h, l);
          Shi += t < 0 ? -h : h;
          Slo += t < 0 ? -l : l;
        }
        terms24((vu)csig[r], F - 23 + cexp[r] - E[r], h, l);
        vi cneg = (vi)acc[r] < 0;
        Shi += cneg ? -h : h;
        Slo += cneg ? -l : l;
        vi neg, sh;
        vu m32;
        norm2<24>(Shi, Slo, neg, m32, sh);
        vu bits = round_pack<Mode>(neg, m32, E[r] - F + sh, rp);
        vu cmag = acc[r] & 0x7FFFFFFFu;  // an infinite accumulator stays, a NaN one is canonical
        acc[r] = cspecial[r] ? (cmag == 0x7F800000u ? acc[r] : splatu(0x7FFFFFFFu)) : bits;
      }
    }
    const int64_t chain = c0 / P.chain_k;
    for (int r = 0; r < R; r++) {
      if (m0 + r < M) std::memcpy(out + (chain * M + m0 + r) * P.N + n0, &acc[r], sizeof acc[r]);
    }
  }
}

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
  if (P.M % R || P.N % W || chain_k <= 0 || P.K % chain_k || group <= 0 || block % group || block / group > 8 ||
      chain_k % block || lens.element_count() != (size_t)(P.K / chain_k))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: bad shapes or attributes");
  const int64_t K = P.K, N = P.N, KG = K / group, strips = N / W;
  int64_t T = threads < 1 ? 1 : (threads > strips ? strips : threads);
  if (P.M * P.N * P.K < kThreadsFrom) T = 1;  // small calls: threads cost more than they save
  const float* a = va.typed_data();
  std::vector<float> aabs(a, a + P.M * K);
  for (auto& x : aabs) x = x < 0 ? -x : x;
  auto run = mode == 0 ? gstrip<0> : mode == 1 ? gstrip<1> : mode == 2 ? gstrip<2> : mode == 3 ? gstrip<3> : gstrip<4>;
  auto work = [&](int64_t s0, int64_t s1) {
    std::vector<float> bsv(K * W), bsa(K * W);
    std::vector<int32_t> sbsv(KG * W), sbev(KG * W);
    for (int64_t s = s0; s < s1; s++) {
      const int64_t n0 = s * W;
      for (int64_t k = 0; k < K; k++)
        for (int j = 0; j < W; j++) {
          float x = vb.typed_data()[k * N + n0 + j];
          bsv[k * W + j] = x;
          bsa[k * W + j] = x < 0 ? -x : x;
        }
      for (int64_t g = 0; g < KG; g++) {
        std::memcpy(&sbsv[g * W], sbs.typed_data() + g * N + n0, W * sizeof(int32_t));
        std::memcpy(&sbev[g * W], sbe.typed_data() + g * N + n0, W * sizeof(int32_t));
      }
      for (int64_t m0 = 0; m0 < P.M; m0 += R)
        run(P, lens.typed_data(), a, aabs.data(), sas.typed_data(), sae.typed_data(), bsv.data(), bsa.data(),
            sbsv.data(), sbev.data(), m0, n0, out->typed_data());
    }
  };
  if (T == 1) {
    work(0, strips);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < T; t++) pool.emplace_back(work, strips * t / T, strips * (t + 1) / T);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
}

// Strides' divisor of a buffer of `count` elements, `per` elements per entry: -1 when its entries
// do not divide the batch.
int64_t batch_stride(size_t count, int64_t per, int64_t batch) {
  const int64_t n = (int64_t)count / per;
  return (int64_t)count % per || n < 1 || batch % n ? -1 : batch / n;
}

ffi::Error Chains(ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::U32> a, ffi::Buffer<ffi::U32> b,
                  ffi::Buffer<ffi::S32> a_exp, ffi::Buffer<ffi::S32> b_exp, ffi::Buffer<ffi::U32> c,
                  ffi::ResultBuffer<ffi::U32> out, int64_t chain_k, int64_t block, int64_t F, int64_t group,
                  int64_t safe, int64_t ab_shift, int64_t zero_policy, int64_t zero_exp, int64_t has_min_exp,
                  int64_t min_exp, int64_t mode, int64_t p, int64_t subnormals, int64_t overflow_ieee,
                  int64_t flush_c, int64_t a_format, int64_t b_format, int64_t has_c, int64_t has_a_exp,
                  int64_t has_b_exp, int64_t threads) {
  auto ad = a.dimensions(), bd = b.dimensions();
  if (ad.size() < 2 || bd.size() < 2 || ad[ad.size() - 1] != bd[bd.size() - 2])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: A (..., M, K) and B (..., K, N) expected");
  if (out->element_count() == 0) return ffi::Error::Success();
  // formats packed as eb | fb << 8 | shift << 16 | has_inf << 24 | has_nan << 25
  auto fmt = [](int64_t x) {
    return Fmt{(int32_t)(x & 255), (int32_t)((x >> 8) & 255), (int32_t)((x >> 16) & 255), ((x >> 24) & 1) != 0,
               ((x >> 25) & 1) != 0};
  };
  Params P{ad[ad.size() - 2], bd[bd.size() - 1], ad[ad.size() - 1], chain_k, block, F, group, safe != 0,
           (int32_t)ab_shift, zero_policy != 0, (int32_t)zero_exp, has_min_exp != 0, (int32_t)min_exp, (int)mode,
           (int)p, subnormals != 0, overflow_ieee != 0, flush_c != 0, fmt(a_format), fmt(b_format)};
  if (P.M < 1 || P.N < 1 || P.chain_k <= 0 || P.K % P.chain_k || P.block <= 0 || P.chain_k % P.block ||
      P.group <= 0 || P.F > 29)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: K % chain_k and chain_k % block must be 0, F <= 29");
  const int64_t C = P.K / P.chain_k, MK = P.M * P.K, KN = P.K * P.N, MN = P.M * P.N;
  const int64_t batch = (int64_t)out->element_count() / (C * MN);
  const Strides S{batch_stride(lens.element_count(), C, batch), batch_stride(a.element_count(), MK, batch),
                  batch_stride(b.element_count(), KN, batch), batch_stride(c.element_count(), MN, batch)};
  const bool has_ae = has_a_exp != 0, has_be = has_b_exp != 0;
  if (S.lens < 0 || S.a < 0 || S.b < 0 || (has_c != 0 && S.c < 0) || (has_ae && a_exp.element_count() != a.element_count()) ||
      (has_be && b_exp.element_count() != b.element_count()))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: one length per chain, operands and C per batch entry or shared");
  const int64_t strips = (P.N + W - 1) / W, units = batch * strips;
  int64_t T = threads < 1 ? 1 : threads;
  if (batch * MN * P.K < kThreadsFrom) T = 1;  // small calls: threads cost more than they save
  if (T > units) T = units;
  const Operands O{lens.typed_data(), a.typed_data(), b.typed_data(), has_c != 0 ? c.typed_data() : nullptr,
                   has_ae ? a_exp.typed_data() : nullptr, has_be ? b_exp.typed_data() : nullptr};
  uint32_t* o = out->typed_data();
  // one entry of A for the whole batch (a GEMM): decoded once, read by every thread
  const int64_t Mp = (P.M + R - 1) / R * R;
  std::vector<float> va(S.a == batch && T > 1 ? Mp * P.K : 0);
  std::vector<int32_t> ea(va.size());
  if (!va.empty()) decode_a(P, O.a, O.a_exp, va.data(), ea.data());
  const float* vs = va.empty() ? nullptr : va.data();
  const int32_t* es = va.empty() ? nullptr : ea.data();
  if (T == 1) {
    worker(P, S, O, vs, es, strips, o, 0, units);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < T; t++)
      pool.emplace_back(worker, std::cref(P), std::cref(S), std::cref(O), vs, es, strips, o, units * t / T,
                        units * (t + 1) / T);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_blockfma_chains, Chains,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()
                                  .Attr<int64_t>("chain_k")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("F")
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("safe")
                                  .Attr<int64_t>("ab_shift")
                                  .Attr<int64_t>("zero_policy")
                                  .Attr<int64_t>("zero_exp")
                                  .Attr<int64_t>("has_min_exp")
                                  .Attr<int64_t>("min_exp")
                                  .Attr<int64_t>("mode")
                                  .Attr<int64_t>("p")
                                  .Attr<int64_t>("subnormals")
                                  .Attr<int64_t>("overflow_ieee")
                                  .Attr<int64_t>("flush_c")
                                  .Attr<int64_t>("a_format")
                                  .Attr<int64_t>("b_format")
                                  .Attr<int64_t>("has_c")
                                  .Attr<int64_t>("has_a_exp")
                                  .Attr<int64_t>("has_b_exp")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_grouped_chains, Grouped,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()
                                  .Attr<int64_t>("chain_k")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("F")
                                  .Attr<int64_t>("zero_exp")
                                  .Attr<int64_t>("mode")
                                  .Attr<int64_t>("subnormals")
                                  .Attr<int64_t>("overflow_ieee")
                                  .Attr<int64_t>("flush_c")
                                  .Attr<int64_t>("threads"));
