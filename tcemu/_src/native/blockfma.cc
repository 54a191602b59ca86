// Chains of fused block FMAs on the CPU: the hot loop of tcemu's emulated GEMMs as an XLA FFI
// custom call. It computes, bit for bit, what tcemu/_src/numerics/engine.py computes for the
// models listed in tcemu/_src/native/__init__.py (supports): per output, per block of L products,
// the alignment exponent E (largest product or accumulator exponent), every product truncated
// toward zero F bits below E, an exact integer sum with the aligned accumulator (int32 groups as
// the engine's _group_sums, added as two words when one int32 word cannot hold the block), and one
// rounding (rounding.round_pack32); outputs whose block has a NaN/inf operand or accumulator take
// the engine's special-value path (NaN, or an infinity).
//
// Operands: A values va (M, K) float32, exponents ea and classes ca (M, K) int32; B the same, (K, N).
// The kernel packs A by panels of R rows and each thread B by strips of W columns.
// "safe" mode: va/vb are the exact element values (their products are exact float32 numbers far
// from the range limits), so a term is trunc(va * vb * 2**(F - E)). Otherwise va/vb are the
// signed integer significands (at most 12 bits) and a term is trunc(va * vb * 2**(ea + eb - fab -
// fbb + F - E)); the scale is clamped at 2**-126, where every term truncates to 0 anyway.
// Exponents carry engine._prepare's sentinels: zero operands -2**18, NaN/inf +2**20.
// Output (K / chain_k, M, N) uint32: per chain of chain_k elements of K, the accumulator bits after
// its first lens[chain] elements (whole blocks; the rest is padding that does not run), from +0.
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
constexpr int32_t kSpecialAbove = 1 << 19;  // engine._SPECIAL_ABOVE
constexpr int32_t kZeroBelow = -(1 << 17);  // engine._ZERO_BELOW

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
  bool subnormals, overflow_ieee, flush_c;
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

// The special-value path of engine._fused for one output: NaN if a product is NaN (a NaN factor, or
// inf * 0), the accumulator is NaN, or infinities of both signs meet; else the infinity's sign.
// Classes: bit 0 zero significand, bit 1 infinity, bit 2 NaN, bit 3 sign.
__attribute__((noinline)) uint32_t special_value(const int32_t* ca, const int32_t* cs, int64_t k0, int64_t L, uint32_t c) {
  bool pos = false, neg = false, nan = false;
  for (int64_t k = k0; k < k0 + L; k++) {
    const int32_t a = ca[k], b = cs[k * W];
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

// Rare: lanes with a NaN/inf operand or accumulator take special_value (out of the hot loop).
__attribute__((noinline)) vu specials(vu bits, vi special, vu c, const int32_t* cls_a, const int32_t* cls_b,
                                      int64_t k0, int64_t L) {
  for (int j = 0; j < W; j++)
    if (special[j]) bits[j] = special_value(cls_a, cls_b + j, k0, L, c[j]);
  return bits;
}

template <bool Safe, int Mode, bool Wide>
void strip(const Params& P, const int32_t* lens, const float* va, const int32_t* ea, const int32_t* cls_a,
           const float* bs, const int32_t* es, const int32_t* cls_b, int64_t m0, int64_t n0, uint32_t* out) {
  const int64_t K = P.K, N = P.N, M = P.M, L = P.block;
  const float* pa = va + m0 * K;  // the rows' panel, packed (K, R)
  const int32_t* pe = ea + m0 * K;
  const int F = (int)P.F;
  const int32_t split_bias = (int32_t)(F + 127) - P.ab_shift;
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    vu acc[R];
    for (int r = 0; r < R; r++) acc[r] = splatu(0);
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
          vi t = e + pe[k * R + r];
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
            S[r] += __builtin_convertvector((b * pa[k * R + r]) * scale[r], vi);
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
            vi x = vmax(e + (pe[k * R + r] + base[r]), splat(1));
            vu u = (vu)x << 23u;
            vf s;
            std::memcpy(&s, &u, sizeof u);
            S[r] += __builtin_convertvector((b * pa[k * R + r]) * s, vi);
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
        acc[r] = any(special) ? specials(bits, special, acc[r], cls_a + (m0 + r) * K, cls_b, k0, L) : bits;
      }
    }
    const int64_t chain = c0 / P.chain_k;
    for (int r = 0; r < R; r++) {
      if (m0 + r < M) std::memcpy(out + (chain * M + m0 + r) * N + n0, &acc[r], sizeof acc[r]);
    }
  }
}

