// y = x W^T (+ bias) for float32 (and, on AVX512-BF16 CPUs, bfloat16) activations and int8 weights with a float32
// scale per output channel
// (cloud_engine/model/int8_linear.py): weight-only 8-bit linears for the cloud engine on CPU.
//
// Why a kernel: torch's own `_weight_int8pack_mm` is fast for bfloat16 activations only; with float32
// ones it took 5.8-42x F.linear's time on a 2-core AVX2 EPYC (SmolLM2-135M's shapes, 1-256 rows), and
// dequantizing the weight for every call 1.1-30x (bench.int8_linear). A decode step at a few rows is bound
// by reading the weights, and int8 reads a quarter of float32's bytes.
//
// Layout: the weight is packed at load into tiles of 16 output channels, [tiles, K, 16] int8 (output
// channels past N are zero rows with scale 0), so one 16-byte load is one k for 16 outputs. Per tile and
// chunk of K, the chunk is widened to float once into a small panel (L1-resident), then every group of
// kRows rows of x runs a broadcast-and-FMA loop over it (a single group widens as it goes). The scale
// and bias are applied once per output at the end. Tiles are split over torch's intra-op threads. Where the build
// has AVX512-BF16, bfloat16 activations take the same loop with a bf16 panel (int8_linear_bf16, below).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace {

// Native-width vectors: a 16-float vector on AVX2 is two registers that GCC shuffles through memory inside
// loops (measured: 4-7x slower than F.linear), so this kernel uses the machine's own width.
#if defined(__AVX512F__)
constexpr int64_t kVec = 16;
#elif defined(__AVX2__)
constexpr int64_t kVec = 8;
#else
constexpr int64_t kVec = 4;
#endif
typedef float vfloat __attribute__((vector_size(kVec * sizeof(float))));
typedef int8_t vint8 __attribute__((vector_size(kVec)));

constexpr int64_t kTile = 16;                  // output channels per tile
constexpr int64_t kPerTile = kTile / kVec;     // vectors per tile row
constexpr int64_t kChunk = 256;                // K per panel: 16 KB of floats
constexpr int64_t kRows = kVec == 16 ? 8 : 6;  // rows of x per group: kRows * kPerTile accumulators

inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof(v)); }

inline vfloat widen(const int8_t* p) {  // kVec int8 values -> float (GCC scalarizes the vector-extension widen)
  vfloat v;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &wide, sizeof(v));
#elif defined(__AVX2__)
  const __m256 wide = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &wide, sizeof(v));
#else
  vint8 b;
  std::memcpy(&b, p, sizeof(b));
  v = __builtin_convertvector(b, vfloat);
#endif
  return v;
}

inline vfloat load_weights(const float* p) { return load(p); }
inline vfloat load_weights(const int8_t* p) { return widen(p); }

// acc (+)= x[rows, kc] times w[kc, 16], rows <= kRows; acc and x have row strides kTile and ldx. `w` is a widened
// panel (float) or the packed weights themselves (int8: a single group of rows widens each k once anyway). Fewer
// rows than kRows split k over independent accumulators: one row's FMAs would otherwise wait on each other.
template <int64_t rows, typename W>
void accumulate(const float* x, int64_t ldx, const W* w, int64_t kc, float* acc, bool first) {
  constexpr int64_t split = rows >= 4 ? 1 : rows >= 2 ? 2 : 4;
  vfloat a[split][rows][kPerTile];
  for (int64_t s = 0; s < split; ++s)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < kPerTile; ++v)
        a[s][r][v] = first || s > 0 ? vfloat{} : load(acc + r * kTile + v * kVec);
  int64_t k = 0;
  for (; k + split <= kc; k += split) {
    for (int64_t s = 0; s < split; ++s) {
      vfloat wv[kPerTile];
      for (int64_t v = 0; v < kPerTile; ++v) wv[v] = load_weights(w + (k + s) * kTile + v * kVec);
      for (int64_t r = 0; r < rows; ++r) {
        const float xr = x[r * ldx + k + s];
        for (int64_t v = 0; v < kPerTile; ++v) a[s][r][v] += xr * wv[v];
      }
    }
  }
  for (; k < kc; ++k) {
    for (int64_t v = 0; v < kPerTile; ++v) {
      const vfloat wv = load_weights(w + k * kTile + v * kVec);
      for (int64_t r = 0; r < rows; ++r) a[0][r][v] += x[r * ldx + k] * wv;
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < kPerTile; ++v) {
      vfloat sum = a[0][r][v];
      for (int64_t s = 1; s < split; ++s) sum += a[s][r][v];
      store(acc + r * kTile + v * kVec, sum);
    }
}

