// Declarations of the CPU geometry kernels. All matrices are dense row-major; rows are tokens.
// Every kernel accumulates in float64 (or in blocks of the input precision merged in float64)
// and is templated on the input element type (float or double).
#pragma once
#include <cstdint>

namespace dihal {

// Chan/pairwise update of (count, mean[D], comoment[D*D]) with the rows of X (n x D).
// Only the upper triangle of the co-moment is read and written (the caller mirrors it).
// Blocks of rows are shifted by the running mean, their co-moment is formed by a SYRK in the
// input precision and merged in float64.
template <typename T>
void covariance_update(const T* X, int64_t n, int64_t D, int64_t* count, double* mean, double* comoment);

// One-shot mean[D] and population covariance cov[D*D] (full, symmetric) of X: the update above from
// an empty state, with the products in float32 when float32_work, else in float64.
template <typename T>
void covariance(const T* X, int64_t n, int64_t D, bool float32_work, double* mean, double* cov);

// Exact k nearest rows of X (excluding the row itself, ties to the lower index).
// Writes indices (n x k) and squared Euclidean distances computed in float64 (n x k).
// symmetric: compute only the upper triangle of block pairs (half the GEMM work) when the
// per-thread candidate lists fit in 512 MiB; otherwise rows are processed independently.
// recomputed (when non-null) receives the number of rows the certificate could not prove from the
// candidates, recomputed against all rows.
template <typename T>
void knn(const T* X, int64_t n, int64_t D, int64_t k, int64_t* indices, double* sqdist, bool symmetric = true,
         int64_t* recomputed = nullptr);

// knn from the centred Gram matrix G (n x n, float64, see centred_gram) instead of new products:
// candidates from G_ii + G_jj - 2 G_ij, then the same certified float64 re-rank.
template <typename T>
void knn_from_gram(const T* X, int64_t n, int64_t D, const double* G, int64_t k, int64_t* indices, double* sqdist);

// For each row i, the top eigenvalue of the covariance (normalised by k + 1) of row i together
// with its k neighbours idx[i, :], via the (k+1) x (k+1) Gram matrix of the centred points
// (products in float32 when float32_work, centring and eigenvalue in float64).
template <typename T>
void local_top_eigenvalues(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out,
                           bool float32_work);

// Rayleigh quotients (x_i - x_j)^T (S + lam I)^-1 (x_i - x_j) / ||x_i - x_j||^2 for the given pairs,
// NaN where x_i == x_j. S is D x D symmetric positive semi-definite, mean is used to centre X. The
// Cholesky factor is float64; the whitening solves run in float32 when float32_work.
template <typename T>
void pair_quotients(const T* X, int64_t n, int64_t D, const double* mean, const double* S, double lam,
                    const int64_t* pi, const int64_t* pj, int64_t n_pairs, double* out, bool float32_work);

// In-place Cholesky A = L L^T of a symmetric positive definite D x D matrix (lower triangle read and
// written), row-major, or column-major when column_major (the same memory then holds L^T row-major),
// right-looking by 256-wide blocks so that the panel solves and the trailing updates run on the
// OpenMP threads. Returns LAPACK's info (0, or the failing column + 1).
int parallel_cholesky(double* A, int64_t D, bool column_major = false);

// The n x n Gram matrix G = Xc Xc^T (full, float64) of the rows of X centred at their mean, products
// in float32 when float32_work. For n < D it replaces the D x D covariance: Sigma = Xc^T Xc / n has
// the trace and the non-zero eigenvalues of G / n.
template <typename T>
void centred_gram(const T* X, int64_t n, int64_t D, bool float32_work, double* G);

// Pair quotients of pair_quotients from the Gram matrix G of centred_gram (n < D): with
// K = G + n lam I = L L^T and u = e_i - e_j, d^T (Sigma + lam I)^-1 d = n (2 - n lam ||L^-1 u||^2),
// over ||x_i - x_j||^2 computed from X in float64; NaN where x_i == x_j.
template <typename T>
void gram_pair_quotients(const T* X, int64_t n, int64_t D, const double* G, double lam, const int64_t* pi,
                         const int64_t* pj, int64_t n_pairs, double* out);

// Largest eigenvalue of a symmetric positive semi-definite D x D matrix, stored full (Lanczos with full
// reorthogonalisation and a residual-based convergence test). Returns the number of
// iterations used through *iterations when non-null. float32_work: the matrix-vector products read a
// float32 copy of S (the Lanczos recurrence stays in float64).
double top_eigenvalue_psd(const double* S, int64_t D, double rel_tol, int* iterations, bool float32_work = false);

// Largest eigenvalue of a small symmetric m x m matrix (Householder tridiagonalisation, then
// top_eigenvalue_tridiagonal; A is overwritten).
double top_eigenvalue_small(double* A, int m);

// Largest eigenvalue of the symmetric tridiagonal matrix with diagonal d[m] and off-diagonal e[m-1]
// (Laguerre's iteration from above, finished by Sturm bisection where it converges slowly), to
// about 2 eps max|Gershgorin bounds|.
double top_eigenvalue_tridiagonal(const double* d, const double* e, int m);

// Largest |x| over a dense array in one read-only pass; NaN if any element is NaN, inf if any is inf.
template <typename T>
double max_abs(const T* X, int64_t size);

// ||a - b||^2 with the differences and the sum in float64 (vectorised for the CPU it runs on).
double sqdist_exact(const float* a, const float* b, int64_t len);
double sqdist_exact(const double* a, const double* b, int64_t len);

// Threads used by the OpenMP kernels.
int num_threads();

// Whether a loop of about `work` element operations is worth forking the OpenMP team for: small
// loops run on the calling thread (no fork/join, no spinning partner on a busy machine).
inline bool parallel_worth(double work) { return work > double(1 << 18); }

}  // namespace dihal
