// Chains of fused block FMAs on NVIDIA GPUs: blockfma.cc's custom call (same operands, attributes
// and bits) for XLA's CUDA backend. Each thread owns a TM x TN tile of outputs (a block of 16 x 16
// threads shares the decoded operand rows of up to 32 products through shared memory) and runs
// every chain of its tile as blockfma.cc does for one lane: per block of L products the alignment exponent E,
// every product truncated toward zero F bits below E (exact float32 products of exact element
// values, scaled by 2**(F - E) and converted with truncation; or, for bf16 / tf32 / scaled blocks
// whose terms a float32 cannot hold exactly, signed significands times a per-product power of
// two), an exact integer sum with the aligned accumulator, and one rounding: a conversion of the
// sum to float32 in the model's direction where that is exact (the fast finish), else
// rounding.round_pack32 in integers. NaN/inf operands and accumulators take the engine's
// special-value path. A first kernel decodes the operands (A transposed to (K, M), B as (K, N),
// rows and columns padded to multiples of 4 with zeros) into scratch memory: a second result of the
// call, of (2 or, hybrid, 3) * K * (entries of A * Mp + entries of B * Np) + 4 32-bit words
// (native.chains sizes it the same way; the handler checks). A second custom call,
// tcemu_grouped_chains, runs the grouped block-scaled fp4 model (below).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include "blockfma.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Outputs per thread (TM rows x TN columns), the blocks of 256 threads an SM should hold (the
// register budget: 48 registers at 5 for chains_kernel with blocks of up to 16 products, 64 at 4 for
// longer blocks and for grouped_kernel), the unrolling of the product loops and the rows of a stage
// of chains_kernel's shared tiles: tuned on an H100 (benchmarks/RESULTS.md).
#ifndef TCEMU_TM
#define TCEMU_TM 4
#endif
#ifndef TCEMU_TN
#define TCEMU_TN 2
#endif
#define TCEMU_STR(x) #x
#define TCEMU_PRAGMA_(x) _Pragma(TCEMU_STR(x))
#define TCEMU_PRAGMA(x) TCEMU_PRAGMA_(x)
#ifndef TCEMU_UNROLL
#define TCEMU_UNROLL 4
#endif
#ifndef TCEMU_MINB
#define TCEMU_MINB 5
#endif
#ifndef TCEMU_MINB_GROUPED
#define TCEMU_MINB_GROUPED 4
#endif
#ifndef TCEMU_STAGE
#define TCEMU_STAGE 16
#endif

namespace {

using namespace tcemu;

struct Params {
  int64_t M, N, K, chain_k, block, F, Mp, Np, group;
  int kind;
  int64_t sblock;
  int32_t ab_shift;
  bool zero_policy;
  int32_t zero_exp;
  bool has_min_exp;
  int32_t min_exp;
  int mode, p;
  bool subnormals, overflow_ieee, flush_c;
  Fmt fa, fb;
  int64_t div_lens, div_a, div_b, div_c;  // batch entries per operand entry (blockfma.cc Strides)
  bool has_c, has_ae, has_be;
  int64_t batch;
};

struct Ptrs {
  const int32_t* lens;
  const uint32_t *a, *b, *c;       // bits: A (.., M, K), B (.., K, N), C (.., M, N) or null
  const float *va, *vb, *sa, *sb;  // decoded: values, signed significands (A as (K, Mp), B (K, Np))
  const int32_t *ea, *eb;          // exponents with sentinels
  const int* inexact;              // some value a float32 cannot hold exactly: split terms only
  uint32_t* out;                   // (batch, K / chain_k, M, N)
};

__device__ __forceinline__ int32_t clampi(int32_t x, int32_t lo, int32_t hi) { return min(max(x, lo), hi); }
// x >> n and x << n for 0 <= n (negative n: 0), giving 0 from n >= 32 (rounding.shr/shl)
__device__ __forceinline__ uint32_t shr(uint32_t x, int32_t n) { return n >= 32 ? 0u : x >> clampi(n, 0, 31); }
__device__ __forceinline__ uint32_t shl(uint32_t x, int32_t n) { return n >= 32 ? 0u : x << clampi(n, 0, 31); }
__device__ __forceinline__ float pow2f(int32_t biased) { return __int_as_float(biased << 23); }

// fused_block.prepare_operand of one element (blockfma.cc decode): value, signed significand, exponent with
// sentinels; returns whether a float32 cannot hold its value exactly.
__device__ bool decode(uint32_t bits, const Fmt& f, bool flush, int32_t add, float& v, float& sg, int32_t& e) {
  const uint32_t u = bits >> f.shift;
  int32_t frac = (int32_t)(u & ((1u << f.fb) - 1u));
  const int32_t ef = (int32_t)((u >> f.fb) & ((1u << f.eb) - 1u));
  const bool neg = (u >> (f.fb + f.eb)) & 1u;
  const int32_t top = (1 << f.eb) - 1, bias = (1 << (f.eb - 1)) - 1;
  bool special = false;
  if (f.has_nan) special = f.has_inf ? (ef == top) : (ef == top && frac == (1 << f.fb) - 1);
  const bool normal = ef != 0;
  if (flush && !normal) frac = 0;
  const int32_t sig = normal ? (frac | (1 << f.fb)) : frac;
  const int32_t exp0 = normal ? ef - bias : 1 - bias, exp = exp0 + add;
  sg = (float)(neg ? -sig : sig);
  const int32_t x = clampi(exp - f.fb, -149, 127), h = x >> 1;
  const bool zero = sig == 0;
  v = zero ? 0.0f : __fmul_rn(__fmul_rn(sg, pow2f(h + 127)), pow2f(x - h + 127));
  e = (zero ? kZeroSentinel : special ? kBig : exp0) + add;
  return !(zero || special) && (exp - f.fb < -149 || exp > 127);
}

// Decode `count` entries of an operand of R rows x C columns (row-major bits) into (R?, ...):
// transpose: out[(entry, c, r)] with r padded to Rp (A: (K, Mp)); else out[(entry, r, c)] with c
// padded to Cp (B: (K, Np)). Padding decodes as zero.
__global__ void decode_kernel(const uint32_t* bits, const int32_t* add, Fmt f, bool flush, int64_t count, int64_t R,
                              int64_t C, int64_t Rp, int64_t Cp, bool transpose, int64_t sblock,
                              float* v, float* sg, int32_t* e, int* inexact) {
  const int64_t per = transpose ? C * Rp : R * Cp;
  const int64_t total = count * per;
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t entry = i / per, j = i % per;
    int64_t r, c;
    if (transpose) {
      c = j / Rp;
      r = j % Rp;
    } else {
      r = j / Cp;
      c = j % Cp;
    }
    float fv = 0.0f, fs = 0.0f;
    int32_t fe = kZeroSentinel;
    if (r < R && c < C) {
      int32_t ad = 0;
      if (add) {  // per element, or per block of sblock along K (A: columns, B: rows)
        if (!sblock) {
          ad = add[entry * R * C + r * C + c];
        } else if (transpose) {  // A: blocks along its columns (K)
          ad = add[entry * R * (C / sblock) + r * (C / sblock) + c / sblock];
        } else {
          ad = add[entry * (R / sblock) * C + (r / sblock) * C + c];
        }
      }
      bad |= decode(bits[entry * R * C + r * C + c], f, flush, ad, fv, fs, fe);
    }
    v[i] = fv;
    if (sg) sg[i] = fs;
    e[i] = fe;
  }
  if (bad) atomicOr(inexact, 1);
}

