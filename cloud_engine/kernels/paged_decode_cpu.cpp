// Paged decode attention for CPUs: each decoding sequence's one query token attends to its
// context by reading K/V straight from the block cache, with no gathered copy.
//
// Why a kernel: the portable path (index_select the blocks, then scaled_dot_product_attention)
// copies every sequence's whole context once per layer per step and runs a flash kernel tuned
// for long query tiles; on a 2-core CPU that was ~60% of a batch-32 decode step. Reading the
// cache in place is bandwidth-bound instead (~25 GB/s vs ~3 GB/s measured).
//
// Layout (same as cloud_engine/attention.py): caches [num_blocks, block_size, num_kv_heads,
// head_dim], query [num_seqs, num_heads, head_dim], block_tables [num_seqs, max_blocks] int64,
// seq_lens [num_seqs] int64. Query head h reads K/V head h / (num_heads / num_kv_heads).
// Math is float32 whatever the cache dtype: float32, bfloat16, or int8 rows of head_dim values and
// a float16 scale (cloud_engine/kv_quant.py: caches [.., num_kv_heads, head_dim + 2]; a key's scale
// multiplies its dot product, a value's its softmax weight). A sliding-window layer
// (window > 0, Gemma 3's local layers) attends to its last `window` tokens only, and the
// blocks before them are never read.
//
// Vectors use GCC/Clang vector extensions (16 floats), which the compiler lowers to AVX-512,
// AVX2 or NEON. One exception: widening int8 to float32, which GCC scalarizes from the vector
// extensions (16 byte extracts a load); there the x86 intrinsics are used where the build has them.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef int8_t i8x16 __attribute__((vector_size(16)));

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxVectors = 128;  // query heads per K/V head * head_dim / 16

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline f32x16 load(const uint16_t* p) {  // bfloat16 bits: the high half of a float32
  u16x16 h;
  std::memcpy(&h, p, sizeof(h));
  u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  f32x16 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

inline f32x16 load(const int8_t* p) {  // quantized values, before their row's scale
  f32x16 v;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &wide, sizeof(v));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256 low = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  const __m256 high = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
  std::memcpy(&v, &low, sizeof(low));
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof(low), &high, sizeof(high));
#else
  i8x16 b;
  std::memcpy(&b, p, sizeof(b));
  v = __builtin_convertvector(b, f32x16);
#endif
  return v;
}

inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof(v)); }

