// Host emulation of the CUDA kNN pipeline (csrc/cuda/knn.cu): the same shared logic
// (csrc/knn_logic.hpp), block sizes and splits, with the GPU's parallel parts (tile GEMM, exact
// distances) as plain loops. It lets the tests check the candidate lists, their merge, the re-rank
// and the certification of the GPU kernels on any machine; it is not a fast path.
#include "knn_emulation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "knn_logic.hpp"

namespace dihal {
namespace {

namespace kl = knn_logic;

template <typename W>
EmulatedKnn emulate(const W* X, int64_t n, int64_t D, int64_t k, int64_t query_block, int64_t ref_block,
                    int64_t splits) {
  const int64_t cap = kl::capacity(n, k);
  const kl::Scaled<W> s = kl::centre_and_scale<W, W>(X, n, D, false);
  const double rel = kl::rel_bound(D, double(std::numeric_limits<W>::epsilon()) / 2);

  EmulatedKnn result{std::vector<int64_t>(size_t(n * k)), std::vector<double>(size_t(n * k)),
                     std::vector<int32_t>(n)};
  for (int64_t q0 = 0; q0 < n; q0 += query_block) {
    const int64_t nq = std::min(query_block, n - q0);
    std::vector<W> list_d(size_t(nq * splits * cap)), merged_d(size_t(nq * cap));
    std::vector<int32_t> list_i(list_d.size()), merged_i(merged_d.size());
    for (int64_t e = 0; e < nq * splits; ++e)
      kl::CandidateList<W, int32_t>{&list_d[e * cap], &list_i[e * cap], int(cap)}.clear();
    for (int64_t r0 = 0; r0 < n; r0 += ref_block) {
      const int64_t nr = std::min(ref_block, n - r0);
      std::vector<W> tile(size_t(nq * nr));  // column-major, as cuBLAS writes it
      for (int64_t j = 0; j < nr; ++j)
        for (int64_t q = 0; q < nq; ++q) {
          W acc = 0;
          for (int64_t c = 0; c < D; ++c) acc += s.centred[size_t((q0 + q) * D + c)] * s.centred[size_t((r0 + j) * D + c)];
          tile[size_t(j * nq + q)] = acc;
        }
      for (int64_t t = 0; t < nq * splits; ++t) {  // the scan kernel's threads
        const int64_t q = t % nq, part = t / nq, slot = (q * splits + part) * cap;
        const kl::CandidateList<W, int32_t> list{&list_d[slot], &list_i[slot], int(cap)};
        kl::scan_tile(tile.data() + q, nq, s.norms[q0 + q], s.norms.data() + r0, r0, nr * part / splits,
                      nr * (part + 1) / splits, q0 + q, list);
      }
    }
    for (int64_t q = 0; q < nq; ++q) {  // merge and re-rank kernels
      const kl::CandidateList<W, int32_t> out{&merged_d[q * cap], &merged_i[q * cap], int(cap)};
      kl::merge_lists(&list_d[q * splits * cap], &list_i[q * splits * cap], int(splits), int(cap), out);
      const int64_t i = q0 + q;
      std::vector<double> exact(cap);
      for (int64_t e = 0; e < cap; ++e) {
        const int32_t j = out.idx[e];
        double sum = j >= 0 ? 0.0 : INFINITY;
        for (int64_t c = 0; j >= 0 && c < D; ++c) {
          const double d = double(X[i * D + c]) - double(X[int64_t(j) * D + c]);
          sum += d * d;
        }
        exact[e] = sum;
      }
      const double bound = kl::distance_bound(rel, double(s.norms[i]), s.max_norm2);
      for (int64_t e = 0; e < cap; ++e) {
        const int r = kl::rank_of(exact.data(), out.idx, int(cap), int(e));
        if (r < k) {
          result.idx[size_t(i * k + r)] = out.idx[e];
          result.sqdist[size_t(i * k + r)] = exact[e];
        }
        if (r == k - 1)
          result.flags[i] =
              kl::certified(cap == n - 1, exact[e] * s.scale * s.scale, double(out.threshold()), bound) ? 0 : 1;
      }
    }
  }
  return result;
}

}  // namespace

EmulatedKnn emulate_cuda_knn(const void* X, bool is_double, int64_t n, int64_t D, int64_t k, int64_t query_block,
                             int64_t ref_block, int64_t splits) {
  if (n < 2 || D < 1 || k < 1 || k >= n) throw std::invalid_argument("emulate_cuda_knn: need n >= 2, D >= 1, 1 <= k < n");
  if (query_block < 1 || ref_block < 1 || splits < 1 || splits > 64)
    throw std::invalid_argument("emulate_cuda_knn: blocks must be positive and 1 <= splits <= 64");
  return is_double ? emulate(static_cast<const double*>(X), n, D, k, query_block, ref_block, splits)
                   : emulate(static_cast<const float*>(X), n, D, k, query_block, ref_block, splits);
}

}  // namespace dihal
