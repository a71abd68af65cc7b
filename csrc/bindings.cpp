// pybind11 entry points of the CPU core. Argument checking that users see happens in Python
// (dihal_fast.geometry); here arrays arrive C-contiguous with the right dtype, and the checks
// below only guard the kernels against misuse from other callers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "blas.hpp"
#include "covariance_scale.hpp"
#include "cpu/knn_emulation.hpp"
#include "jacobi.hpp"
#include "kernels.hpp"

namespace py = pybind11;
using std::int64_t;

namespace {

template <typename T>
using CArray = py::array_t<T, py::array::c_style>;

template <typename T>
void require_matrix(const CArray<T>& X, const char* name) {
  if (X.ndim() != 2) throw std::invalid_argument(std::string(name) + " must be 2-D, got ndim=" + std::to_string(X.ndim()));
  if (X.shape(0) < 1 || X.shape(1) < 1) throw std::invalid_argument(std::string(name) + " must be non-empty");
}

// Pair index arrays: 1-D, of equal length, within [0, n). Returns the number of pairs.
int64_t check_pairs(const CArray<int64_t>& pi, const CArray<int64_t>& pj, int64_t n) {
  if (pi.ndim() != 1 || pj.ndim() != 1 || pi.shape(0) != pj.shape(0))
    throw std::invalid_argument("pair index arrays must be 1-D and of equal length");
  const int64_t P = pi.shape(0);
  const int64_t *a = pi.data(), *b = pj.data();
  for (int64_t p = 0; p < P; ++p)
    if (a[p] < 0 || a[p] >= n || b[p] < 0 || b[p] >= n || a[p] == b[p])
      throw std::invalid_argument("pair index out of range or i == j");
  return P;
}

template <typename T>
int64_t covariance_update(CArray<T> X, int64_t count, CArray<double> mean, CArray<double> comoment) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  if (mean.ndim() != 1 || mean.shape(0) != D || comoment.ndim() != 2 || comoment.shape(0) != D || comoment.shape(1) != D)
    throw std::invalid_argument("mean/comoment do not match the dimension of X");
  const T* x = X.data();
  double* m = mean.mutable_data();
  double* M = comoment.mutable_data();
  py::gil_scoped_release release;
  dihal::covariance_update<T>(x, n, D, &count, m, M);
  return count;
}

template <typename T>
py::tuple covariance(CArray<T> X, bool float32_work) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  CArray<double> mean(D), cov({D, D});
  const T* x = X.data();
  double *m = mean.mutable_data(), *c = cov.mutable_data();
  {
    py::gil_scoped_release release;
    dihal::covariance<T>(x, n, D, float32_work, m, c);
  }
  return py::make_tuple(mean, cov);
}

template <typename T>
CArray<double> centred_gram(CArray<T> X, bool float32_work) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  CArray<double> G({n, n});
  const T* x = X.data();
  double* g = G.mutable_data();
  {
    py::gil_scoped_release release;
    dihal::centred_gram<T>(x, n, D, float32_work, g);
  }
  return G;
}

template <typename T>
CArray<double> gram_pair_quotients(CArray<T> X, CArray<double> G, double lam, CArray<int64_t> pi, CArray<int64_t> pj) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  if (G.ndim() != 2 || G.shape(0) != n || G.shape(1) != n) throw std::invalid_argument("G must be n x n");
  const int64_t P = check_pairs(pi, pj, n);
  CArray<double> out(P);
  const T* x = X.data();
  const double* g = G.data();
  const int64_t *a = pi.data(), *b = pj.data();
  double* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    dihal::gram_pair_quotients<T>(x, n, D, g, lam, a, b, P, po);
  }
  return out;
}

// (indices n x k, squared distances n x k) filled by search(indices, sqdist) without the GIL.
template <typename Search>
py::tuple neighbours(int64_t n, int64_t k, Search&& search) {
  if (k < 1 || k >= n) throw std::invalid_argument("k must satisfy 1 <= k < n");
  CArray<int64_t> idx({n, k});
  CArray<double> d2({n, k});
  int64_t* pi = idx.mutable_data();
  double* pd = d2.mutable_data();
  {
    py::gil_scoped_release release;
    search(pi, pd);
  }
  return py::make_tuple(idx, d2);
}

