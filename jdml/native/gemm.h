// Tiles of dot products through oneDNN's sgemm, shared by the native kernels (knn.cc,
// kmeans.cc), so that a dot product rounds the same whatever tile it is computed in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "oneapi/dnnl/dnnl.h"

namespace jdml {

// oneDNN's sgemm computes fewer than 16 rows, or a single column, with other kernels whose sums
// round differently (measured on AVX-512: 16 rows or more and 2 columns or more all round as
// one 256 x 1,024 tile), so a point's dot products would depend on how many points share its
// tile, and a column's on where its tile ends. Smaller tiles are computed padded with zero rows
// to at least kMinRows x kMinCols (the padding's products are never read): every product then
// comes from one kernel, and work cut into tiles differently (one block or several, ranges of
// other sizes) gives the same products bit for bit, up to 768 dimensions (measured on CPUs with
// AVX-512; from 1,024 on, sgemm sums a product in blocks of the dimensions that depend on the
// tile's shape, so products agree up to float32 rounding only). On CPUs with AVX2 only
// (measured on an AMD EPYC) sgemm's kernels for tiles of other shapes sum in other orders at
// every width: a product then differs between tilings by about one float32 ulp. The rows have a margin (padding only ever pads a
// range's last tile); the columns do not, since few centroids would otherwise cost several
// times their arithmetic where sgemm assigns them (CPUs without AVX-512).
constexpr int64_t kMinRows = 32;
constexpr int64_t kMinCols = 2;

// The row stride of a tile of `cols` columns in score_tile's output.
inline int64_t tile_stride(int64_t cols) { return std::max(cols, kMinCols); }

// How many floats score_tile's output needs for tiles of up to rows x cols.
inline size_t tile_floats(int64_t rows, int64_t cols) {
  return static_cast<size_t>(std::max(rows, kMinRows) * tile_stride(cols));
}

// scores[i * tile_stride(cols) + j] = scale * a[i] . b[j] for i < rows, j < cols (rows of
// `width` floats), in a buffer of tile_floats(rows, cols) floats, on the calling thread's
// OpenMP setting (callers run it inside OneThread).
inline void score_tile(const float* a, int64_t rows, const float* b, int64_t cols, int64_t width,
                       float scale, float* scores) {
  const int64_t m = std::max(rows, kMinRows), ld = tile_stride(cols);
  thread_local std::vector<float> padded_a, padded_b;
  if (rows < m) {
    padded_a.assign(m * width, 0.0f);
    std::copy(a, a + rows * width, padded_a.begin());
    a = padded_a.data();
  }
  if (cols < ld) {
    padded_b.assign(ld * width, 0.0f);
    std::copy(b, b + cols * width, padded_b.begin());
    b = padded_b.data();
  }
  const dnnl_status_t status =
      dnnl_sgemm('N', 'T', m, ld, width, scale, a, width, b, width, 0.0f, scores, ld);
  if (status != dnnl_success) throw std::runtime_error("dnnl_sgemm failed");
}

}  // namespace jdml
