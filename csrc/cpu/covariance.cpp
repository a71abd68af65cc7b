// Streaming covariance: blocks of rows centred at their own mean, SYRK in the input precision,
// Chan's pairwise merge of (count, mean, co-moment) in float64.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"

namespace dihal {
namespace {

// Rows per block: about 64 MiB of centred input, at least 1024 rows, at most 16384.
int64_t block_rows(int64_t D, size_t elem) {
  const int64_t target = (int64_t(64) << 20) / std::max<int64_t>(1, D * int64_t(elem));
  return std::clamp<int64_t>(target, 1024, 16384);
}

template <typename T>
void block_mean(const T* X, int64_t rows, int64_t D, double* mean) {
  std::fill(mean, mean + D, 0.0);
#pragma omp parallel
  {
    std::vector<double> local(D, 0.0);
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = X + r * D;
      for (int64_t c = 0; c < D; ++c) local[c] += double(x[c]);
    }
#pragma omp critical
    for (int64_t c = 0; c < D; ++c) mean[c] += local[c];
  }
  for (int64_t c = 0; c < D; ++c) mean[c] /= double(rows);
}

}  // namespace

template <typename T>
void covariance_update(const T* X, int64_t n, int64_t D, int64_t* count, double* mean, double* M) {
  if (n <= 0) return;
  const int64_t block = block_rows(D, sizeof(T));
  std::vector<T> centred(size_t(std::min(block, n)) * size_t(D));
  std::vector<T> gram(size_t(D) * size_t(D));
  std::vector<double> bmean(D);

  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const T* Xb = X + r0 * D;
    block_mean(Xb, rows, D, bmean.data());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < D; ++c) centred[size_t(r * D + c)] = T(double(Xb[r * D + c]) - bmean[c]);
    blas::syrk_upper_t(int(D), int(rows), centred.data(), gram.data());

    const double na = double(*count), nb = double(rows), ntot = na + nb;
    const double w = na * nb / ntot;
    std::vector<double> delta(D);
    for (int64_t c = 0; c < D; ++c) delta[c] = bmean[c] - mean[c];
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t a = 0; a < D; ++a) {
      const double da = delta[a] * w;
      double* Ma = M + a * D;
      const T* Ga = gram.data() + a * D;
      for (int64_t b = a; b < D; ++b) Ma[b] += double(Ga[b]) + da * delta[b];
    }
    for (int64_t c = 0; c < D; ++c) mean[c] += delta[c] * (nb / ntot);
    *count += rows;
  }
}

template void covariance_update<float>(const float*, int64_t, int64_t, int64_t*, double*, double*);
template void covariance_update<double>(const double*, int64_t, int64_t, int64_t*, double*, double*);

int num_threads() { return omp_get_max_threads(); }

}  // namespace dihal