// rounding.round_pack32 + _finish (blockfma.cc round_pack, general path) for one value:
// (-1)**neg * m * 2**q rounded to the accumulator format (p fraction bits, binary32 range).
__device__ __noinline__ uint32_t round_pack(bool neg, uint32_t m, int32_t q, const Params& P) {
  const int p = P.p, mode = P.mode;
  const int32_t lz = __clz(m);
  const uint32_t top = lz >= 32 ? 0u : m << lz;
  int32_t x = max(q + 31 - lz, -126);
  const int32_t r = x - p - q + lz;  // bits of top below the kept ones
  const uint32_t rbit = shr(top, r - 1) & 1u;
  const bool sticky = (top & (shl(1u, r - 1) - 1u)) != 0;
  uint32_t n = shr(top, r);
  bool inc;
  switch (mode) {
    case 0: inc = false; break;
    case 1: inc = rbit && (sticky || (n & 1u)); break;
    case 2: inc = rbit != 0; break;
    case 3: inc = (rbit || sticky) && !neg; break;
    default: inc = (rbit || sticky) && neg; break;
  }
  n += inc ? 1u : 0u;
  if (n >> (p + 1)) {
    n >>= 1;
    x += 1;
  }
  const bool normal = (n >> p) != 0;
  const uint32_t biased = normal ? (uint32_t)(x + 127) : 0u;
  uint32_t frac = n & ((1u << p) - 1u);
  if (!P.subnormals && !normal) frac = 0;
  const uint32_t sbit = neg ? (1u << (8 + p)) : 0u;
  uint32_t body = sbit | (biased << p) | frac;
  if (x > 127 && m != 0) {
    const uint32_t inf = sbit | (255u << p);
    uint32_t big = inf;
    if (P.overflow_ieee) {
      const uint32_t maxf = sbit | ((254u << p) | ((1u << p) - 1u));
      const bool to_inf = mode == 0 ? false : mode == 3 ? !neg : mode == 4 ? neg : true;
      big = to_inf ? inf : maxf;
    }
    body = big;
  }
  const uint32_t bits = body << (23 - p);
  return bits == 0x80000000u ? 0u : bits;
}

__device__ __forceinline__ int32_t acc_exponent(uint32_t acc, bool flush, int32_t zero_exp) {
  const int32_t ce = (acc >> 23) & 255;
  const bool nz = flush ? ce != 0 : (acc & 0x7FFFFFFFu) != 0;
  return nz ? max(ce, 1) - 127 : zero_exp;
}

// The exact sum S (|S| < 2**62 / 2) of a block's aligned terms with the finite accumulator's term
// trunc(c * 2**(F - E)), rounded (rounding.round_pack32).
__device__ uint32_t round_sum(const Params& P, int64_t S, int32_t E, uint32_t acc) {
  const int F = (int)P.F;
  const int32_t ce = (acc >> 23) & 255, frac = acc & 0x7FFFFF;
  int64_t csig = ce != 0 ? (frac | 0x800000) : frac;
  if (P.flush_c && ce == 0) csig = 0;
  const int32_t cexp = ce != 0 ? ce - 127 : -126;
  const int64_t cs = F >= 23 ? csig << (F - 23) : csig;
  const int32_t sh = clampi(E - cexp + (F >= 23 ? 0 : 23 - F), 0, 63);
  int64_t tc = cs >> sh;
  if ((int32_t)acc < 0) tc = -tc;
  const int64_t s = S + tc;
  const bool neg = s < 0;
  const uint64_t mag = neg ? (uint64_t)(-s) : (uint64_t)s;
  const int32_t bits = 64 - __clzll((long long)mag);
  const int32_t sh2 = max(bits - 32, 0);
  const uint32_t m32 = (uint32_t)(mag >> sh2) | (uint32_t)((mag & ((uint64_t(1) << sh2) - 1)) != 0);
  return round_pack(neg, m32, E - F + sh2, P);
}

// The exact finish of one output's block (blockfma.cc finish): the block's sum S with the aligned
// accumulator, rounded; NaN/inf operands or accumulator: the special-value path.
__device__ __noinline__ uint32_t finish(const Params& P, int64_t S, int32_t E, uint32_t acc, const uint32_t* arow,
                                        const uint32_t* bcol, int64_t k0) {
  if (E > kSpecialAbove || ((acc >> 23) & 255) == 255)
    return special_value(arow, bcol, P.N, P.fa, P.fb, k0, P.block, acc);
  return round_sum(P, S, E, acc);
}

// n consecutive elements (n = 4: one 16-byte load; the rows are padded and aligned)
template <int n, typename T>
__device__ __forceinline__ void load(const T* p, T* x) {
  if constexpr (n == 4) {
    typedef typename std::conditional<std::is_same<T, float>::value, float4, int4>::type V;
    const V v = *reinterpret_cast<const V*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < n; i++) x[i] = p[i];
  }
}

constexpr int kLmax = 32;  // the longest block the shared tiles hold

// The alignment exponent of output (m, n) of the block at k0 (rows kk of the shared tiles):
// the accumulator's exponent and the largest product exponent sum, zero products with zero_exp,
// at least min_exp. Out of the hot loop: the exact finish and the significand terms use it.
template <int BM, int BN>
__device__ __noinline__ int32_t block_exponent(const Params& P, const int32_t (*sea)[BM], const int32_t (*seb)[BN],
                                               int L, int i, int j, uint32_t acc) {
  int32_t E = acc_exponent(acc, P.flush_c, P.zero_exp);
  bool zero = false;
  for (int kk = 0; kk < L; kk++) {
    const int32_t t = sea[kk][i] + seb[kk][j];
    E = max(E, t);
    zero |= t < kZeroBelow;
  }
  if (P.zero_policy && zero) E = max(E, P.zero_exp);
  if (P.has_min_exp) E = max(E, P.min_exp);
  return E;
}

