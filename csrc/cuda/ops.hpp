// Host entry points of the CUDA geometry kernels. Every pointer is device memory on `device`
// (dense, row-major, rows are tokens); work is queued on `stream` and nothing is synchronised.
// Temporaries live in a caller-provided workspace whose size the *_workspace functions return.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dtype.hpp"

namespace dihal::cuda {

// Chan/pairwise update of (count, mean[D], comoment[D*D], float64) with the n rows of X. Blocks
// of rows are centred at their own float64 mean and rounded to the input type; their co-moment is
// a cuBLAS product with float32 accumulation (float64 SYRK when `exact` or for float64 input, the
// centred block then being float64) merged in float64. Only the upper triangle of the row-major
// comoment is written. Returns the new count.
size_t covariance_workspace(int64_t n, int64_t D, DType dtype, bool exact);
int64_t covariance_update(const void* X, DType dtype, int64_t n, int64_t D, int64_t count, double* mean,
                          double* comoment, bool exact, void* workspace, size_t workspace_bytes, int device,
                          cudaStream_t stream);

// Largest candidate list handled by knn_candidates; larger k go through exact_sqdist_rows.
constexpr int64_t kMaxKnnCandidates = 256;

// Exact kNN candidates and their certification (see knn_logic.hpp). Writes idx (n x k, int64),
// exact squared distances d2 (n x k, float64, ties to the lower index) and flags (n, int32: 1 where
// the answer is not certified and the row must be recomputed with exact_sqdist_rows).
// With use_cuvs the candidates come from cuVS brute force instead of the own tiled kernel.
size_t knn_workspace(int64_t n, int64_t D, int64_t k, DType dtype, bool use_cuvs);
void knn_candidates(const void* X, DType dtype, int64_t n, int64_t D, int64_t k, int64_t* idx, double* d2,
                    int32_t* flags, bool use_cuvs, void* workspace, size_t workspace_bytes, int device,
                    cudaStream_t stream);

// out[r, j] = ||x_{rows[r]} - x_j||^2 in float64 for all j (n_rows x n).
void exact_sqdist_rows(const void* X, DType dtype, int64_t n, int64_t D, const int64_t* rows, int64_t n_rows,
                       double* out, int device, cudaStream_t stream);

// Largest neighbourhood (k + 1 points) handled by local_top_eigenvalues.
constexpr int kMaxLocalPoints = 64;

// For each row i, the top eigenvalue of the covariance (normalised by k + 1) of row i and its k
// neighbours idx[i, :], from their (k+1) x (k+1) float64 Gram matrix (Jacobi in shared memory).
void local_top_eigenvalues(const void* X, DType dtype, int64_t n, int64_t D, const int64_t* idx, int64_t k,
                           double* out, int device, cudaStream_t stream);

// Rayleigh quotients d^T (L L^T)^-1 d / ||d||^2 with d = x_pi - x_pj, NaN where d = 0. L is the
// lower Cholesky factor (row-major D x D float64) of the regularised covariance.
size_t pair_workspace(int64_t D, int64_t n_pairs);
void pair_quotients(const void* X, DType dtype, int64_t n, int64_t D, const double* chol_lower, const int64_t* pi,
                    const int64_t* pj, int64_t n_pairs, double* out, void* workspace, size_t workspace_bytes,
                    int device, cudaStream_t stream);

// Whether cuVS brute force was compiled in.
bool cuvs_compiled();

}  // namespace dihal::cuda