template <bool Safe, bool Wide>
auto pick(int mode) {
  return mode == 0 ? strip<Safe, 0, Wide> : mode == 1 ? strip<Safe, 1, Wide> : mode == 2 ? strip<Safe, 2, Wide>
         : mode == 3 ? strip<Safe, 3, Wide> : strip<Safe, 4, Wide>;
}

void worker(const Params& P, const int32_t* lens, const float* va, const int32_t* ea, const int32_t* ca,
            const float* vb, const int32_t* eb, const int32_t* cb, uint32_t* out, int64_t s_begin,
            int64_t s_end) {
  const int64_t K = P.K, N = P.N;
  const bool wide = P.group < P.block || P.block * (int64_t(1) << (P.F + 2)) + (int64_t(1) << (P.F + 1)) >
                                             (int64_t(1) << 32);
  auto run = P.safe ? (wide ? pick<true, true>(P.mode) : pick<true, false>(P.mode))
                    : (wide ? pick<false, true>(P.mode) : pick<false, false>(P.mode));
  std::vector<float> bs(K * W);
  std::vector<int32_t> es(K * W), cs(K * W);
  for (int64_t s = s_begin; s < s_end; s++) {
    const int64_t n0 = s * W;
    for (int64_t k = 0; k < K; k++) {
      std::memcpy(&bs[k * W], vb + k * N + n0, W * sizeof(float));
      std::memcpy(&es[k * W], eb + k * N + n0, W * sizeof(int32_t));
      std::memcpy(&cs[k * W], cb + k * N + n0, W * sizeof(int32_t));
    }
    for (int64_t m0 = 0; m0 < P.M; m0 += R)
      run(P, lens, va, ea, ca, bs.data(), es.data(), cs.data(), m0, n0, out);
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

ffi::Error Chains(ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::F32> va, ffi::Buffer<ffi::S32> ea,
                  ffi::Buffer<ffi::S32> ca, ffi::Buffer<ffi::F32> vb, ffi::Buffer<ffi::S32> eb,
                  ffi::Buffer<ffi::S32> cb, ffi::ResultBuffer<ffi::U32> out, int64_t chain_k, int64_t block,
                  int64_t F, int64_t group, int64_t safe, int64_t ab_shift, int64_t zero_policy, int64_t zero_exp,
                  int64_t has_min_exp, int64_t min_exp, int64_t mode, int64_t p, int64_t subnormals,
                  int64_t overflow_ieee, int64_t flush_c, int64_t threads) {
  auto ad = va.dimensions(), bd = vb.dimensions();
  if (ad.size() != 2 || bd.size() != 2 || ad[1] != bd[0])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: A (M, K) and B (K, N) expected");
  Params P{ad[0], bd[1], ad[1], chain_k, block, F, group, safe != 0, (int32_t)ab_shift, zero_policy != 0,
           (int32_t)zero_exp, has_min_exp != 0, (int32_t)min_exp, (int)mode, (int)p, subnormals != 0,
           overflow_ieee != 0, flush_c != 0};
  if (P.M % R || P.N % W || P.chain_k <= 0 || P.K % P.chain_k || P.block <= 0 || P.chain_k % P.block ||
      P.group <= 0 || P.F > 29 || lens.element_count() != (size_t)(P.K / P.chain_k))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: M % 4, N % 16, K % chain_k and chain_k % block must be 0, "
                      "one length per chain, F <= 29");
  const int64_t strips = P.N / W;
  int64_t T = threads < 1 ? 1 : threads;
  if (P.M * P.N * P.K < kThreadsFrom) T = 1;  // small calls: threads cost more than they save
  if (T > strips) T = strips;
  const int32_t* l = lens.typed_data();
  // A packed by panels of R rows, (M / R, K, R): each panel's reads are contiguous
  std::vector<float> apack(P.M * P.K);
  std::vector<int32_t> epack(P.M * P.K);
  for (int64_t m = 0; m < P.M; m++)
    for (int64_t k = 0; k < P.K; k++) {
      const int64_t at = ((m / R) * P.K + k) * R + m % R;
      apack[at] = va.typed_data()[m * P.K + k];
      epack[at] = ea.typed_data()[m * P.K + k];
    }
  const float* a = apack.data();
  const int32_t* e = epack.data();
  const float* b = vb.typed_data();
  const int32_t* f = eb.typed_data();
  const int32_t* x = ca.typed_data();
  const int32_t* y = cb.typed_data();
  uint32_t* o = out->typed_data();
  if (T == 1) {
    worker(P, l, a, e, x, b, f, y, o, 0, strips);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < T; t++)
      pool.emplace_back(worker, std::cref(P), l, a, e, x, b, f, y, o, strips * t / T, strips * (t + 1) / T);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_blockfma_chains, Chains,
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