// One array of a tile copy: 4-byte words of a (.., Xp) array (src: at the tile's first column), the
// shared tile, and the bits that fill it beyond column Xp.
template <int W>
struct Part {
  const int32_t* src;
  int32_t (*dst)[W];
  int32_t fill;
};

template <int W, typename T>
__device__ __forceinline__ Part<W> part(const T* src, T (*dst)[W], int32_t fill) {
  static_assert(sizeof(T) == 4, "4-byte words");
  return Part<W>{reinterpret_cast<const int32_t*>(src), reinterpret_cast<int32_t(*)[W]>(dst), fill};
}

// rows x W words of every part from row r0 (columns from x0) into their shared tiles, in 16-byte
// pieces, the parts in one loop. Async: the pieces inside the array as asynchronous copies
// (cp.async from sm_80; the caller commits and waits for them), the fill stored at once.
template <int W, bool Async = false, typename... Parts>
__device__ __forceinline__ void copy_rows(int64_t Xp, int64_t x0, int64_t r0, int rows, int tid, Parts... parts) {
  for (int q = tid; q < rows * (W / 4); q += 256) {
    const int r = q / (W / 4), c = 4 * (q % (W / 4));
    const bool in = x0 + c < Xp;
    const int64_t o = (r0 + r) * Xp + c;
    auto copy = [&](const Part<W>& p) {
      int4* d = reinterpret_cast<int4*>(&p.dst[r][c]);
      if (Async && in)
        __pipeline_memcpy_async(d, p.src + o, 16);
      else
        *d = in ? __ldg(reinterpret_cast<const int4*>(p.src + o)) : int4{p.fill, p.fill, p.fill, p.fill};
    };
    (copy(parts), ...);
  }
}

// The exact sum of one output's block from signed significands (sa: A's column of the block, stride
// Mp; sb: B's row, stride Np): trunc(sa * sb * 2**(ea + eb - fab - fbb + F - E)) per product, the
// scale clamped at 2**-126 where every term truncates to 0 anyway (blockfma.cc terms_split). Out of
// the kernel's registers: the hybrid kernels read it for blocks whose terms a float32 cannot hold.
template <int BM, int BN>
__device__ __noinline__ long long split_sum(const Params& P, const int32_t (*sea)[BM], const int32_t (*seb)[BN], int L,
                                            int i, int j, uint32_t acc, const float* sa, const float* sb) {
  const int32_t e = block_exponent<BM, BN>(P, sea, seb, L, i, j, acc);
  const int32_t bias = (int32_t)(P.F + 127) - P.ab_shift - e;
  long long t = 0;
  for (int kk = 0; kk < L; kk++) {
    const int32_t x = max(seb[kk][j] + sea[kk][i] + bias, 1);
    t += __float2int_rz(__fmul_rn(__fmul_rn(sb[kk * P.Np], sa[kk * P.Mp]), pow2f(min(x, 254))));
  }
  return t;
}

// A thread's TM x TN outputs from (m0, n0) into an M x N output (those inside it).
template <int TM, int TN>
__device__ __forceinline__ void store_tile(uint32_t* out, const uint32_t (&acc)[TM][TN], int64_t m0, int64_t n0,
                                           int64_t M, int64_t N) {
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) {
      const int64_t m = m0 + i, n = n0 + j;
      if (m < M && n < N) out[m * N + n] = acc[i][j];
    }
}

// How a block's terms are summed (|term| < 2**(F + 2)): kOne, one int32 word that the accumulator's
// term cannot wrap; kWrap, one int32 word that it may wrap (then the exact finish); kGroups, int32
// sums of P.group terms (at most 2**31 / 2**(F + 2)) added in int64.
enum Sums { kOne = 0, kWrap = 1, kGroups = 2 };

// The rows of products in each of chains_kernel's two stages of shared tiles (the threads compute on
// one while the next is copied into the other): TCEMU_STAGE for blocks of up to that many products
// (16: 24 KiB with 4 x 2 outputs per thread, so that TCEMU_MINB blocks of threads fit an SM), else
// kLmax (48 KiB: 4 blocks).
__host__ __device__ constexpr int stage_rows(int Lc) { return Lc && Lc <= TCEMU_STAGE ? TCEMU_STAGE : kLmax; }
static_assert(TCEMU_STAGE >= 1 && TCEMU_STAGE <= kLmax, "TCEMU_STAGE: 1 to kLmax rows");