template <int64_t rows = kRows, typename W>
void accumulate_rows(int64_t n, const float* x, int64_t ldx, const W* w, int64_t kc, float* acc, bool first) {
  if constexpr (rows > 1) {
    if (n < rows) return accumulate_rows<rows - 1>(n, x, ldx, w, kc, acc, first);
  }
  accumulate<rows>(x, ldx, w, kc, acc, first);
}

#if defined(__AVX512BF16__)
// bfloat16 activations on a CPU with AVX512-BF16: the panel holds the weights as bf16 pairs, so one vdpbf16ps does
// two k for 16 outputs (twice an FMA's arithmetic; int8 values are exact in bf16). On a 2-core Zen 4 EPYC, widening
// to float32 and FMA took 1.3x bf16 F.linear's time at 32 rows, torch's _weight_int8pack_mm 2.0x (bench.int8_linear).
constexpr bool kNativeBf16 = true;
constexpr int64_t kBf16MinRows = 2;  // one row: the float path (the panel's widening is not shared over rows)

// k and k+1 of a tile (16 int8 each) -> 32 bf16, (k, k+1) adjacent per output channel: vdpbf16ps's pairs.
inline __m512i widen_pair(const int8_t* k_row) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k_row));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k_row + kTile));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(a, b)));  // channels 0-7
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(a, b)));  // channels 8-15
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// acc (+)= x[rows, 2 * pairs] times the panel's pairs; x is bf16 bits with row stride ldx, acc row stride kTile.
template <int64_t rows>
void accumulate_bf16(const uint16_t* x, int64_t ldx, const __m512i* panel, int64_t pairs, float* acc, bool first) {
  constexpr int64_t split = rows >= 4 ? 1 : rows >= 2 ? 2 : 4;
  __m512 a[split][rows];
  for (int64_t s = 0; s < split; ++s)
    for (int64_t r = 0; r < rows; ++r)
      a[s][r] = first || s > 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * kTile);
  auto step = [&](int64_t s, int64_t p) {
    const __m512bh w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + p));
    for (int64_t r = 0; r < rows; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + 2 * p, sizeof(pair));
      a[s][r] = _mm512_dpbf16_ps(a[s][r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)), w);
    }
  };
  int64_t p = 0;
  for (; p + split <= pairs; p += split)
    for (int64_t s = 0; s < split; ++s) step(s, p + s);
  for (; p < pairs; ++p) step(0, p);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 sum = a[0][r];
    for (int64_t s = 1; s < split; ++s) sum = _mm512_add_ps(sum, a[s][r]);
    _mm512_storeu_ps(acc + r * kTile, sum);
  }
}

template <int64_t rows = kRows>
void accumulate_rows_bf16(int64_t n, const uint16_t* x, int64_t ldx, const __m512i* panel, int64_t pairs, float* acc,
                          bool first) {
  if constexpr (rows > 1) {
    if (n < rows) return accumulate_rows_bf16<rows - 1>(n, x, ldx, panel, pairs, acc, first);
  }
  accumulate_bf16<rows>(x, ldx, panel, pairs, acc, first);
}

// The float path's loop with a bf16 panel: x [M, K] bf16, sums into y [M, out_features] float32.
void int8_linear_bf16(const torch::Tensor& x, const int8_t* w_data, int64_t tiles, int64_t out_features,
                      const std::function<void(const float*, int64_t, int64_t)>& finish) {
  const int64_t M = x.size(0), K = x.size(1);
  const auto* x_bits = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const at::BFloat16* x_values = x.data_ptr<at::BFloat16>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<__m512i> panel(kChunk / 2);
    std::vector<float> acc(M * kTile);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int8_t* w_tile = w_data + tile * K * kTile;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {  // kChunk is even: only the last chunk can hold an odd k
        const int64_t kc = std::min(kChunk, K - k0), pairs = kc / 2;
        for (int64_t p = 0; p < pairs; ++p) panel[p] = widen_pair(w_tile + (k0 + 2 * p) * kTile);
        for (int64_t m0 = 0; m0 < M; m0 += kRows)
          accumulate_rows_bf16(std::min(kRows, M - m0), x_bits + m0 * K + k0, K, panel.data(), pairs,
                               acc.data() + m0 * kTile, k0 == 0);
        if (kc % 2) {  // the odd last k, in float
          const int64_t k = K - 1;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < kTile; ++j)
              acc[m * kTile + j] += static_cast<float>(x_values[m * K + k]) * w_tile[k * kTile + j];
        }
      }
      finish(acc.data(), tile, M);
    }
  });
}
#else
constexpr bool kNativeBf16 = false;
#endif

}  // namespace