template <typename T>
py::tuple knn(CArray<T> X, int64_t k, bool symmetric, bool count_recomputed) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  const T* x = X.data();
  int64_t recomputed = 0;
  py::tuple out = neighbours(n, k, [&](int64_t* pi, double* pd) { dihal::knn<T>(x, n, D, k, pi, pd, symmetric, &recomputed); });
  return count_recomputed ? py::make_tuple(out[0], out[1], recomputed) : out;
}

template <typename T>
py::tuple knn_from_gram(CArray<T> X, CArray<double> G, int64_t k) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  if (G.ndim() != 2 || G.shape(0) != n || G.shape(1) != n) throw std::invalid_argument("G must be n x n");
  const T* x = X.data();
  const double* g = G.data();
  return neighbours(n, k, [&](int64_t* pi, double* pd) { dihal::knn_from_gram<T>(x, n, D, g, k, pi, pd); });
}

template <typename T>
CArray<double> local_top_eigenvalues(CArray<T> X, CArray<int64_t> idx, bool float32_work) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  if (idx.ndim() != 2 || idx.shape(0) != n) throw std::invalid_argument("indices must have shape (n, k)");
  const int64_t k = idx.shape(1);
  const int64_t* pi = idx.data();
  for (int64_t i = 0; i < n * k; ++i)
    if (pi[i] < 0 || pi[i] >= n) throw std::invalid_argument("neighbour index out of range");
  CArray<double> out(n);
  const T* x = X.data();
  double* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    dihal::local_top_eigenvalues<T>(x, n, D, pi, k, po, float32_work);
  }
  return out;
}

template <typename T>
CArray<double> pair_quotients(CArray<T> X, CArray<double> mean, CArray<double> S, double lam, CArray<int64_t> pi,
                              CArray<int64_t> pj, bool float32_work) {
  require_matrix(X, "X");
  const int64_t n = X.shape(0), D = X.shape(1);
  if (mean.ndim() != 1 || mean.shape(0) != D || S.ndim() != 2 || S.shape(0) != D || S.shape(1) != D)
    throw std::invalid_argument("mean/covariance do not match the dimension of X");
  const int64_t P = check_pairs(pi, pj, n);
  const int64_t *a = pi.data(), *b = pj.data();
  CArray<double> out(P);
  const T* x = X.data();
  const double *m = mean.data(), *s = S.data();
  double* po = out.mutable_data();
  {
    py::gil_scoped_release release;
    dihal::pair_quotients<T>(x, n, D, m, s, lam, a, b, P, po, float32_work);
  }
  return out;
}

py::tuple top_eigenvalue_psd(CArray<double> S, double rel_tol, bool float32_work) {
  if (S.ndim() != 2 || S.shape(0) != S.shape(1) || S.shape(0) < 1)
    throw std::invalid_argument("S must be a non-empty square matrix");
  const double* s = S.data();
  const int64_t D = S.shape(0);
  int iterations = 0;
  double value;
  {
    py::gil_scoped_release release;
    value = dihal::top_eigenvalue_psd(s, D, rel_tol, &iterations, float32_work);
  }
  return py::make_tuple(value, iterations);
}

double top_eigenvalue_small(CArray<double> A) {
  if (A.ndim() != 2 || A.shape(0) != A.shape(1) || A.shape(0) < 1)
    throw std::invalid_argument("A must be a non-empty square matrix");
  std::vector<double> work(A.data(), A.data() + A.size());
  return dihal::top_eigenvalue_small(work.data(), int(A.shape(0)));
}

template <typename T>
double max_abs(CArray<T> X) {
  const T* x = X.data();
  const int64_t size = X.size();
  py::gil_scoped_release release;
  return dihal::max_abs<T>(x, size);
}