// The factor a cache row's values are multiplied by: 1 for float caches, the float16 scale after the
// head_dim values of an int8 row (kv_quant keeps scales in float16's normal range: no subnormal case).
inline float row_scale(const float*, int64_t) { return 1.f; }
inline float row_scale(const uint16_t*, int64_t) { return 1.f; }
inline float row_scale(const int8_t* row, int64_t head_dim) {
  uint16_t h;
  std::memcpy(&h, row + head_dim, sizeof(h));
  const uint32_t bits = ((((h >> 10) & 0x1fu) + 112u) << 23) | ((h & 0x3ffu) << 13);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float sum_lanes(f32x16 v) {
  float s = 0.f;
  for (int64_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// exp(x) for x <= 0, as softmax needs after subtracting the row max: 2^(x log2 e) split into
// an integer power (exponent bits) and a degree-6 polynomial on [0, ln 2); relative error ~1e-7.
inline f32x16 exp_nonpositive(f32x16 x) {
  const f32x16 lowest = f32x16{} - 87.f;  // below this exp underflows float32 anyway
  x = x < lowest ? lowest : x;
  const f32x16 y = x * 1.44269504088896341f;
  f32x16 n = __builtin_convertvector(__builtin_convertvector(y, i32x16), f32x16);  // toward zero
  n = n > y ? n - 1.f : n;                                                           // floor
  const f32x16 f = (y - n) * 0.69314718055994531f;
  const f32x16 p =
      1.f + f * (1.f + f * (0.5f + f * (0.16666667f + f * (0.041666668f + f * (0.008333334f + f * 0.0013888889f)))));
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// softmax numerators in place over scores[0, len); returns 1 / their sum.
float exp_and_sum(float* scores, int64_t len, float max_score) {
  f32x16 sums = f32x16{};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const f32x16 e = exp_nonpositive(load(scores + i) - max_score);
    store(scores + i, e);
    sums += e;
  }
  float total = sum_lanes(sums);
  for (; i < len; ++i) {
    scores[i] = std::exp(scores[i] - max_score);
    total += scores[i];
  }
  return 1.f / total;
}

struct Shape {
  int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t row_width;                   // cache elements of one (token, head) row: head_dim (+ 2 scale bytes for int8)
  int64_t token_stride, block_stride;  // cache elements between tokens / blocks
};

// One (sequence, K/V head) pair: its `group` query heads against cached tokens [first, len).
// kChunks = head_dim / 16 when known at compile time (the common head sizes, so the row
// loops unroll into registers), 0 for any other multiple of 16.
template <typename T, int64_t kChunks>
void attend(const float* query, const T* key_cache, const T* value_cache, const int64_t* table, int64_t first,
            int64_t len, int64_t kv_head, const Shape& s, float scale, float* scores, float* out) {
  const int64_t group = s.num_heads / s.num_kv_heads, head_offset = kv_head * s.row_width;
  const int64_t chunks = kChunks ? kChunks : s.head_dim / kLanes;
  f32x16 q[kMaxVectors], acc[kMaxVectors];
  for (int64_t i = 0; i < group * chunks; ++i) q[i] = load(query + i * kLanes) * scale;
  float max_score[kMaxVectors], inverse_sum[kMaxVectors];  // group <= kMaxVectors
  for (int64_t g = 0; g < group; ++g) max_score[g] = -INFINITY;
  const int64_t visible = len - first;  // scores[g * visible + i] belongs to position first + i

  // Block by block from the one holding `first` (a window may start mid-block).
  for (int64_t pos = first; pos < len;) {
    const int64_t offset = pos % s.block_size, n = std::min(s.block_size - offset, len - pos);
    const T* block = key_cache + table[pos / s.block_size] * s.block_stride + offset * s.token_stride + head_offset;
    for (int64_t t = 0; t < n; ++t) {
      f32x16 k[kMaxVectors];
      const T* row = block + t * s.token_stride;
      for (int64_t c = 0; c < chunks; ++c) k[c] = load(row + c * kLanes);
      const float k_scale = row_scale(row, s.head_dim);
      for (int64_t g = 0; g < group; ++g) {
        f32x16 dot = q[g * chunks] * k[0];
        for (int64_t c = 1; c < chunks; ++c) dot += q[g * chunks + c] * k[c];
        const float score = sum_lanes(dot) * k_scale;
        scores[g * visible + pos - first + t] = score;
        max_score[g] = std::max(max_score[g], score);
      }
    }
    pos += n;
  }
  for (int64_t g = 0; g < group; ++g) inverse_sum[g] = exp_and_sum(scores + g * visible, visible, max_score[g]);

  for (int64_t i = 0; i < group * chunks; ++i) acc[i] = f32x16{};
  for (int64_t pos = first; pos < len;) {
    const int64_t offset = pos % s.block_size, n = std::min(s.block_size - offset, len - pos);
    const T* block = value_cache + table[pos / s.block_size] * s.block_stride + offset * s.token_stride + head_offset;
    for (int64_t t = 0; t < n; ++t) {
      f32x16 v[kMaxVectors];
      const T* row = block + t * s.token_stride;
      for (int64_t c = 0; c < chunks; ++c) v[c] = load(row + c * kLanes);
      const float v_scale = row_scale(row, s.head_dim);
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * visible + pos - first + t] * v_scale;
        for (int64_t c = 0; c < chunks; ++c) acc[g * chunks + c] += v[c] * p;
      }
    }
    pos += n;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t c = 0; c < chunks; ++c) store(out + (g * chunks + c) * kLanes, acc[g * chunks + c] * inverse_sum[g]);
}

template <typename T, int64_t kChunks>
void decode_all(const float* query, const T* key_cache, const T* value_cache, const int64_t* tables,
                const int64_t* seq_lens, int64_t num_seqs, const Shape& s, float scale, int64_t window, float* out) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  int64_t longest = 0;
  for (int64_t i = 0; i < num_seqs; ++i) longest = std::max(longest, seq_lens[i]);
  if (window > 0) longest = std::min(longest, window);
  // One work item per (sequence, K/V head); torch's intra-op pool splits them over threads.
  at::parallel_for(0, num_seqs * s.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * longest);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / s.num_kv_heads, kv_head = item % s.num_kv_heads;
      const int64_t row = (seq * s.num_heads + kv_head * group) * s.head_dim;
      const int64_t len = seq_lens[seq], first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      attend<T, kChunks>(query + row, key_cache, value_cache, tables + seq * s.max_blocks, first, len, kv_head, s,
                         scale, scores.data(), out + row);
    }
  });
}

