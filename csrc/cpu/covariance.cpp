// Streaming covariance: blocks of rows shifted by the running mean, SYRK in a working precision W
// (the input's for streaming, float64 or float32 for the one-shot proxies), Chan's pairwise merge
// of (count, mean, co-moment) in float64. A float32 block is scaled by a power of two to max |x - shift|
// in [1, 2) before its SYRK (exact; undone exactly in the merge), so that its products neither overflow
// (rows of 1e19 square to 1e38) nor underflow (rows of 1e-22 square to float32 subnormals).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
namespace {

// Rows per block: about 64 MiB of centred input, at least 1024 rows, at most 16384.
int64_t block_rows(int64_t D, size_t elem) {
  const int64_t target = (int64_t(64) << 20) / std::max<int64_t>(1, D * int64_t(elem));
  return std::clamp<int64_t>(target, 1024, 16384);
}

// max |x - shift| over the rows of a block (float64).
template <typename T>
double max_shifted(const T* X, int64_t rows, int64_t D, const double* shift) {
  double best = 0.0;
#pragma omp parallel for schedule(static) reduction(max : best) if(parallel_worth(double(rows) * double(D)))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c) best = std::max(best, std::fabs(double(X[r * D + c]) - shift[c]));
  return best;
}

// Writes Y = (X - shift) * scale (rounded to W) and returns the column sums of X - shift in float64: one pass.
template <typename T, typename W>
void shift_rows(const T* X, int64_t rows, int64_t D, const double* shift, double scale, W* Y, double* sums) {
  std::fill(sums, sums + D, 0.0);
#pragma omp parallel if(parallel_worth(double(rows) * double(D)))
  {
    std::vector<double> local(D, 0.0);
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = X + r * D;
      W* y = Y + r * D;
      for (int64_t c = 0; c < D; ++c) {
        const double v = double(x[c]) - shift[c];
        y[c] = W(v * scale);
        local[c] += v;
      }
    }
#pragma omp critical
    for (int64_t c = 0; c < D; ++c) sums[c] += local[c];
  }
}

// assign: M holds no co-moment yet (count 0, contents undefined): the first block writes it.
// scale_blocks: scale float32 blocks to unit magnitude (the one-shot proxies' rows come pre-scaled).
template <typename T, typename W>
void covariance_update_in(const T* X, int64_t n, int64_t D, int64_t* count, double* mean, double* M, bool assign,
                          bool scale_blocks) {
  if (n <= 0) return;
  const int64_t block = block_rows(D, sizeof(W));
  std::vector<W> shifted(size_t(std::min(block, n)) * size_t(D));
  std::vector<W> gram(size_t(D) * size_t(D));
  std::vector<double> shift(D), delta(D), sums(D);

  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const T* Xb = X + r0 * D;
    // Shift by the running mean (or the block's first row) so the working-precision SYRK sees
    // small, centred-ish values; the block co-moment about its own mean is then
    // C_shift - rows * (m_b - shift)(m_b - shift)^T.
    for (int64_t c = 0; c < D; ++c) shift[c] = *count > 0 ? mean[c] : double(Xb[c]);
    const double largest = std::is_same_v<W, float> && scale_blocks ? max_shifted(Xb, rows, D, shift.data()) : 0.0;
    const double scale = largest > 0.0 ? std::ldexp(1.0, -std::ilogb(largest)) : 1.0;
    const double unscale = 1.0 / (scale * scale);  // a power of two: exact
    shift_rows(Xb, rows, D, shift.data(), scale, shifted.data(), sums.data());
    blas::gram_upper_t(int(D), int(rows), shifted.data(), gram.data());

    const double na = double(*count), nb = double(rows), ntot = na + nb;
    const double w = na * nb / ntot;
    // offset = m_b - shift; delta = m_b - mean
    std::vector<double>& offset = sums;
    for (int64_t c = 0; c < D; ++c) {
      offset[c] /= nb;
      delta[c] = shift[c] + offset[c] - mean[c];
    }
#pragma omp parallel for schedule(dynamic, 16) if(parallel_worth(double(D) * double(D)))
    for (int64_t a = 0; a < D; ++a) {
      const double oa = offset[a] * nb, da = delta[a] * w;
      double* Ma = M + a * D;
      const W* Ga = gram.data() + a * D;
      if (assign && r0 == 0)
        for (int64_t b = a; b < D; ++b) Ma[b] = double(Ga[b]) * unscale - oa * offset[b] + da * delta[b];
      else
        for (int64_t b = a; b < D; ++b) Ma[b] += double(Ga[b]) * unscale - oa * offset[b] + da * delta[b];
    }
    for (int64_t c = 0; c < D; ++c) mean[c] += delta[c] * (nb / ntot);
    *count += rows;
  }
}

}  // namespace

