// Host emulation of the CUDA kNN pipeline (csrc/cuda/knn.cu): the same shared logic
// (csrc/knn_logic.hpp: planner, candidate lists, merge, certificate), the same per-tile centring of
// float16/bfloat16/float32/float64 rows into the working type, and a tile GEMM that accumulates in
// the working type with one fused multiply-add per term in order (one cuBLAS thread's sequential
// accumulation). The GPU's parallel parts are plain loops; flagged rows are recomputed exactly as
// backend_cuda does. It lets the tests check the GPU pipeline on any machine; it is not a fast path.
#include "knn_emulation.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace dihal {
namespace {

namespace kl = knn_logic;

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// IEEE binary16 to double (exact), as __half2float.
double to_double(Half h) {
  const int sign = h.bits >> 15, exp = (h.bits >> 10) & 0x1f, frac = h.bits & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(double(frac), -24);
  else if (exp == 31)
    v = frac ? NAN : INFINITY;
  else
    v = std::ldexp(double(frac | 0x400), exp - 25);
  return sign ? -v : v;
}
double to_double(BFloat16 b) {
  const uint32_t bits = uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return double(f);
}
double to_double(float x) { return double(x); }
double to_double(double x) { return x; }

double sqdist_rows(const double* a, const double* b, int64_t D) {
  double s = 0.0;
  for (int64_t c = 0; c < D; ++c) {
    const double d = a[c] - b[c];
    s += d * d;
  }
  return s;
}

template <typename T, typename W>
EmulatedKnn emulate(const T* X, int64_t n, int64_t D, int64_t k, const kl::Tiling& tiling, int64_t splits) {
  kl::Plan p = kl::make_plan(n, k, int64_t(sizeof(W) + sizeof(int32_t)), tiling);
  if (splits > 0) p.splits = splits;
  const int64_t cap = p.cap;
  const kl::ErrorModel model = kl::gemm_model(D, std::is_same_v<W, double>);
  // The rows as the kernels read them (to_double of the input type).
  std::vector<double> Xd(size_t(n * D));
  for (int64_t e = 0; e < n * D; ++e) Xd[size_t(e)] = to_double(X[e]);
  // prepare(): column means, the power-of-two scale, the norms of the centred rows.
  std::vector<double> mean(size_t(D), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) mean[size_t(c)] += Xd[size_t(r * D + c)];
  for (double& m : mean) m /= double(n);
  double max_abs = 0.0;
  for (int64_t e = 0; e < n * D; ++e) max_abs = std::max(max_abs, std::fabs(Xd[size_t(e)] - mean[size_t(e % D)]));
  EmulatedKnn out;
  out.scale = kl::pow2_scale(max_abs);
  out.plan = p;
  const auto centred = [&](int64_t row, int64_t c) { return W((Xd[size_t(row * D + c)] - mean[size_t(c)]) * out.scale); };
  std::vector<W> norms(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < D; ++c) s += double(centred(r, c)) * double(centred(r, c));
    norms[size_t(r)] = W(s);
    out.max_norm2 = std::max(out.max_norm2, s);
  }
  out.idx.assign(size_t(n * k), -1);
  out.sqdist.assign(size_t(n * k), 0.0);
  out.cand_idx.assign(size_t(n * k), -1);
  out.flags.assign(size_t(n), 1);
  out.threshold.assign(size_t(n), INFINITY);
  out.kth_scaled.assign(size_t(n), INFINITY);
  out.norms.assign(norms.begin(), norms.end());