template <typename T>
void dispatch_head_dim(const float* query, const T* key_cache, const T* value_cache, const int64_t* tables,
                       const int64_t* seq_lens, int64_t num_seqs, const Shape& s, float scale, int64_t window,
                       float* out) {
  switch (s.head_dim) {
    case 64: return decode_all<T, 4>(query, key_cache, value_cache, tables, seq_lens, num_seqs, s, scale, window, out);
    case 128: return decode_all<T, 8>(query, key_cache, value_cache, tables, seq_lens, num_seqs, s, scale, window, out);
    default: return decode_all<T, 0>(query, key_cache, value_cache, tables, seq_lens, num_seqs, s, scale, window, out);
  }
}

}  // namespace

torch::Tensor paged_decode_attention(const torch::Tensor& query, const torch::Tensor& key_cache,
                                     const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                                     const torch::Tensor& seq_lens, double scale, int64_t window) {
  TORCH_CHECK(query.device().is_cpu() && key_cache.device().is_cpu(), "paged_decode_attention runs on CPU tensors");
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4, "query must be [seqs, heads, dim], caches [blocks, block_size, kv_heads, dim]");
  TORCH_CHECK(key_cache.sizes() == value_cache.sizes() && key_cache.scalar_type() == value_cache.scalar_type(),
              "key and value caches must match");
  const bool quantized = key_cache.scalar_type() == at::kChar;
  TORCH_CHECK(key_cache.scalar_type() == at::kFloat || key_cache.scalar_type() == at::kBFloat16 || quantized,
              "caches must be float32, bfloat16 or int8 rows with a float16 scale");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong, "tables and lengths must be int64");
  const Shape s{query.size(1),
                key_cache.size(2),
                query.size(2),
                key_cache.size(1),
                block_tables.size(1),
                key_cache.size(3),
                key_cache.size(2) * key_cache.size(3),
                key_cache.size(1) * key_cache.size(2) * key_cache.size(3)};
  const int64_t num_seqs = query.size(0);
  TORCH_CHECK(s.row_width == s.head_dim + (quantized ? 2 : 0) && s.head_dim % kLanes == 0,
              "head_dim must match the cache (int8 rows: head_dim + 2) and be a multiple of 16");
  TORCH_CHECK(s.num_heads % s.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK((s.num_heads / s.num_kv_heads) * (s.head_dim / kLanes) <= kMaxVectors, "too many query heads per K/V head for this kernel");
  TORCH_CHECK(block_tables.size(0) == num_seqs && seq_lens.size(0) == num_seqs, "one block table and length per sequence");
  TORCH_CHECK(window >= 0, "window must be 0 (the whole context) or a positive number of tokens");

  const auto q = query.to(at::kFloat).contiguous();
  const auto tables = block_tables.contiguous();
  const auto lens = seq_lens.contiguous();
  const int64_t* len_data = lens.data_ptr<int64_t>();
  const int64_t* table_data = tables.data_ptr<int64_t>();
  for (int64_t i = 0; i < num_seqs; ++i) {  // a bad table would read outside the cache: refuse it
    TORCH_CHECK(len_data[i] >= 1 && len_data[i] <= s.max_blocks * s.block_size, "sequence length outside its block table");
    for (int64_t b = 0; b < (len_data[i] + s.block_size - 1) / s.block_size; ++b) {
      const int64_t block = table_data[i * s.max_blocks + b];
      TORCH_CHECK(block >= 0 && block < key_cache.size(0), "block id outside the cache");
    }
  }
  auto out = torch::empty(q.sizes(), q.options());
  if (key_cache.scalar_type() == at::kFloat) {
    dispatch_head_dim(q.data_ptr<float>(), key_cache.data_ptr<float>(), value_cache.data_ptr<float>(), table_data,
                      len_data, num_seqs, s, static_cast<float>(scale), window, out.data_ptr<float>());
  } else if (quantized) {
    dispatch_head_dim(q.data_ptr<float>(), key_cache.data_ptr<int8_t>(), value_cache.data_ptr<int8_t>(), table_data,
                      len_data, num_seqs, s, static_cast<float>(scale), window, out.data_ptr<float>());
  } else {
    dispatch_head_dim(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(key_cache.data_ptr()),
                      reinterpret_cast<const uint16_t*>(value_cache.data_ptr()), table_data, len_data, num_seqs, s,
                      static_cast<float>(scale), window, out.data_ptr<float>());
  }
  return out.to(query.scalar_type());
}