// One block of 16 x 16 threads: output rows [bm0, bm0 + 16 TM) and columns [bn0, bn0 + 16 TN) of
// every batch entry from blockIdx.z, every chain; thread (x, y) owns rows bm0 + y TM .. and columns
// bn0 + x TN ... The threads copy the decoded rows of up to stage_rows(Lc) products (whole blocks of
// L) of their tile to shared memory at a time, the next ones while they compute. Per output the
// registers hold the accumulator, the scale 2**(F - E) (E - F and the range checks follow from its
// exponent field) and the block's sum.
// Lc: the block length (0: P.block, at most kLmax); How: Kind; Sum: Sums; Simple: the usual models
// (a zero accumulator's exponent -126, so every accumulator's is max(e, -126), and zero products
// never raise E; no flushed accumulator; no minimum exponent; a binary32 accumulator).
template <int TM, int TN, int Lc, int How, int Sum, bool Simple>
__global__ void __launch_bounds__(256, stage_rows(Lc) < kLmax ? TCEMU_MINB : 4)
    chains_kernel(Params P, Ptrs X) {
  typedef typename std::conditional<Sum == kGroups, long long, int32_t>::type Total;
  constexpr int BM = 16 * TM, BN = 16 * TN, S = stage_rows(Lc);
  __shared__ __align__(16) float s_va[2 * S][BM];  // stage s: rows s S ..
  __shared__ __align__(16) int32_t s_ea[2 * S][BM];
  __shared__ __align__(16) float s_vb[2 * S][BN];
  __shared__ __align__(16) int32_t s_eb[2 * S][BN];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int64_t bm0 = (int64_t)blockIdx.y * BM, bn0 = (int64_t)blockIdx.x * BN;
  const int64_t m0 = bm0 + ty * TM, n0 = bn0 + tx * TN;
  const int64_t K = P.K, M = P.M, N = P.N, Mp = P.Mp, Np = P.Np;
  const int L = Lc ? Lc : (int)P.block, KT = S / L * L, G = (int)P.group;
  const int F = (int)P.F;
  const int32_t keep = ~((1 << (23 - P.p)) - 1);
  const bool fast = (P.p == 23 ? P.mode != 2 : P.mode == 0) && L * (int64_t(1) << (F + 2)) <= (int64_t(1) << 40);
  // the model's fields the blocks read, in registers (P itself lives in local memory: the exact
  // finish takes its address)
  const bool flush_c = P.flush_c, zero_policy = P.zero_policy, has_min_exp = P.has_min_exp;
  const int32_t zero_exp = P.zero_exp, min_exp = P.min_exp;
  const int mode = P.mode;
  for (int64_t bt = blockIdx.z; bt < P.batch; bt += gridDim.z) {
    const int64_t ia = bt / P.div_a, ib = bt / P.div_b;
    const float* va = X.va + ia * K * Mp + bm0;
    const float* vb = X.vb + ib * K * Np + bn0;
    const int32_t* ea = X.ea + ia * K * Mp + bm0;
    const int32_t* eb = X.eb + ib * K * Np + bn0;
    const uint32_t* abits = X.a + ia * M * K;
    const uint32_t* bbits = X.b + ib * K * N;
    const int32_t* lens = X.lens + (bt / P.div_lens) * (K / P.chain_k);
    const uint32_t* cbits = P.has_c ? X.c + (bt / P.div_c) * M * N : nullptr;
    const bool split_all = How == kHybrid && *X.inexact != 0;
    for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
      uint32_t acc[TM][TN];
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
          const int64_t m = m0 + i, n = n0 + j;
          acc[i][j] = (cbits && m < M && n < N) ? cbits[m * N + n] : 0u;
        }
      const int64_t end = c0 + lens[c0 / P.chain_k];
      // the rows of the tile from product t0: whole blocks, at most KT, up to the chain's end
      auto tile_rows = [&](int64_t t0) { return (int)min((int64_t)KT, (end - t0 + L - 1) / L * L); };
      // the tile's rows into stage st
      auto fetch = [&](int64_t t0, int st) {
        const int rows = tile_rows(t0), r = st * S;
        copy_rows<BM, true>(Mp, bm0, t0, rows, tid, part(va, s_va + r, 0), part(ea, s_ea + r, kZeroSentinel));
        copy_rows<BN, true>(Np, bn0, t0, rows, tid, part(vb, s_vb + r, 0), part(eb, s_eb + r, kZeroSentinel));
        __pipeline_commit();
      };
      // the tile of rows t0 .. in stage st (shared rows st S ..): the next tile's copy into the other
      // stage started, then this tile's blocks
      auto tile = [&](auto st, int64_t t0) {
        constexpr int r0 = decltype(st)::value * S;
        const int rows = tile_rows(t0);
        __pipeline_wait_prior(0);
        __syncthreads();  // the tile is copied; the other stage is read (the previous tile)
        if (t0 + KT < end) fetch(t0 + KT, 1 - decltype(st)::value);
        for (int kb = r0; kb < r0 + rows; kb += L) {  // the blocks of products k0 .. k0 + L: rows kb ..
          const int64_t k0 = t0 + kb - r0;
          int32_t E[TM][TN];  // the alignment exponents
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
              E[i][j] = Simple ? max((int32_t)((acc[i][j] >> 23) & 255) - 127, -126)
                               : acc_exponent(acc[i][j], flush_c, zero_exp);
          TCEMU_PRAGMA(unroll TCEMU_UNROLL)
          for (int kk = kb; kk < kb + L; kk++) {
            int32_t a[TM], b[TN];
            load<TM>(&s_ea[kk][ty * TM], a);
            load<TN>(&s_eb[kk][tx * TN], b);
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) E[i][j] = max(E[i][j], a[i] + b[j]);
          }
          if (!Simple) {
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) {
                if (zero_policy && E[i][j] < zero_exp)
                  E[i][j] = block_exponent<BM, BN>(P, s_ea + kb, s_eb + kb, L, ty * TM + i, tx * TN + j, acc[i][j]);
                if (has_min_exp) E[i][j] = max(E[i][j], min_exp);
              }
          }
          float scale[TM][TN];  // 2**(F - E)
          // S += trunc(a * b * 2**(F - E)) over tile rows [lo, hi)
          auto terms = [&](int lo, int hi, int32_t (&S)[TM][TN]) {
            TCEMU_PRAGMA(unroll TCEMU_UNROLL)
            for (int kk = lo; kk < hi; kk++) {
              float a[TM], b[TN];
              load<TM>(&s_va[kk][ty * TM], a);
              load<TN>(&s_vb[kk][tx * TN], b);
#pragma unroll
              for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) S[i][j] += __float2int_rz(__fmul_rn(__fmul_rn(b[j], a[i]), scale[i][j]));
            }
          };
          // T += the block's terms from exact values: in int32, or in int32 sums of P.group terms for kGroups
          auto value_sums = [&](Total (&T)[TM][TN]) {
            if constexpr (Sum == kGroups) {
              for (int g = kb; g < kb + L; g += G) {
                int32_t S[TM][TN] = {};
                terms(g, min(g + G, kb + L), S);
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                  for (int j = 0; j < TN; j++) T[i][j] += S[i][j];
              }
            } else {
              terms(kb, kb + L, T);
            }
          };
          // the model's int-to-float conversion (one switch per block) of an int32 (f32) or int64 (f64)
          auto by_mode = [&](auto body) {
            switch (mode) {
              case 0: return body([](int32_t x) { return __int2float_rz(x); }, [](long long x) { return __ll2float_rz(x); });
              case 1: return body([](int32_t x) { return __int2float_rn(x); }, [](long long x) { return __ll2float_rn(x); });
              case 3: return body([](int32_t x) { return __int2float_ru(x); }, [](long long x) { return __ll2float_ru(x); });
              default: return body([](int32_t x) { return __int2float_rd(x); }, [](long long x) { return __ll2float_rd(x); });
            }
          };
          // The fast finish's result: the block's sum with the accumulator's term (T, updated) converted
          // in the model's direction (its fraction bits beyond the accumulator's cleared), times 2**(E -
          // F) read off the scale. Where F - 126 <= E <= F + 96 and the sum did not wrap, this is exact:
          // a normal number (|s| <= 2**31) or +0.
          auto result = [&](auto to_f32, auto to_f64, const Total& s, float sc) {
            const float r = Sum == kGroups ? to_f64((long long)s) : to_f32((int32_t)s);
            const float rk = Simple ? r : __int_as_float(__float_as_int(r) & keep);
            return __float_as_uint(__fmul_rn(rk, __int_as_float((254 << 23) - __float_as_int(sc))));
          };
          // the accumulator's term trunc(c * 2**(F - E)) added to t (output i, j's block sum); returns
          // whether the int32 sum wrapped
          auto add_acc = [&](int i, int j, Total& t) {
            const uint32_t c = acc[i][j];
            const float cv = !Simple && flush_c && ((c >> 23) & 255) == 0 ? 0.0f : __uint_as_float(c);
            if (Sum == kGroups) {
              t += (long long)__float2ll_rz(__fmul_rn(cv, scale[i][j]));
              return false;
            }
            const int32_t tc = __float2int_rz(__fmul_rn(cv, scale[i][j]));  // |tc| < 2**(F + 1)
            const int32_t s = (int32_t)((uint32_t)t + (uint32_t)tc);
            const bool wrap = Sum == kWrap && ((t ^ s) & (tc ^ s)) < 0;
            t = s;
            return wrap;
          };
          // add_acc for every output of the thread; returns whether some int32 sum wrapped
          auto add_accs = [&](Total (&T)[TM][TN]) {
            bool wrapped = false;
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) wrapped |= add_acc(i, j, T[i][j]);
            return wrapped;
          };
          // The hot path, for blocks where the fast finish holds for every output of the thread (and
          // kHybrid reads exact values, F - 125 <= E): unclamped scales; the results are kept unless a
          // sum wrapped. Sums that cannot wrap start from the accumulator's term, so that the
          // accumulators are not live (registers) while the products are summed.
          int32_t lo = E[0][0], hi = E[0][0];
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) lo = min(lo, E[i][j]), hi = max(hi, E[i][j]);
          if (fast && !(How == kHybrid && split_all) && lo >= F - 126 + (How == kHybrid) && hi <= F + 96) {
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) scale[i][j] = pow2f(F + 127 - E[i][j]);
            Total T[TM][TN] = {};
            if (Sum != kWrap) add_accs(T);  // cannot wrap
            value_sums(T);
            if (!(Sum == kWrap && add_accs(T))) {
              by_mode([&](auto to_f32, auto to_f64) {
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                  for (int j = 0; j < TN; j++) acc[i][j] = result(to_f32, to_f64, T[i][j], scale[i][j]);
                return 0;
              });
              continue;
            }
          }
          // Any other block: scales clamped to float32's range, exact values or (kHybrid) significands
          // as the block allows, the fast finish where it holds, else the exact finish.
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) scale[i][j] = pow2f(clampi(F + 127 - E[i][j], 1, 254));
          Total T[TM][TN] = {};
          bool values = How == kSafe;
          if (How == kHybrid && !split_all) {  // every term exact in float32: F - 125 <= E <= 126
            values = true;
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) values &= (uint32_t)(E[i][j] - (F - 125)) <= (uint32_t)(251 - F);
          }
          if (values) {
            value_sums(T);
          } else {  // significands times a power of two per product
            const float* sa = X.sa + ia * K * Mp + m0 + k0 * Mp;
            const float* sb = X.sb + ib * K * Np + n0 + k0 * Np;
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++)
                T[i][j] = (Total)split_sum<BM, BN>(P, s_ea + kb, s_eb + kb, L, ty * TM + i, tx * TN + j, acc[i][j],
                                                   sa + i, sb + j);
          }
          // the fast finish where it holds (badmask: the outputs it does not hold for), else the exact finish
          uint32_t badmask = 0;
          by_mode([&](auto to_f32, auto to_f64) {
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) {
                Total s = T[i][j];
                const bool bad = add_acc(i, j, s) || !fast || (uint32_t)(E[i][j] - (F - 126)) > 222u;
                const uint32_t r = result(to_f32, to_f64, s, scale[i][j]);
                badmask |= (uint32_t)bad << (i * TN + j);
                acc[i][j] = bad ? acc[i][j] : r;
              }
            return 0;
          });
          if (badmask) {  // rare: the exact finish, one output at a time
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) {
                if (!((badmask >> (i * TN + j)) & 1u)) continue;
                const int32_t e = block_exponent<BM, BN>(P, s_ea + kb, s_eb + kb, L, ty * TM + i, tx * TN + j, acc[i][j]);
                const int64_t m = min(m0 + i, M - 1), n = min(n0 + j, N - 1);
                acc[i][j] = finish(P, (int64_t)T[i][j], e, acc[i][j], abits + m * K, bbits + n, k0);
              }
          }
        }
      };
      if (c0 < end) {
        __syncthreads();  // both stages are read (the previous chain)
        fetch(c0, 0);
      }
      for (int64_t t0 = c0; t0 < end; t0 += 2 * KT) {
        tile(std::integral_constant<int, 0>(), t0);
        if (t0 + KT < end) tile(std::integral_constant<int, 1>(), t0 + KT);
      }
      store_tile<TM, TN>(X.out + (bt * (K / P.chain_k) + c0 / P.chain_k) * M * N, acc, m0, n0, M, N);
    }
  }
}