template <typename T>
void covariance_update(const T* X, int64_t n, int64_t D, int64_t* count, double* mean, double* M) {
  DIHAL_NVTX_RANGE("dihal/covariance");
  covariance_update_in<T, T>(X, n, D, count, mean, M, false, true);
}

template <typename T>
void covariance(const T* X, int64_t n, int64_t D, bool float32_work, double* mean, double* cov) {
  DIHAL_NVTX_RANGE("dihal/covariance");
  int64_t count = 0;
  std::fill(mean, mean + D, 0.0);
  if (float32_work)
    covariance_update_in<T, float>(X, n, D, &count, mean, cov, true, false);
  else
    covariance_update_in<T, double>(X, n, D, &count, mean, cov, true, false);
  // Divide by n and mirror the upper triangle, by B x B blocks (a cache-friendly transpose).
  constexpr int64_t B = 128;
  const int64_t nb = (D + B - 1) / B;
#pragma omp parallel for schedule(dynamic, 1) if(parallel_worth(double(D) * double(D)))
  for (int64_t t = 0; t < nb * (nb + 1) / 2; ++t) {
    int64_t I = 0, rest = t;  // t-th block (I, J), J >= I, row by row
    while (rest >= nb - I) rest -= nb - I++;
    const int64_t a0 = I * B, b0 = (I + rest) * B;
    const int64_t a1 = std::min(a0 + B, D), b1 = std::min(b0 + B, D);
    for (int64_t a = a0; a < a1; ++a)
      for (int64_t b = std::max(a, b0); b < b1; ++b) cov[b * D + a] = cov[a * D + b] /= double(n);
  }
}

template void covariance_update<float>(const float*, int64_t, int64_t, int64_t*, double*, double*);
template void covariance_update<double>(const double*, int64_t, int64_t, int64_t*, double*, double*);
template void covariance<float>(const float*, int64_t, int64_t, bool, double*, double*);
template void covariance<double>(const double*, int64_t, int64_t, bool, double*, double*);

namespace {

// Largest |x| of X[0..size) in T (exact: |x| and the comparisons round nothing), and whether it holds a NaN.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
T max_abs_part(const T* X, int64_t size, int* nan) {
  T best = T(0);
  int any_nan = 0;
#pragma omp simd reduction(max : best) reduction(| : any_nan)
  for (int64_t i = 0; i < size; ++i) {
    const T v = std::fabs(X[i]);
    any_nan |= int(v != v);
    best = v > best ? v : best;
  }
  *nan = any_nan;
  return best;
}

}  // namespace

template <typename T>
double max_abs(const T* X, int64_t size) {
  double best = 0.0;
  bool nan = false;
  constexpr int64_t kPart = int64_t(1) << 16;
  const int64_t parts = (size + kPart - 1) / kPart;
#pragma omp parallel for schedule(static) reduction(max : best) reduction(|| : nan) if(parallel_worth(double(size)))
  for (int64_t p = 0; p < parts; ++p) {
    int part_nan = 0;
    const double v = double(max_abs_part(X + p * kPart, std::min(kPart, size - p * kPart), &part_nan));
    nan = nan || part_nan;
    best = v > best ? v : best;
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : best;
}

template double max_abs<float>(const float*, int64_t);
template double max_abs<double>(const double*, int64_t);

int num_threads() { return omp_get_max_threads(); }

}  // namespace dihal