// The compiled decode step's ops (cloud_engine.custom_ops registers their fake implementations).
// Registered in C++ so a compiled graph calls them through the dispatcher alone: a Python custom
// op costs ~15 us a call, and a 30-layer step makes 150 of them.

// Write each row's K/V into its slot, then decode attention as above; mutates the caches. K/V rows come in the
// cache's form (an int8 cache's rows quantized by the caller: cloud_engine.attention.paged_attention).
torch::Tensor write_and_attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               torch::Tensor key_cache, torch::Tensor value_cache, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
                               int64_t window) {
  const int64_t kv_heads = key_cache.size(2), row_width = key_cache.size(3);
  key_cache.view({-1, kv_heads, row_width}).index_copy_(0, slot_mapping, key);
  value_cache.view({-1, kv_heads, row_width}).index_copy_(0, slot_mapping, value);
  return paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, window);
}

// x times a weight oneDNN packed (cloud_engine/model/packed_linear.py): the same mkldnn op eager steps call.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed_weight,
                            const std::optional<torch::Tensor>& bias, int64_t out_features) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                                  const std::optional<torch::Tensor>&, c10::string_view,
                                                  c10::List<std::optional<c10::Scalar>>,
                                                  std::optional<c10::string_view>)>();
  auto out = op.call(x, packed_weight, bias, "none", c10::List<std::optional<c10::Scalar>>(), "");
  TORCH_CHECK(out.size(-1) == out_features, "packed_linear: the weight has ", out.size(-1), " outputs, not ",
              out_features);
  return out;
}

TORCH_LIBRARY(tandem_cpu, m) {
  m.def("write_and_attend(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, float scale, int window=0) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed_weight, Tensor? bias, int out_features) -> Tensor");
}

// Any dispatch key: a packed weight is an MKLDNN tensor, which would dispatch past a CPU-only kernel.
TORCH_LIBRARY_IMPL(tandem_cpu, CompositeExplicitAutograd, m) {
  m.impl("write_and_attend", &write_and_attend);
  m.impl("packed_linear", &packed_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "decode attention over a paged KV cache (query [seqs, heads, dim]) -> [seqs, heads, dim]; window > 0 "
        "attends to each sequence's last `window` tokens only",
        pybind11::arg("query"), pybind11::arg("key_cache"), pybind11::arg("value_cache"), pybind11::arg("block_tables"),
        pybind11::arg("seq_lens"), pybind11::arg("scale"), pybind11::arg("window") = 0);
}
