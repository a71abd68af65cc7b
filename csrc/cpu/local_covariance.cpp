// Local curvature kernel: for each row, the top eigenvalue of the covariance of its k-NN
// neighbourhood (the row and its k neighbours, centred at their mean, normalised by k + 1),
// computed from the (k+1) x (k+1) Gram matrix, never from a D x D matrix.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
using std::size_t;
namespace {

// Upper triangle of the Gram matrix G = C C^T of m centred rows of length D, four dot products
// per pass over a row so each row is loaded from cache once per four partners.
__attribute__((target_clones("avx512f", "avx2", "default")))
void gram_upper(const double* C, int m, int64_t D, double* G) {
  for (int a = 0; a < m; ++a) {
    const double* ca = C + size_t(a) * size_t(D);
    int b = a;
    for (; b + 3 < m; b += 4) {
      const double *c0 = C + size_t(b) * size_t(D), *c1 = c0 + D, *c2 = c1 + D, *c3 = c2 + D;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t j = 0; j < D; ++j) {
        s0 += ca[j] * c0[j];
        s1 += ca[j] * c1[j];
        s2 += ca[j] * c2[j];
        s3 += ca[j] * c3[j];
      }
      G[a * m + b] = s0, G[a * m + b + 1] = s1, G[a * m + b + 2] = s2, G[a * m + b + 3] = s3;
    }
    for (; b < m; ++b) {
      const double* cb = C + size_t(b) * size_t(D);
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < D; ++j) s += ca[j] * cb[j];
      G[a * m + b] = s;
    }
  }
}

}  // namespace

template <typename T>
void local_top_eigenvalues(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out) {
  DIHAL_NVTX_RANGE("dihal/local_eigen");
  const int m = int(k + 1);
#pragma omp parallel if(parallel_worth(double(n) * double(m) * double(m) * double(D)))
  {
    std::vector<double> C(size_t(m) * size_t(D)), G(size_t(m) * size_t(m)), mean(D);
#pragma omp for schedule(dynamic, 8)
    for (int64_t i = 0; i < n; ++i) {
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int a = 0; a < m; ++a) {
        const int64_t row = a == 0 ? i : idx[i * k + (a - 1)];
        const T* x = X + row * D;
        double* c = C.data() + size_t(a) * size_t(D);
        for (int64_t j = 0; j < D; ++j) {
          c[j] = double(x[j]);
          mean[j] += c[j];
        }
      }
      for (int64_t j = 0; j < D; ++j) mean[j] /= double(m);
      for (int a = 0; a < m; ++a) {
        double* c = C.data() + size_t(a) * size_t(D);
        for (int64_t j = 0; j < D; ++j) c[j] -= mean[j];
      }
      gram_upper(C.data(), m, D, G.data());
      for (int a = 0; a < m; ++a)
        for (int b = a + 1; b < m; ++b) G[size_t(b * m + a)] = G[size_t(a * m + b)];
      out[i] = top_eigenvalue_small(G.data(), m) / double(m);
    }
  }
}

template void local_top_eigenvalues<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, double*);
template void local_top_eigenvalues<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, double*);

}  // namespace dihal