// Whether bfloat16 activations run tandem's kernel here (AVX512-BF16 in this build) rather than torch's.
bool int8_linear_native_bf16() { return kNativeBf16; }

// x [M, K] (bfloat16 runs the bf16 path where int8_linear_native_bf16, from kBf16MinRows rows; any other float dtype
// is computed in float32), packed_weight [tiles, K, 16] int8, scales [tiles * 16] float32, bias [out_features] or
// None -> [M, out_features] in x's dtype.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& packed_weight, const torch::Tensor& scales,
                          const std::optional<torch::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(x.device().is_cpu() && packed_weight.device().is_cpu(), "int8_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2, "int8_linear: x must be [rows, in_features]");
  TORCH_CHECK(packed_weight.dim() == 3 && packed_weight.size(2) == kTile && packed_weight.scalar_type() == at::kChar &&
                  packed_weight.is_contiguous(),
              "int8_linear: the weight must be contiguous int8 [tiles, in_features, 16]");
  const int64_t M = x.size(0), K = x.size(1), tiles = packed_weight.size(0);
  TORCH_CHECK(packed_weight.size(1) == K, "int8_linear: x has ", K, " features, the weight ", packed_weight.size(1));
  TORCH_CHECK(out_features > (tiles - 1) * kTile && out_features <= tiles * kTile,
              "int8_linear: ", tiles, " tiles of 16 cannot hold ", out_features, " outputs");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == tiles * kTile && scales.is_contiguous(),
              "int8_linear: scales must be float32, one per packed output channel");
  TORCH_CHECK(!bias.has_value() || bias->numel() == out_features, "int8_linear: bias must have out_features values");

  const auto bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : torch::Tensor();
  auto y = torch::empty({M, out_features}, x.options().dtype(at::kFloat));
  if (M == 0) return y.to(x.scalar_type());
  const int8_t* w_data = packed_weight.data_ptr<int8_t>();
  const float* s_data = scales.data_ptr<float>();
  const float* b_data = bf.defined() ? bf.data_ptr<float>() : nullptr;
  float* y_data = y.data_ptr<float>();
  // A tile's sums [M, 16] -> y's columns, scaled, plus bias.
  auto finish = [&](const float* acc, int64_t tile, int64_t rows) {
    const int64_t n0 = tile * kTile, width = std::min(kTile, out_features - n0);
    for (int64_t m = 0; m < rows; ++m) {
      const float* sums = acc + m * kTile;
      float* row = y_data + m * out_features + n0;
      for (int64_t j = 0; j < width; ++j) row[j] = sums[j] * s_data[n0 + j] + (b_data ? b_data[n0 + j] : 0.f);
    }
  };
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16 && M >= kBf16MinRows) {
    int8_linear_bf16(x.contiguous(), w_data, tiles, out_features, finish);
    return y.to(x.scalar_type());
  }
#endif
  const auto xf = x.to(at::kFloat).contiguous();
  const float* x_data = xf.data_ptr<float>();

  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> panel(kChunk * kTile), acc(M * kTile);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int8_t* w_tile = w_data + tile * K * kTile;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        const int8_t* w_chunk = w_tile + k0 * kTile;
        if (M <= kRows) {  // one group of rows: widen as it goes
          accumulate_rows(M, x_data + k0, K, w_chunk, kc, acc.data(), k0 == 0);
          continue;
        }
        for (int64_t i = 0; i < kc * kTile; i += kVec) store(panel.data() + i, widen(w_chunk + i));
        for (int64_t m0 = 0; m0 < M; m0 += kRows) {
          accumulate_rows(std::min(kRows, M - m0), x_data + m0 * K + k0, K, panel.data(), kc,
                          acc.data() + m0 * kTile, k0 == 0);
        }
      }
      finish(acc.data(), tile, M);
    }
  });
  return y.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(tandem_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor packed_weight, Tensor scales, Tensor? bias, int out_features) -> Tensor");
  m.def("int8_linear_native_bf16() -> bool", &int8_linear_native_bf16);
}

TORCH_LIBRARY_IMPL(tandem_cpu, CPU, m) { m.impl("int8_linear", &int8_linear); }