typedef void (*KernelFn)(Params, Ptrs);

// Tiles of 4 x 2 outputs per thread, specialised on the block length; 1 x 1 (small GEMMs): generic.
template <int How, int Sum, bool Simple>
KernelFn pick_lengths(int64_t L) {
  constexpr int TM = TCEMU_TM, TN = TCEMU_TN;
  return L == 4 ? chains_kernel<TM, TN, 4, How, Sum, Simple> : L == 8 ? chains_kernel<TM, TN, 8, How, Sum, Simple>
         : L == 16 ? chains_kernel<TM, TN, 16, How, Sum, Simple> : chains_kernel<TM, TN, 32, How, Sum, Simple>;
}

// simple: the model is one of the usual ones (chains_kernel's Simple), which have kernels for the
// presets' block lengths and one-word sums
template <int How, int Sum>
KernelFn pick_sums(int64_t L, bool small, bool simple) {
  if (small) return chains_kernel<1, 1, 0, How, Sum, false>;
  if (L != 4 && L != 8 && L != 16 && L != 32) return chains_kernel<TCEMU_TM, TCEMU_TN, 0, How, Sum, false>;
  if constexpr (Sum != kGroups)
    if (simple) return pick_lengths<How, Sum, true>(L);
  return pick_lengths<How, Sum, false>(L);
}

template <int How>
KernelFn pick_how(int sum, int64_t L, bool small, bool simple) {
  return sum == kOne ? pick_sums<How, kOne>(L, small, simple) : sum == kWrap ? pick_sums<How, kWrap>(L, small, simple)
                                                                             : pick_sums<How, kGroups>(L, small, simple);
}

KernelFn pick(int kind, int sum, int64_t L, bool small, bool simple) {
  return kind == kSafe ? pick_how<kSafe>(sum, L, small, simple) : pick_how<kHybrid>(sum, L, small, simple);
}

