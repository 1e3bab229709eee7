// The assignment pass of k-means as an XLA FFI handler for the CPU backend (see
// jdml/evaluation/kmeans.py and jdml/nn/native/__init__.py).
//
//   jdml_kmeans_assign: every point's nearest centroid (ties to the lower index) and its squared
//     distance |x|^2 + |c|^2 - 2 x.c, clamped at 0, rounded as jdml.geometry.squared_distances
//     rounds it; the dot products come from oneDNN's sgemm on tiles of points x centroids.
//
// XLA computes the same with a matmul whose (points x centroids) result goes to memory, then a
// reduction pass for the minimum and another for its index. Here the points are split over the
// threads of XLA's intra-op pool, and each thread takes the minimum of a tile of scores while it
// is in cache, with the vector registers the CPU has.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using Points = ffi::Buffer<ffi::F32, 2>;
using Floats = ffi::Buffer<ffi::F32, 1>;
using Ints = ffi::Buffer<ffi::S32, 1>;

namespace {

// Tile sizes: up to kCentroidTile centroids against kTileScores / centroids points, so the
// tile's scores (1 MB) stay in cache while its minimum is taken; the centroid tile (at most
// 1,024 x D floats) is reread for every tile of points.
constexpr int64_t kCentroidTile = 1024;
constexpr int64_t kTileScores = 1 << 18;
constexpr int64_t kMaxPointTile = 4096;
// Pieces of the points in a Lloyd iteration (jdml_kmeans_lloyd): one per kLloydPiecePoints
// points, at most kLloydPieces, whatever the threads (each piece's sgemm call has a fixed cost).
constexpr int64_t kLloydPiecePoints = 8192;
constexpr int64_t kLloydPieces = 64;
constexpr int64_t kLloydTile = 512;

// The squared distance of squared_distances, (|x|^2 + |c|^2) - 2 x.c clamped at 0, in its float32
// order (no fused multiply-add: -ffp-contract=off); NaN stays NaN, as in jnp.maximum.
inline float distance(float xs, float cs, float dot) {
  const float d = (xs + cs) - 2.0f * dot;
  return d < 0.0f ? 0.0f : d;
}

// Lowers (best, nearest) to the smallest distance of one row of scores against centroids
// first, first + 1, ..., first + cols - 1 if it is smaller (ties keep the lower index), Lanes
// columns at a time (GCC/Clang vector extensions). Each lane keeps the first minimum of its
// columns; of the lanes' minima, the lowest index wins a tie.
template <int Lanes>
struct LaneTypes;
template <>
struct LaneTypes<4> {
  typedef float Float __attribute__((vector_size(16)));
  typedef int32_t Int __attribute__((vector_size(16)));
};
template <>
struct LaneTypes<8> {
  typedef float Float __attribute__((vector_size(32)));
  typedef int32_t Int __attribute__((vector_size(32)));
};

template <int Lanes>
__attribute__((always_inline)) inline void nearest_lanes(const float* scores, float xs,
                                                         const float* c_sq, int64_t cols,
                                                         int32_t first, float& best,
                                                         int32_t& nearest) {
  using FloatLanes = typename LaneTypes<Lanes>::Float;
  using IntLanes = typename LaneTypes<Lanes>::Int;
  int64_t k = 0;
  if (cols >= Lanes) {
    FloatLanes lane_best, xs_lanes;
    IntLanes lane_index, index;
    for (int j = 0; j < Lanes; ++j) {
      lane_best[j] = std::numeric_limits<float>::infinity();
      lane_index[j] = -1;
      index[j] = j;
      xs_lanes[j] = xs;
    }
    for (; k + Lanes <= cols; k += Lanes) {
      FloatLanes dot, cs;
      std::memcpy(&dot, scores + k, sizeof dot);
      std::memcpy(&cs, c_sq + k, sizeof cs);
      FloatLanes d = (xs_lanes + cs) - 2.0f * dot;
      d = d < 0.0f ? FloatLanes{} : d;
      const IntLanes smaller = d < lane_best;
      lane_best = smaller ? d : lane_best;
      lane_index = smaller ? index : lane_index;
      index += Lanes;
    }
    for (int j = 0; j < Lanes; ++j) {
      if (lane_index[j] < 0) continue;  // only NaN distances in this lane
      const int32_t n = first + lane_index[j];
      if (lane_best[j] < best || (lane_best[j] == best && n < nearest)) {
        best = lane_best[j];
        nearest = n;
      }
    }
  }
  for (; k < cols; ++k) {
    const float d = distance(xs, c_sq[k], scores[k]);
    if (d < best) {  // strict: ties keep the lower index
      best = d;
      nearest = first + static_cast<int32_t>(k);
    }
  }
}

using NearestInRow = void (*)(const float*, float, const float*, int64_t, int32_t, float&,
                              int32_t&);

void nearest_128bit(const float* scores, float xs, const float* c_sq, int64_t cols,
                    int32_t first, float& best, int32_t& nearest) {
  nearest_lanes<4>(scores, xs, c_sq, cols, first, best, nearest);
}

#if defined(__x86_64__) && defined(__GNUC__)
// 8 lanes in AVX2's registers where the CPU has them (the library is built for baseline x86-64,
// where 8 lanes would be emulated and slower than 4): 1.25x at 1,000 centroids.
__attribute__((target("avx2"))) void nearest_avx2(const float* scores, float xs,
                                                  const float* c_sq, int64_t cols, int32_t first,
                                                  float& best, int32_t& nearest) {
  nearest_lanes<8>(scores, xs, c_sq, cols, first, best, nearest);
}
#endif

NearestInRow nearest_in_row() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) return nearest_avx2;
#endif
  return nearest_128bit;
}

