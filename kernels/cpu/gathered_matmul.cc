// XLA:CPU FFI handlers: few rows, each through its own expert's compressed matrix,
// read in place from the stored uint8 codes (kernels/cpu_gathered.py binds them).
//
//   y[r] = x[r] @ W_hat[row_expert[r]],   x [R, d_in], codes [E, d_in, d_out]
//
// Affine codes (moejax/experts/quantized.py): W_hat[i, j] = (c[i, j] - z[g, j]) s[g, j],
// zero points z uint8 like the codes
// over groups g of d_in / G input rows, so per group
//   y[j] += s[g, j] (sum_i x[i] c[i, j] - z[g, j] sum_i x[i]),
// one multiply-add per code (Frantar et al. 2022, arXiv 2210.17323, the grid of eq. 1).
// Codebook indices (moejax/experts/codebook.py; CodeQuant, arXiv 2604.10496):
//   W_hat[i, j] = C[g, idx[i, j]]; per input row the K products x[i] C[g, k] are a
//   lookup table and y[j] += table[idx[i, j]] (the lookup-table matmul), with a
//   16-lane permute as the lookup when K <= 16 and AVX-512 is there.
#include <algorithm>
#include <cstdint>
#include <string>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Shapes {
  int64_t rows, d_in, d_out, experts, groups, group_size;
};

// Checks the operand shapes agree; fills `s`.
ffi::Error CheckShapes(const ffi::AnyBuffer::Dimensions& x, const ffi::AnyBuffer::Dimensions& codes,
                       const ffi::AnyBuffer::Dimensions& table, int64_t row_experts, Shapes* s) {
  if (x.size() != 2 || codes.size() != 3 || table.size() != 3) {
    return ffi::Error::InvalidArgument("gathered matmul: x [R, d_in], codes and table rank 3");
  }
  s->rows = x[0];
  s->d_in = x[1];
  s->experts = codes[0];
  s->d_out = codes[2];
  s->groups = table[1];
  if (codes[1] != s->d_in || row_experts != s->rows || table[0] != s->experts ||
      s->groups <= 0 || s->d_in % s->groups != 0) {
    return ffi::Error::InvalidArgument(
        "gathered matmul: shapes do not fit (x " + std::to_string(x[0]) + "x" +
        std::to_string(x[1]) + ", codes " + std::to_string(codes[0]) + "x" +
        std::to_string(codes[1]) + "x" + std::to_string(codes[2]) + ")");
  }
  s->group_size = s->d_in / s->groups;
  return ffi::Error::Success();
}

ffi::Error CheckExpert(int32_t e, int64_t experts) {
  if (e < 0 || e >= experts) {
    return ffi::Error::InvalidArgument("gathered matmul: row expert " + std::to_string(e) +
                                       " outside [0, " + std::to_string(experts) + ")");
  }
  return ffi::Error::Success();
}

// Columns per register block: four 16-lane float32 accumulators.
constexpr int64_t kBlock = 64;

// Calls block(expert, x row, y row, g) for every row (its y zeroed first) and group g.
template <typename Block>
ffi::Error ForEachRowGroup(const Shapes& s, const float* xs, const int32_t* row_expert,
                           float* out, Block block) {
  for (int64_t r = 0; r < s.rows; ++r) {
    ffi::Error err = CheckExpert(row_expert[r], s.experts);
    if (err.failure()) return err;
    float* yr = out + r * s.d_out;
    std::fill(yr, yr + s.d_out, 0.0f);
    for (int64_t g = 0; g < s.groups; ++g) block(row_expert[r], xs + r * s.d_in, yr, g);
  }
  return ffi::Error::Success();
}

// sum over rows i of group g of x[i] * value(code[i, j]), for column j (scalar tail).
template <typename Value>
inline float ColumnSum(const Shapes& s, const float* xr, const uint8_t* codes, int64_t g,
                       int64_t j, Value value) {
  float acc = 0.0f;
  for (int64_t i = g * s.group_size; i < (g + 1) * s.group_size; ++i) {
    acc += xr[i] * value(codes[i * s.d_out + j]);
  }
  return acc;
}

#if defined(__AVX512F__)
// 16 uint8 at p as 16 int32 lanes.
inline __m512i Lanes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc[k] (k < 4) = the ColumnSum of columns j + 16 k .. j + 16 k + 15, with
// values(16 code lanes) -> 16 float lanes.
template <typename Values>
inline void BlockSums(const Shapes& s, const float* xr, const uint8_t* codes, int64_t g, int64_t j,
                      Values values, __m512 acc[4]) {
  for (int k = 0; k < 4; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t i = g * s.group_size; i < (g + 1) * s.group_size; ++i) {
    const __m512 xv = _mm512_set1_ps(xr[i]);
    const uint8_t* c = codes + i * s.d_out + j;
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_fmadd_ps(xv, values(Lanes(c + 16 * k)), acc[k]);
  }
}
#endif