// Host emulation of the CUDA kNN kernels (tests of their logic without a GPU): X is a C-contiguous
// float16/float32/float64 matrix, or uint16 holding bfloat16 patterns when bfloat16; the tiling is
// the kernel's unless smaller blocks are given. Returns a dict: idx, sqdist (the final answer, flagged
// rows recomputed exactly), cand_idx (the candidates' answer), flags, threshold, kth_scaled, norms,
// max_norm2, scale and the plan (query_block, ref_block, splits, cap).
py::dict emulate_cuda_knn(py::array X, int64_t k, int64_t query_block, int64_t ref_block, int64_t splits, bool bfloat16) {
  using dihal::EmulatedInput;
  EmulatedInput input;
  if (bfloat16 && py::isinstance<py::array_t<uint16_t>>(X))
    input = EmulatedInput::kBFloat16;
  else if (bfloat16)
    throw py::type_error("bfloat16 rows must be passed as their uint16 bit patterns");
  else if (py::isinstance<py::array_t<double>>(X))
    input = EmulatedInput::kFloat64;
  else if (py::isinstance<py::array_t<float>>(X))
    input = EmulatedInput::kFloat32;
  else if (X.dtype().kind() == 'f' && X.dtype().itemsize() == 2)
    input = EmulatedInput::kFloat16;
  else
    throw py::type_error("X must be float16, float32, float64 or (bfloat16=True) uint16");
  if (X.ndim() != 2 || !(X.flags() & py::array::c_style)) throw std::invalid_argument("X must be a C-contiguous matrix");
  const int64_t n = X.shape(0), D = X.shape(1);
  dihal::knn_logic::Tiling tiling = dihal::knn_logic::kTiling;
  tiling.query_block = query_block;
  tiling.ref_block = ref_block;
  dihal::EmulatedKnn r;
  {
    py::gil_scoped_release release;
    r = dihal::emulate_cuda_knn(X.data(), input, n, D, k, tiling, splits);
  }
  const auto matrix = [n, k](const auto& v) {
    CArray<typename std::decay_t<decltype(v)>::value_type> a({n, k});
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
  };
  const auto vector = [](const auto& v) {
    CArray<typename std::decay_t<decltype(v)>::value_type> a(int64_t(v.size()));
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
  };
  py::dict out;
  out["idx"] = matrix(r.idx);
  out["sqdist"] = matrix(r.sqdist);
  out["cand_idx"] = matrix(r.cand_idx);
  out["flags"] = vector(r.flags);
  out["threshold"] = vector(r.threshold);
  out["kth_scaled"] = vector(r.kth_scaled);
  out["norms"] = vector(r.norms);
  out["max_norm2"] = r.max_norm2;
  out["scale"] = r.scale;
  out["plan"] = py::make_tuple(r.plan.query_block, r.plan.ref_block, r.plan.splits, r.plan.cap);
  return out;
}

// The certificate's limit (csrc/knn_logic.hpp), vectorised over rows: path "gemm32", "gemm64",
// "gram" or "cuvs"; the list threshold must exceed it (tests, and the GEMM fallback of backend_cuda).
py::array_t<double> knn_certify_limit(const std::string& path, int64_t D,
                                      py::array_t<double, py::array::c_style | py::array::forcecast> kth_scaled,
                                      py::array_t<double, py::array::c_style | py::array::forcecast> norm_i,
                                      double max_norm2) {
  namespace kl = dihal::knn_logic;
  if (D < 1) throw std::invalid_argument("D must be >= 1");
  if (kth_scaled.size() != norm_i.size()) throw std::invalid_argument("kth_scaled and norm_i must have the same size");
  kl::ErrorModel m;
  if (path == "gemm32" || path == "gemm64")
    m = kl::gemm_model(D, path == "gemm64");
  else if (path == "gram")
    m = kl::gram_model(D);
  else if (path == "cuvs")
    m = kl::cuvs_model(D);
  else
    throw std::invalid_argument("path must be 'gemm32', 'gemm64', 'gram' or 'cuvs', got '" + path + "'");
  py::array_t<double> out(std::vector<py::ssize_t>(kth_scaled.shape(), kth_scaled.shape() + kth_scaled.ndim()));
  double* po = out.mutable_data();
  const double *pk = kth_scaled.data(), *pn = norm_i.data();
  for (py::ssize_t e = 0; e < kth_scaled.size(); ++e) po[e] = kl::certify_limit(m, pk[e], pn[e], max_norm2);
  return out;
}

// The parallel Jacobi routine of the GPU local-curvature kernel, on the host (its phases in order).
double jacobi_top_eigenvalue(CArray<double> A) {
  if (A.ndim() != 2 || A.shape(0) != A.shape(1) || A.shape(0) < 1 || A.shape(0) > 255)
    throw std::invalid_argument("A must be a square matrix of size 1..255");
  const int m = int(A.shape(0));
  std::vector<double> work(A.data(), A.data() + A.size()), cs(size_t(m + 1));
  int stop = 0;
  return dihal::jacobi_top_eigenvalue_team(work.data(), m, cs.data(), &stop, dihal::SerialTeam{});
}

double covariance_block_scale(double max_abs) {
  if (!std::isfinite(max_abs) || max_abs < 0.0)
    throw std::invalid_argument("max_abs must be a finite number >= 0, got " + std::to_string(max_abs));
  return dihal::covariance_block_scale(max_abs);
}