ffi::Error Chains(cudaStream_t stream, ffi::Buffer<ffi::S32> lens,
                  ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b, ffi::Buffer<ffi::S32> a_exp,
                  ffi::Buffer<ffi::S32> b_exp, ffi::Buffer<ffi::F32> c, ffi::ResultBuffer<ffi::F32> out,
                  ffi::ResultBuffer<ffi::S32> scratch, int64_t chain_k, int64_t block, int64_t F, int64_t group, int64_t kind, int64_t ab_shift,
                  int64_t zero_policy, int64_t zero_exp, int64_t has_min_exp, int64_t min_exp, int64_t mode,
                  int64_t p, int64_t subnormals, int64_t overflow_ieee, int64_t flush_c, int64_t a_format,
                  int64_t b_format, int64_t has_c, int64_t has_a_exp, int64_t has_b_exp, int64_t scale_block,
                  int64_t threads, int64_t transposed) {
  if (transposed) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: transposed is CPU only");
  auto ad = a.dimensions(), bd = b.dimensions();
  if (ad.size() < 2 || bd.size() < 2 || ad[ad.size() - 1] != bd[bd.size() - 2])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: A (..., M, K) and B (..., K, N) expected");
  if (out->element_count() == 0) return ffi::Error::Success();
  Params P{};
  P.M = ad[ad.size() - 2];
  P.N = bd[bd.size() - 1];
  P.K = ad[ad.size() - 1];
  P.chain_k = chain_k;
  P.block = block;
  P.F = F;
  P.group = group;
  P.Mp = (P.M + 3) / 4 * 4;
  P.Np = (P.N + 3) / 4 * 4;
  P.kind = (int)kind;
  P.sblock = scale_block > 0 ? scale_block : 0;
  P.ab_shift = (int32_t)ab_shift;
  P.zero_policy = zero_policy != 0;
  P.zero_exp = (int32_t)zero_exp;
  P.has_min_exp = has_min_exp != 0;
  P.min_exp = (int32_t)min_exp;
  P.mode = (int)mode;
  P.p = (int)p;
  P.subnormals = subnormals != 0;
  P.overflow_ieee = overflow_ieee != 0;
  P.flush_c = flush_c != 0;
  P.fa = unpack_format(a_format);
  P.fb = unpack_format(b_format);
  P.has_c = has_c != 0;
  P.has_ae = has_a_exp != 0;
  P.has_be = has_b_exp != 0;
  if (P.M < 1 || P.N < 1 || P.chain_k <= 0 || P.K % P.chain_k || P.block <= 0 || P.block > kLmax ||
      P.chain_k % P.block || P.F < 0 || P.F > 29 || (P.kind != kSafe && P.kind != kHybrid) || P.group < 1 ||
      P.group > P.block || P.group * ((int64_t(1) << (P.F + 2)) - 1) > (int64_t(1) << 31) - 1)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: K % chain_k and chain_k % block must be 0, 0 <= F <= 29, kind safe or "
                      "hybrid, int32 sums of `group` terms");
  const int64_t C = P.K / P.chain_k, MK = P.M * P.K, KN = P.K * P.N, MN = P.M * P.N;
  const int64_t batch = (int64_t)out->element_count() / (C * MN);
  P.div_lens = batch_stride(lens.element_count(), C, batch);
  P.div_a = batch_stride(a.element_count(), MK, batch);
  P.div_b = batch_stride(b.element_count(), KN, batch);
  P.div_c = P.has_c ? batch_stride(c.element_count(), MN, batch) : 1;
  const int64_t per = P.sblock ? P.sblock : 1;
  if (P.div_lens < 0 || P.div_a < 0 || P.div_b < 0 || P.div_c < 0 || P.K % per ||
      (P.has_ae && a_exp.element_count() * per != a.element_count()) ||
      (P.has_be && b_exp.element_count() * per != b.element_count()))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "tcemu blockfma: one length per chain, operands and C per batch entry or shared");
  P.batch = batch;
  if (P.K * std::max(P.Mp, P.Np) >= (int64_t(1) << 31))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: K * M and K * N below 2**31");
  const int64_t na = batch / P.div_a, nb = batch / P.div_b;
  const bool hybrid = P.kind == kHybrid;
  const int64_t sa_n = na * P.K * P.Mp, sb_n = nb * P.K * P.Np;
  // scratch words: values and exponents (and significands: hybrid) of A and B, then one flag
  const int64_t need = (hybrid ? 3 : 2) * (sa_n + sb_n) + 4;
  if ((int64_t)scratch->element_count() < need)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu blockfma: scratch result too small");
  int32_t* w = scratch->typed_data();  // sa_n and sb_n are multiples of 4 words: 16-byte aligned parts
  float* va = reinterpret_cast<float*>(w);
  int32_t* ea = w + sa_n;
  float* vb = reinterpret_cast<float*>(w + 2 * sa_n);
  int32_t* eb = w + 2 * sa_n + sb_n;
  float* sa = hybrid ? reinterpret_cast<float*>(w + 2 * (sa_n + sb_n)) : nullptr;
  float* sb = hybrid ? reinterpret_cast<float*>(w + 2 * (sa_n + sb_n) + sa_n) : nullptr;
  int* inexact = reinterpret_cast<int*>(w + (hybrid ? 3 : 2) * (sa_n + sb_n));
  cudaMemsetAsync(inexact, 0, sizeof(int), stream);
  auto words = [](const float* x) { return reinterpret_cast<const uint32_t*>(x); };
  const int threads_per = 256;
  auto grid_for = [&](int64_t n) { return (unsigned)std::min<int64_t>((n + threads_per - 1) / threads_per, 65536); };
  decode_kernel<<<grid_for(sa_n), threads_per, 0, stream>>>(
      words(a.typed_data()), P.has_ae ? a_exp.typed_data() : nullptr, P.fa, P.flush_c, na, P.M, P.K, P.Mp, P.K, true,
      P.sblock, va, sa, ea, inexact);
  decode_kernel<<<grid_for(sb_n), threads_per, 0, stream>>>(
      words(b.typed_data()), P.has_be ? b_exp.typed_data() : nullptr, P.fb, P.flush_c, nb, P.K, P.N, P.K, P.Np, false,
      P.sblock, vb, sb, eb, inexact);
  Ptrs X{lens.typed_data(), words(a.typed_data()), words(b.typed_data()),
         P.has_c ? words(c.typed_data()) : nullptr, va, vb, sa, sb, ea, eb, inexact,
         reinterpret_cast<uint32_t*>(out->typed_data())};
  // int32 sums of P.group terms of magnitude below 2**(F + 2); the accumulator's term: below 2**(F + 1)
  const int64_t most = P.block * ((int64_t(1) << (P.F + 2)) - 1) + (int64_t(1) << (P.F + 1)) - 1;
  const int sum = P.group < P.block ? kGroups : most > (int64_t(1) << 31) - 1 ? kWrap : kOne;
  const bool small = P.M * P.N < 16384;  // tiles of 16 x 16 outputs, else TM x TN per thread
  dim3 tb(16, 16);
  const int tm = small ? 1 : TCEMU_TM, tn = small ? 1 : TCEMU_TN;
  const bool simple = usual_model(P.zero_exp, P.flush_c, P.has_min_exp, P.p);
  KernelFn fn = pick(P.kind, sum, P.block, small, simple);
  dim3 grid((unsigned)((P.N + 16 * tn - 1) / (16 * tn)), (unsigned)((P.M + 16 * tm - 1) / (16 * tm)),
            (unsigned)std::min<int64_t>(batch, 65535));
  fn<<<grid, tb, 0, stream>>>(P, X);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error(ffi::ErrorCode::kInternal, cudaGetErrorString(err));
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------------------------
// Grouped block-scaled fp4 (tcemu/_src/numerics/grouped.py, kind::mxf4 / mxf4nvf4; blockfma.cc
// Grouped): per block of L products, every group of G consecutive products is summed exactly, the
// group sum T (its products' units 2**-8, the scale significands folded in) is aligned by its scale
// exponents e_g only (trunc(T * 2**(F - 8 + e_g - E))), the terms and the accumulator's are summed
// exactly in int64 (below 2**50) and rounded once. native.grouped_chains lays the operands out:
// values va (K, Mp) / vb (K, Np), e2m1 values times 2 times their scale significands (a group's sum
// of products is an exact integer below 2**20, summed here in float32); scale exponents ea (K / G,
// Mp) / eb (K / G, Np); masks ma / mb, bit i set where element i of the group is nonzero (a group
// counts where ma & mb != 0). Rows and columns beyond M and N are zeros with empty masks.