ffi::Error AffineImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> codes,
                      ffi::Buffer<ffi::F32> scales, ffi::Buffer<ffi::U8> zeros,
                      ffi::Buffer<ffi::S32> row_expert, ffi::ResultBuffer<ffi::F32> y) {
  Shapes s;
  ffi::Error err = CheckShapes(x.dimensions(), codes.dimensions(), scales.dimensions(),
                               row_expert.element_count(), &s);
  if (err.failure()) return err;
  const uint8_t* cs = codes.typed_data();
  const float* sc = scales.typed_data();
  const uint8_t* zs = zeros.typed_data();
  auto block = [&](int64_t e, const float* xr, float* yr, int64_t g) {
    const uint8_t* rows = cs + e * s.d_in * s.d_out;
    const float* sg = sc + (e * s.groups + g) * s.d_out;
    const uint8_t* zg = zs + (e * s.groups + g) * s.d_out;
    float x_sum = 0.0f;
    for (int64_t i = g * s.group_size; i < (g + 1) * s.group_size; ++i) x_sum += xr[i];
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 x_sums = _mm512_set1_ps(x_sum);
    for (; j + kBlock <= s.d_out; j += kBlock) {
      __m512 acc[4];
      BlockSums(s, xr, rows, g, j, [](__m512i c) { return _mm512_cvtepi32_ps(c); }, acc);
      for (int k = 0; k < 4; ++k) {
        const int64_t jk = j + 16 * k;
        const __m512 z = _mm512_cvtepi32_ps(Lanes(zg + jk));
        const __m512 part =
            _mm512_mul_ps(_mm512_loadu_ps(sg + jk), _mm512_fnmadd_ps(z, x_sums, acc[k]));
        _mm512_storeu_ps(yr + jk, _mm512_add_ps(_mm512_loadu_ps(yr + jk), part));
      }
    }
#endif
    for (; j < s.d_out; ++j) {
      const float acc = ColumnSum(s, xr, rows, g, j, [](uint8_t c) { return float(c); });
      yr[j] += sg[j] * (acc - static_cast<float>(zg[j]) * x_sum);
    }
  };
  return ForEachRowGroup(s, x.typed_data(), row_expert.typed_data(), y->typed_data(), block);
}

ffi::Error LookupImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> indices,
                      ffi::Buffer<ffi::F32> centroids, ffi::Buffer<ffi::S32> row_expert,
                      ffi::ResultBuffer<ffi::F32> y) {
  Shapes s;
  ffi::Error err = CheckShapes(x.dimensions(), indices.dimensions(), centroids.dimensions(),
                               row_expert.element_count(), &s);
  if (err.failure()) return err;
  const int64_t levels = centroids.dimensions()[2];
  if (levels < 1 || levels > 256) {
    return ffi::Error::InvalidArgument("gathered lookup matmul: 1 to 256 centroids per group");
  }
  const uint8_t* idx = indices.typed_data();
  const float* cent = centroids.typed_data();
  auto block = [&](int64_t e, const float* xr, float* yr, int64_t g) {
    const float* book = cent + (e * s.groups + g) * levels;
    const uint8_t* rows = idx + e * s.d_in * s.d_out;
    int64_t j = 0;
#if defined(__AVX512F__)
    if (levels <= 16) {  // the group's codebook in one register, looked up by a permute
      const __m512 table =
          _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << levels) - 1), book);
      for (; j + kBlock <= s.d_out; j += kBlock) {
        __m512 acc[4];
        BlockSums(s, xr, rows, g, j, [&](__m512i c) { return _mm512_permutexvar_ps(c, table); },
                  acc);
        for (int k = 0; k < 4; ++k) {
          float* yk = yr + j + 16 * k;
          _mm512_storeu_ps(yk, _mm512_add_ps(_mm512_loadu_ps(yk), acc[k]));
        }
      }
    }
#endif
    for (; j < s.d_out; ++j) yr[j] += ColumnSum(s, xr, rows, g, j, [&](uint8_t c) { return book[c]; });
  };
  return ForEachRowGroup(s, x.typed_data(), row_expert.typed_data(), y->typed_data(), block);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MoejaxGatheredAffineMatmul, AffineImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MoejaxGatheredLookupMatmul, LookupImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