py::dict build_info() {
  py::dict info;
  info["compiler"] = std::string(__VERSION__);
  info["cxx_standard"] = long(__cplusplus);
  info["openmp_threads"] = dihal::num_threads();
  info["blas"] = "scipy-openblas32";
  info["cuda_compiled"] = bool(DIHAL_CUDA_BUILT);
  return info;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dihal_fast CPU kernels (OpenMP + OpenBLAS)";
  dihal::blas::use_single_threaded_blas();  // all parallelism is OpenMP's (see blas.hpp)
  m.def("covariance_update", &covariance_update<float>, py::arg("X"), py::arg("count"), py::arg("mean"), py::arg("comoment"));
  m.def("covariance_update", &covariance_update<double>, py::arg("X"), py::arg("count"), py::arg("mean"), py::arg("comoment"));
  m.def("covariance", &covariance<float>, py::arg("X"), py::arg("float32_work") = false);
  m.def("covariance", &covariance<double>, py::arg("X"), py::arg("float32_work") = false);
  m.def("centred_gram", &centred_gram<float>, py::arg("X"), py::arg("float32_work") = false);
  m.def("centred_gram", &centred_gram<double>, py::arg("X"), py::arg("float32_work") = false);
  m.def("gram_pair_quotients", &gram_pair_quotients<float>, py::arg("X"), py::arg("G"), py::arg("lam"), py::arg("pi"),
        py::arg("pj"));
  m.def("gram_pair_quotients", &gram_pair_quotients<double>, py::arg("X"), py::arg("G"), py::arg("lam"), py::arg("pi"),
        py::arg("pj"));
  m.def("knn", &knn<float>, py::arg("X"), py::arg("k"), py::arg("symmetric") = true, py::arg("count_recomputed") = false);
  m.def("knn", &knn<double>, py::arg("X"), py::arg("k"), py::arg("symmetric") = true, py::arg("count_recomputed") = false);
  m.def("knn_from_gram", &knn_from_gram<float>, py::arg("X"), py::arg("G"), py::arg("k"));
  m.def("knn_from_gram", &knn_from_gram<double>, py::arg("X"), py::arg("G"), py::arg("k"));
  m.def("local_top_eigenvalues", &local_top_eigenvalues<float>, py::arg("X"), py::arg("indices"),
        py::arg("float32_work") = false);
  m.def("local_top_eigenvalues", &local_top_eigenvalues<double>, py::arg("X"), py::arg("indices"),
        py::arg("float32_work") = false);
  m.def("pair_quotients", &pair_quotients<float>, py::arg("X"), py::arg("mean"), py::arg("cov"), py::arg("lam"),
        py::arg("pi"), py::arg("pj"), py::arg("float32_work") = false);
  m.def("pair_quotients", &pair_quotients<double>, py::arg("X"), py::arg("mean"), py::arg("cov"), py::arg("lam"),
        py::arg("pi"), py::arg("pj"), py::arg("float32_work") = false);
  m.def("top_eigenvalue_psd", &top_eigenvalue_psd, py::arg("S"), py::arg("rel_tol") = 1e-12,
        py::arg("float32_work") = false);
  m.def("top_eigenvalue_small", &top_eigenvalue_small, py::arg("A"));
  m.def("max_abs", &max_abs<float>, py::arg("X"));
  m.def("max_abs", &max_abs<double>, py::arg("X"));
  m.def("emulate_cuda_knn", &emulate_cuda_knn, py::arg("X"), py::arg("k"),
        py::arg("query_block") = dihal::knn_logic::kTiling.query_block,
        py::arg("ref_block") = dihal::knn_logic::kTiling.ref_block, py::arg("splits") = 0, py::arg("bfloat16") = false);
  m.def("knn_certify_limit", &knn_certify_limit, py::arg("path"), py::arg("D"), py::arg("kth_scaled"),
        py::arg("norm_i"), py::arg("max_norm2"));
  m.def("jacobi_top_eigenvalue", &jacobi_top_eigenvalue, py::arg("A"));
  m.def("covariance_block_scale", &covariance_block_scale, py::arg("max_abs"),
        "The power-of-two scale the CUDA covariance applies to a float16/bfloat16/float32 block whose largest "
        "|x - block mean| is max_abs (csrc/covariance_scale.hpp).");
  m.def("build_info", &build_info);
}