struct GPtrs {
  const int32_t* lens;
  const float *va, *vb;
  const int32_t *ea, *eb;
  const uint32_t *ma, *mb;
  uint32_t* out;  // (K / chain_k, M, N)
};

constexpr int kGLmax = 64;       // the longest block of the grouped kernel's tiles
constexpr int kGTileGroups = 8;  // the groups its tiles hold

// The finish of a grouped block where the fast one does not hold: an infinite accumulator stays, a
// NaN one becomes the canonical NaN (grouped.grouped_dot), else the exact sum is rounded.
__device__ __noinline__ uint32_t gfinish(const Params& P, int64_t S, int32_t E, uint32_t acc) {
  if (((acc >> 23) & 255) == 255) return (acc & 0x7FFFFFFFu) == 0x7F800000u ? acc : 0x7FFFFFFFu;
  return round_sum(P, S, E, acc);
}

// One block of 16 x 16 threads: output rows [bm0, bm0 + 16 TM) and columns [bn0, bn0 + 16 TN), every
// chain (from +0); thread (x, y) owns rows bm0 + y TM .. and columns bn0 + x TN ... The tiles hold
// whole blocks: at most kGLmax products and kGTileGroups groups. Lc / Gc: the block and group length
// (0: P.block, P.group).
template <int TM, int TN, int Lc, int Gc>
__global__ void __launch_bounds__(256, TCEMU_MINB_GROUPED) grouped_kernel(Params P, GPtrs X) {
  constexpr int BM = 16 * TM, BN = 16 * TN;
  __shared__ __align__(16) float s_va[kGLmax][BM];
  __shared__ __align__(16) float s_vb[kGLmax][BN];
  __shared__ __align__(16) int32_t s_ea[kGTileGroups][BM];
  __shared__ __align__(16) uint32_t s_ma[kGTileGroups][BM];
  __shared__ __align__(16) int32_t s_eb[kGTileGroups][BN];
  __shared__ __align__(16) uint32_t s_mb[kGTileGroups][BN];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int64_t bm0 = (int64_t)blockIdx.y * BM, bn0 = (int64_t)blockIdx.x * BN;
  const int64_t m0 = bm0 + ty * TM, n0 = bn0 + tx * TN;
  const int64_t K = P.K, M = P.M, N = P.N, Mp = P.Mp, Np = P.Np;
  const int L = Lc ? Lc : (int)P.block, G = Gc ? Gc : (int)P.group, ng = L / G;
  const int KT = min(kGLmax / L, kGTileGroups / ng) * L;  // whole blocks per tile
  const int F = (int)P.F;
  const bool fast = P.mode != 2, flush_c = P.flush_c;
  const int32_t zero_exp = P.zero_exp;
  const int mode = P.mode;
  const float two_f = pow2f(F + 127);
  const float* va = X.va + bm0;
  const float* vb = X.vb + bn0;
  for (int64_t c0 = 0; c0 < K; c0 += P.chain_k) {
    uint32_t acc[TM][TN] = {};
    const int64_t end = c0 + X.lens[c0 / P.chain_k];
    for (int64_t t0 = c0; t0 < end; t0 += KT) {
      const int rows = (int)min((int64_t)KT, (end - t0 + L - 1) / L * L), grows = rows / G;
      const int64_t g0 = t0 / G;
      __syncthreads();  // the previous tile is read
      copy_rows<BM>(Mp, bm0, t0, rows, tid, part(va, s_va, 0));  // zeros and empty masks beyond Mp and Np
      copy_rows<BN>(Np, bn0, t0, rows, tid, part(vb, s_vb, 0));
      copy_rows<BM>(Mp, bm0, g0, grows, tid, part(X.ea + bm0, s_ea, 0), part(X.ma + bm0, s_ma, 0));
      copy_rows<BN>(Np, bn0, g0, grows, tid, part(X.eb + bn0, s_eb, 0), part(X.mb + bn0, s_mb, 0));
      __syncthreads();
      for (int kb = 0; kb < rows; kb += L) {  // the block of products t0 + kb .. + L: tile rows kb ..
        const int gb = kb / G;
        // e_g: the scale exponents of group g where a product of it is nonzero, else zero_exp
        auto group_exponents = [&](int g, int32_t (&eg)[TM][TN]) {
          int32_t ea[TM], eb[TN];
          uint32_t ma[TM], mb[TN];
          load<TM>(&s_ea[g][ty * TM], ea);
          load<TM>(&s_ma[g][ty * TM], ma);
          load<TN>(&s_eb[g][tx * TN], eb);
          load<TN>(&s_mb[g][tx * TN], mb);
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) eg[i][j] = (ma[i] & mb[j]) ? ea[i] + eb[j] : zero_exp;
        };
        int32_t E[TM][TN], eg[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
          for (int j = 0; j < TN; j++) E[i][j] = acc_exponent(acc[i][j], flush_c, zero_exp);
        for (int g = gb; g < gb + ng; g++) {
          group_exponents(g, eg);
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) E[i][j] = max(E[i][j], eg[i][j]);
        }
        long long S[TM][TN] = {};
        for (int g = gb; g < gb + ng; g++) {
          float T[TM][TN] = {};
#pragma unroll 16
          for (int kk = g * G; kk < (g + 1) * G; kk++) {
            float a[TM], b[TN];
            load<TM>(&s_va[kk][ty * TM], a);
            load<TN>(&s_vb[kk][tx * TN], b);
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
              for (int j = 0; j < TN; j++) T[i][j] = __fmaf_rn(a[i], b[j], T[i][j]);  // exact integers
          }
          // T * 2**(F - 8 + e_g - E), exact in float32; below 2**-126 it truncates to 0 anyway
          group_exponents(g, eg);
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
              S[i][j] += __float2ll_rz(__fmul_rn(T[i][j], pow2f(clampi(F - 8 + eg[i][j] - E[i][j] + 127, 1, 254))));
        }
        // the fast finish (blockfma_gpu chains_kernel): the int64 sum converted to float32 in the
        // model's direction, E - F added to its exponent field where the result is a normal number
        uint32_t badmask = 0;
        auto finish_fast = [&](auto to_f32) {
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) {
              const uint32_t c = acc[i][j];
              const int32_t ce = (c >> 23) & 255, e = E[i][j], d = e - F;
              const float cv = flush_c && ce == 0 ? 0.0f : __uint_as_float(c);
              // trunc(c * 2**(F - E)) (a nonzero c has E >= its exponent >= -126)
              const long long s = S[i][j] + __float2ll_rz(__fmul_rn(__fmul_rn(cv, pow2f(clampi(127 - e, 1, 254))), two_f));
              const int32_t fb = __float_as_int(to_f32(s));
              const bool zero = s == 0;
              const int32_t be = ((fb >> 23) & 255) + d;
              const bool bad = !fast || ce == 255 || e > 126 || (!zero && (uint32_t)(be - 1) > 253u);
              badmask |= (uint32_t)bad << (i * TN + j);
              acc[i][j] = bad ? c : zero ? 0u : (uint32_t)fb + ((uint32_t)d << 23);
            }
        };
        switch (mode) {
          case 0: finish_fast([](long long x) { return __ll2float_rz(x); }); break;
          case 1: finish_fast([](long long x) { return __ll2float_rn(x); }); break;
          case 3: finish_fast([](long long x) { return __ll2float_ru(x); }); break;
          default: finish_fast([](long long x) { return __ll2float_rd(x); }); break;
        }
        if (badmask) {  // rare: the exact finish, one output at a time
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
              if ((badmask >> (i * TN + j)) & 1u) acc[i][j] = gfinish(P, S[i][j], E[i][j], acc[i][j]);
        }
      }
    }
    store_tile<TM, TN>(X.out + (c0 / P.chain_k) * M * N, acc, m0, n0, M, N);
  }
}