// Points [begin, end): nearest centroid and squared distance.
void assign_range(const float* x, const float* x_sq, const float* c, const float* c_sq,
                  int64_t dim, int64_t clusters, int64_t begin, int64_t end, int32_t* nearest,
                  float* best) {
  const int64_t ctile = std::min(clusters, kCentroidTile);
  const int64_t ptile = std::clamp<int64_t>(kTileScores / ctile, 1, kMaxPointTile);
  std::vector<float> scores(ptile * ctile);
  static const NearestInRow nearest_in = nearest_in_row();
  jdml::OneThread one_thread;  // sgemm runs on this piece's thread only
  for (int64_t p0 = begin; p0 < end; p0 += ptile) {
    const int64_t rows = std::min(ptile, end - p0);
    for (int64_t i = 0; i < rows; ++i) {
      nearest[p0 + i] = static_cast<int32_t>(clusters);  // stays out of range for NaN rows
      best[p0 + i] = std::numeric_limits<float>::infinity();
    }
    for (int64_t k0 = 0; k0 < clusters; k0 += ctile) {
      const int64_t cols = std::min(ctile, clusters - k0);
      // scores (rows x cols) = x[p0:p0+rows] (rows x dim) . c[k0:k0+cols]^T, row-major
      const dnnl_status_t status =
          dnnl_sgemm('N', 'T', rows, cols, dim, 1.0f, x + p0 * dim, dim, c + k0 * dim, dim, 0.0f,
                     scores.data(), cols);
      if (status != dnnl_success) throw std::runtime_error("dnnl_sgemm failed");
      for (int64_t i = 0; i < rows; ++i) {
        nearest_in(scores.data() + i * cols, x_sq[p0 + i], c_sq + k0, cols,
                       static_cast<int32_t>(k0), best[p0 + i], nearest[p0 + i]);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      if (nearest[p0 + i] == clusters) best[p0 + i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

ffi::Error Assign(ffi::ThreadPool pool, Points x, Floats x_sq, Points c, Floats c_sq,
                  ffi::ResultBuffer<ffi::S32, 1> nearest, ffi::ResultBuffer<ffi::F32, 1> best) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1], clusters = c.dimensions()[0];
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), n / 256));
  try {
    jdml::run_pieces(pool, pieces, [&](int64_t i) {
      assign_range(x.typed_data(), x_sq.typed_data(), c.typed_data(), c_sq.typed_data(), dim,
                   clusters, n * i / pieces, n * (i + 1) / pieces, nearest->typed_data(),
                   best->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means assignment: ") + err.what());
  }
  return ffi::Error::Success();
}

// Adds the points [begin, end) to the float32 sums (clusters x dim) of their nearest centroids
// and counts them; NaN points (nearest == clusters) are left out. Inlined into a baseline and an
// AVX2 function below, so that the compiler vectorises the row sum for each.
template <int Unused>
__attribute__((always_inline)) inline void add_rows_body(const float* x, const int32_t* nearest,
                                                         int64_t begin, int64_t end, int64_t dim,
                                                         int64_t clusters, float* sums,
                                                         int64_t* counts) {
  for (int64_t i = begin; i < end; ++i) {
    const int32_t k = nearest[i];
    if (k >= clusters) continue;
    ++counts[k];
    float* __restrict__ row = sums + k * dim;
    const float* __restrict__ point = x + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] += point[d];
  }
}

using AddRows = void (*)(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, float*,
                         int64_t*);

void add_rows_baseline(const float* x, const int32_t* nearest, int64_t begin, int64_t end,
                       int64_t dim, int64_t clusters, float* sums, int64_t* counts) {
  add_rows_body<0>(x, nearest, begin, end, dim, clusters, sums, counts);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void add_rows_avx2(const float* x, const int32_t* nearest,
                                                   int64_t begin, int64_t end, int64_t dim,
                                                   int64_t clusters, float* sums,
                                                   int64_t* counts) {
  add_rows_body<0>(x, nearest, begin, end, dim, clusters, sums, counts);
}
#endif

void add_rows(const float* x, const int32_t* nearest, int64_t begin, int64_t end, int64_t dim,
              int64_t clusters, float* sums, int64_t* counts) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const AddRows chosen = __builtin_cpu_supports("avx2") ? add_rows_avx2 : add_rows_baseline;
#else
  static const AddRows chosen = add_rows_baseline;
#endif
  chosen(x, nearest, begin, end, dim, clusters, sums, counts);
}

// Lloyd iterations for few clusters, each one pass over the points: every piece of points is
// assigned (assign_range) and summed into its own float64 partial sums while its rows are in
// cache (float32 sums per tile of kLloydTile points, added to the piece's float64 sums); the
// pieces' sums are added in piece order, so the result does not depend on the threads.
// A cluster with no point keeps its centroid. XLA's loop instead scatters the points into the
// sums in a second pass, which at 5 clusters costs as much as the assignment.
void lloyd(ffi::ThreadPool& pool, const float* x, const float* x_sq, int64_t n, int64_t dim,
           int64_t clusters, int64_t iters, float* centroids) {
  const int64_t pieces = std::clamp<int64_t>(n / kLloydPiecePoints, 1, kLloydPieces);
  std::vector<double> sums(pieces * clusters * dim);
  std::vector<int64_t> counts(pieces * clusters);
  std::vector<int32_t> nearest(n);
  std::vector<float> best(n), c_sq(clusters);
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t k = 0; k < clusters; ++k) {
      float total = 0.0f;
      for (int64_t d = 0; d < dim; ++d) total += centroids[k * dim + d] * centroids[k * dim + d];
      c_sq[k] = total;
    }
    jdml::run_pieces(pool, pieces, [&](int64_t p) {
      const int64_t begin = n * p / pieces, end = n * (p + 1) / pieces;
      double* sum = sums.data() + p * clusters * dim;
      std::vector<float> tile_sum(clusters * dim);
      int64_t* count = counts.data() + p * clusters;
      std::fill(sum, sum + clusters * dim, 0.0);
      std::fill(count, count + clusters, 0);
      // Tiles of points small enough to be summed while the assignment's read left them in cache
      for (int64_t t0 = begin; t0 < end; t0 += kLloydTile) {
        const int64_t t1 = std::min(end, t0 + kLloydTile);
        assign_range(x, x_sq, centroids, c_sq.data(), dim, clusters, t0, t1, nearest.data(),
                     best.data());
        std::fill(tile_sum.begin(), tile_sum.end(), 0.0f);
        add_rows(x, nearest.data(), t0, t1, dim, clusters, tile_sum.data(), count);
        for (int64_t j = 0; j < clusters * dim; ++j) sum[j] += tile_sum[j];
      }
    });
    for (int64_t k = 0; k < clusters; ++k) {
      int64_t count = 0;
      for (int64_t p = 0; p < pieces; ++p) count += counts[p * clusters + k];
      if (count == 0) continue;
      for (int64_t d = 0; d < dim; ++d) {
        double total = 0.0;
        for (int64_t p = 0; p < pieces; ++p) total += sums[(p * clusters + k) * dim + d];
        centroids[k * dim + d] = static_cast<float>(total / static_cast<double>(count));
      }
    }
  }
}

ffi::Error Lloyd(ffi::ThreadPool pool, Points x, Floats x_sq, Points initial, int64_t iters,
                 int64_t points, ffi::ResultBuffer<ffi::F32, 2> centroids) {
  const int64_t dim = x.dimensions()[1], clusters = initial.dimensions()[0];
  const int64_t n = std::min<int64_t>(points, x.dimensions()[0]);
  std::copy(initial.typed_data(), initial.typed_data() + clusters * dim,
            centroids->typed_data());
  try {
    lloyd(pool, x.typed_data(), x_sq.typed_data(), n, dim, clusters, iters,
          centroids->typed_data());
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means iterations: ") + err.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_lloyd, Lloyd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Attr<int64_t>("iters")
                                  .Attr<int64_t>("points")
                                  .Ret<Points>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_assign, Assign,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Ret<Ints>()
                                  .Ret<Floats>());