  std::vector<W> qrows(size_t(p.query_block * D)), rrows(size_t(p.ref_block * D)), tile(size_t(p.query_block * p.ref_block));
  std::vector<W> list_d(size_t(p.query_block * p.splits * cap)), merged_d(size_t(p.query_block * cap));
  std::vector<int32_t> list_i(list_d.size()), merged_i(merged_d.size());
  const auto centre_rows = [&](int64_t row0, int64_t rows, std::vector<W>& dst) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < D; ++c) dst[size_t(r * D + c)] = centred(row0 + r, c);
  };
  for (int64_t q0 = 0; q0 < n; q0 += p.query_block) {
    const int64_t nq = std::min(p.query_block, n - q0);
    for (int64_t e = 0; e < nq * p.splits; ++e)
      kl::CandidateList<W, int32_t>{&list_d[size_t(e * cap)], &list_i[size_t(e * cap)], int(cap)}.clear();
    centre_rows(q0, nq, qrows);
    for (int64_t r0 = 0; r0 < n; r0 += p.ref_block) {
      const int64_t nr = std::min(p.ref_block, n - r0);
      const bool same = r0 == q0 && nr == nq;
      if (!same) centre_rows(r0, nr, rrows);
      const std::vector<W>& ref = same ? qrows : rrows;
      for (int64_t j = 0; j < nr; ++j)  // column-major nq x nr, as cuBLAS writes it
        for (int64_t q = 0; q < nq; ++q) {
          W acc = 0;
          for (int64_t c = 0; c < D; ++c) acc = std::fma(qrows[size_t(q * D + c)], ref[size_t(j * D + c)], acc);
          tile[size_t(j * nq + q)] = acc;
        }
      for (int64_t t = 0; t < nq * p.splits; ++t) {  // the scan kernel's threads
        const int64_t q = t % nq, part = t / nq, slot = (q * p.splits + part) * cap;
        const kl::CandidateList<W, int32_t> list{&list_d[size_t(slot)], &list_i[size_t(slot)], int(cap)};
        kl::scan_tile(tile.data() + q, nq, norms[size_t(q0 + q)], norms.data() + r0, r0, nr * part / p.splits,
                      nr * (part + 1) / p.splits, q0 + q, list);
      }
    }
    std::vector<double> exact(static_cast<size_t>(cap));
    for (int64_t q = 0; q < nq; ++q) {  // merge and re-rank kernels
      const kl::CandidateList<W, int32_t> merged{&merged_d[size_t(q * cap)], &merged_i[size_t(q * cap)], int(cap)};
      kl::merge_lists(&list_d[size_t(q * p.splits * cap)], &list_i[size_t(q * p.splits * cap)], int(p.splits), int(cap),
                      merged);
      const int64_t i = q0 + q;
      for (int64_t e = 0; e < cap; ++e) {
        const int32_t j = merged.idx[e];
        exact[size_t(e)] = j >= 0 ? sqdist_rows(&Xd[size_t(i * D)], &Xd[size_t(int64_t(j) * D)], D) : INFINITY;
      }
      out.threshold[size_t(i)] = double(merged.threshold());
      for (int64_t e = 0; e < cap; ++e) {
        const int r = kl::rank_of(exact.data(), merged.idx, int(cap), int(e));
        if (r < k) {
          out.idx[size_t(i * k + r)] = out.cand_idx[size_t(i * k + r)] = merged.idx[e];
          out.sqdist[size_t(i * k + r)] = exact[size_t(e)];
        }
        if (r == k - 1) {
          const double kth = exact[size_t(e)] * out.scale * out.scale;
          out.kth_scaled[size_t(i)] = kth;
          const double limit = kl::certify_limit(model, kth, double(norms[size_t(i)]), out.max_norm2);
          out.flags[size_t(i)] = kl::certified(cap == n - 1, out.threshold[size_t(i)], limit) ? 0 : 1;
        }
      }
    }
  }
  // backend_cuda's fallback: flagged rows from exact distances to all rows, ties to the lower index.
  std::vector<std::pair<double, int64_t>> all;
  for (int64_t i = 0; i < n; ++i) {
    if (!out.flags[size_t(i)]) continue;
    all.clear();
    for (int64_t j = 0; j < n; ++j)
      if (j != i) all.emplace_back(sqdist_rows(&Xd[size_t(i * D)], &Xd[size_t(j * D)], D), j);
    std::stable_sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (int64_t c = 0; c < k; ++c) {
      out.idx[size_t(i * k + c)] = all[size_t(c)].second;
      out.sqdist[size_t(i * k + c)] = all[size_t(c)].first;
    }
  }
  return out;
}

}  // namespace

EmulatedKnn emulate_cuda_knn(const void* X, EmulatedInput input, int64_t n, int64_t D, int64_t k,
                             const kl::Tiling& tiling, int64_t splits) {
  if (n < 2 || D < 1 || k < 1 || k >= n) throw std::invalid_argument("emulate_cuda_knn: need n >= 2, D >= 1, 1 <= k < n");
  if (tiling.query_block < 1 || tiling.ref_block < 1 || tiling.target_threads < 1 || tiling.max_splits < 1 ||
      tiling.max_splits > 64 || tiling.list_bytes < 1)
    throw std::invalid_argument("emulate_cuda_knn: tiling sizes must be positive and max_splits <= 64");
  if (splits < 0 || splits > 64) throw std::invalid_argument("emulate_cuda_knn: splits must be 0 (the planner's) or 1..64");
  switch (input) {
    case EmulatedInput::kFloat16: return emulate<Half, float>(static_cast<const Half*>(X), n, D, k, tiling, splits);
    case EmulatedInput::kBFloat16: return emulate<BFloat16, float>(static_cast<const BFloat16*>(X), n, D, k, tiling, splits);
    case EmulatedInput::kFloat32: return emulate<float, float>(static_cast<const float*>(X), n, D, k, tiling, splits);
    case EmulatedInput::kFloat64: return emulate<double, double>(static_cast<const double*>(X), n, D, k, tiling, splits);
  }
  throw std::invalid_argument("emulate_cuda_knn: unknown input type");
}

}  // namespace dihal