typedef void (*GroupedFn)(Params, GPtrs);

ffi::Error Grouped(cudaStream_t stream, ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::F32> va,
                   ffi::Buffer<ffi::S32> ea, ffi::Buffer<ffi::U32> ma, ffi::Buffer<ffi::F32> vb,
                   ffi::Buffer<ffi::S32> eb, ffi::Buffer<ffi::U32> mb, ffi::ResultBuffer<ffi::U32> out,
                   int64_t chain_k, int64_t block, int64_t group, int64_t F, int64_t zero_exp, int64_t mode,
                   int64_t subnormals, int64_t overflow_ieee, int64_t flush_c, int64_t threads) {
  auto ad = va.dimensions(), bd = vb.dimensions(), od = out->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || od.size() != 3 || ad[0] != bd[0])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: A (K, Mp), B (K, Np), out (C, M, N) expected");
  Params P{};
  P.K = ad[0];
  P.Mp = ad[1];
  P.Np = bd[1];
  P.M = od[1];
  P.N = od[2];
  P.chain_k = chain_k;
  P.block = block;
  P.group = group;
  P.F = F;
  P.zero_exp = (int32_t)zero_exp;
  P.mode = (int)mode;
  P.p = 23;
  P.subnormals = subnormals != 0;
  P.overflow_ieee = overflow_ieee != 0;
  P.flush_c = flush_c != 0;
  if (P.M < 1 || P.N < 1 || P.Mp % 4 || P.Np % 4 || P.Mp < P.M || P.Np < P.N || chain_k <= 0 || P.K % chain_k ||
      block <= 0 || block > kGLmax || group <= 0 || group > 32 || block % group || block / group > kGTileGroups ||
      chain_k % block || F > 40 || od[0] * chain_k != P.K || lens.element_count() != (size_t)od[0] ||
      ea.element_count() != (size_t)(P.K / group * P.Mp) || ma.element_count() != ea.element_count() ||
      eb.element_count() != (size_t)(P.K / group * P.Np) || mb.element_count() != eb.element_count())
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: bad shapes or attributes");
  if (P.K * std::max(P.Mp, P.Np) >= (int64_t(1) << 31))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tcemu grouped: K * M and K * N below 2**31");
  const GPtrs X{lens.typed_data(), va.typed_data(), vb.typed_data(), ea.typed_data(), eb.typed_data(),
                ma.typed_data(), mb.typed_data(), out->typed_data()};
  const bool small = P.M * P.N < 16384;  // tiles of 16 x 16 outputs, else TM x TN per thread
  const int tm = small ? 1 : TCEMU_TM, tn = small ? 1 : TCEMU_TN;
  const GroupedFn fn = small ? grouped_kernel<1, 1, 0, 0>
                       : block == 64 && group == 16 ? grouped_kernel<TCEMU_TM, TCEMU_TN, 64, 16>
                                                    : grouped_kernel<TCEMU_TM, TCEMU_TN, 0, 0>;
  dim3 grid((unsigned)((P.N + 16 * tn - 1) / (16 * tn)), (unsigned)((P.M + 16 * tm - 1) / (16 * tm)));
  fn<<<grid, dim3(16, 16), 0, stream>>>(P, X);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error(ffi::ErrorCode::kInternal, cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_blockfma_chains_gpu, Chains,
                              TCEMU_CHAINS_ATTRS(TCEMU_CHAINS_ARGS(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
                                                     .Ret<ffi::Buffer<ffi::S32>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tcemu_grouped_chains_gpu, Grouped,
                              TCEMU_GROUPED_ATTRS(ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()));
