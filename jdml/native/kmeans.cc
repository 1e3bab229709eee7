// k-means' passes over the points as XLA FFI handlers for the CPU backend (see
// jdml/native/kmeans.py and jdml/native/build.py).
//
//   jdml_kmeans_assign: every point's nearest centroid (ties to the lower index) and its squared
//     distance |x|^2 + |c|^2 - 2 x.c, clamped at 0, rounded as jdml.geometry.squared_distances
//     rounds it; the dot products come from oneDNN's sgemm on tiles of points x centroids.
//   jdml_kmeans_assign_bounded: the same assignment inside Lloyd's iterations, skipping the
//     points whose centroid cannot have changed (bounds of Hamerly's k-means, see below).
//   jdml_kmeans_mean, jdml_kmeans_centre: the points' mean, and the centred points.
//   jdml_kmeans_lloyd, jdml_kmeans_reference_lloyd: Lloyd's iterations for few clusters as one
//     call each (jdml's "random" and "k-means++" modes, and faiss's k-means).
//   jdml_kmeans_sums: the clusters' sums, as XLA's segment_sum, for any number of clusters.
//   jdml_kmeans_mean_host, jdml_kmeans_lloyd_host, jdml_kmeans_reference_lloyd_host: the same
//     functions on host memory, called directly (plain C functions, not FFI handlers).
//
// XLA computes the same with a matmul whose (points x centroids) result goes to memory, then a
// reduction pass for the minimum and another for its index. Here the points are split over the
// threads of XLA's intra-op pool, and each thread takes the minimum of a tile of scores while it
// is in cache, with the vector registers the CPU has.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "oneapi/dnnl/dnnl.h"
#include "gemm.h"
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
// Up to this many clusters (and with AVX2 and FMA), a Lloyd iteration computes each point's dot
// products in registers (lloyd_tile_direct) instead of with sgemm, whose calls on tiles only a
// few centroids wide cost more than their arithmetic.
constexpr int64_t kDirectClusters = 16;
// How many points ahead nearest_direct and add_rows_direct ask the cache for a row (10% faster
// assignments at 20,000 x 128 points).
constexpr int64_t kPrefetchPoints = 8;

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
template <>
struct LaneTypes<16> {
  typedef float Float __attribute__((vector_size(64)));
  typedef int32_t Int __attribute__((vector_size(64)));
};

// With Second, also lowers `second` to the smallest distance of the row other than the one
// `nearest` ends at (per lane the smallest of the rest too; of the lanes, every smallest but the
// winner's counts as well), for the bounds of jdml_kmeans_assign_bounded.
template <int Lanes, bool Second = false>
__attribute__((always_inline)) inline void nearest_lanes(const float* scores, float xs,
                                                         const float* c_sq, int64_t cols,
                                                         int32_t first, float& best,
                                                         int32_t& nearest, float& second) {
  using FloatLanes = typename LaneTypes<Lanes>::Float;
  using IntLanes = typename LaneTypes<Lanes>::Int;
  int64_t k = 0;
  if (cols >= Lanes) {
    FloatLanes lane_best, lane_second, xs_lanes;
    IntLanes lane_index, index;
    for (int j = 0; j < Lanes; ++j) {
      lane_best[j] = lane_second[j] = std::numeric_limits<float>::infinity();
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
      if constexpr (Second) lane_second = smaller ? lane_best : (d < lane_second ? d : lane_second);
      lane_best = smaller ? d : lane_best;
      lane_index = smaller ? index : lane_index;
      index += Lanes;
    }
    for (int j = 0; j < Lanes; ++j) {
      if constexpr (Second) second = std::min(second, lane_second[j]);
      if (lane_index[j] < 0) continue;  // only NaN distances in this lane
      const int32_t n = first + lane_index[j];
      if (lane_best[j] < best || (lane_best[j] == best && n < nearest)) {
        if constexpr (Second) second = std::min(second, best);
        best = lane_best[j];
        nearest = n;
      } else if constexpr (Second) {
        second = std::min(second, lane_best[j]);
      }
    }
  }
  for (; k < cols; ++k) {
    const float d = distance(xs, c_sq[k], scores[k]);
    if (d < best) {  // strict: ties keep the lower index
      if constexpr (Second) second = best;
      best = d;
      nearest = first + static_cast<int32_t>(k);
    } else if constexpr (Second) {
      if (d < second) second = d;
    }
  }
}

// nearest_lanes for one row, the lanes the CPU has; `second` is only lowered with Second.
using NearestInRow = void (*)(const float*, float, const float*, int64_t, int32_t, float&,
                              int32_t&, float&);

template <bool Second>
void nearest_128bit(const float* scores, float xs, const float* c_sq, int64_t cols,
                    int32_t first, float& best, int32_t& nearest, float& second) {
  nearest_lanes<4, Second>(scores, xs, c_sq, cols, first, best, nearest, second);
}

#if defined(__x86_64__) && defined(__GNUC__)
// 8 lanes in AVX2's registers where the CPU has them (the library is built for baseline x86-64,
// where 8 lanes would be emulated and slower than 4): 1.25x at 1,000 centroids.
template <bool Second>
__attribute__((target("avx2"))) void nearest_avx2(const float* scores, float xs,
                                                  const float* c_sq, int64_t cols, int32_t first,
                                                  float& best, int32_t& nearest, float& second) {
  nearest_lanes<8, Second>(scores, xs, c_sq, cols, first, best, nearest, second);
}

// 16 lanes in AVX-512's registers: at 1,000 centroids the minimum pass had taken a sixth of an
// assignment in AVX2's.
template <bool Second>
__attribute__((target("avx512f"))) void nearest_avx512(const float* scores, float xs,
                                                      const float* c_sq, int64_t cols,
                                                      int32_t first, float& best,
                                                      int32_t& nearest, float& second) {
  nearest_lanes<16, Second>(scores, xs, c_sq, cols, first, best, nearest, second);
}
#endif

template <bool Second>
NearestInRow nearest_in_row() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return nearest_avx512<Second>;
  if (__builtin_cpu_supports("avx2")) return nearest_avx2<Second>;
#endif
  return nearest_128bit<Second>;
}

#if defined(__x86_64__) && defined(__GNUC__)
// The sums of the lanes of 16 registers: lane j of the result is the sum of v[j]'s 16 lanes.
// Four levels of pairwise sums of shuffled registers (45 instructions, against about 150 for 16
// separate horizontal sums).
__attribute__((target("avx512f"), always_inline)) inline __m512 lane_sums(const __m512* v) {
  __m512 pairs[8], quads[4], halves[2];
  for (int j = 0; j < 8; ++j) {  // per 128 bits: [a0 + a2, b0 + b2, a1 + a3, b1 + b3]
    pairs[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                             _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  }
  for (int j = 0; j < 4; ++j) {  // per 128 bits: the partial sums of 4 registers
    const __m512d lo = _mm512_castps_pd(pairs[2 * j]), hi = _mm512_castps_pd(pairs[2 * j + 1]);
    quads[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
  }
  // 128-bit lanes added in pairs: [q0 + q1, q2 + q3] of two registers, then of two more
  for (int j = 0; j < 2; ++j) {
    const __m512 a = quads[2 * j], b = quads[2 * j + 1];
    halves[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The dot products of the P (1 or 2) points p, p + dim with the G (at most 8) centroids c[0],
// ..., c[G - 1] (rows of dim floats) into out[i * kDirectClusters + g], 16 dimensions at a time
// with fused multiply-adds: a register tile of P x G accumulators, each centroid row loaded once
// for the P points; out[i * kDirectClusters + g] for g in [G, 8) is overwritten with 0.
template <int P, int G>
__attribute__((target("avx512f"), always_inline)) inline void tile_dots(const float* p,
                                                                      const float* c,
                                                                      int64_t dim, float* out) {
  __m512 acc[16];  // point i, centroid g at 8 i + g
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    __m512 v[P];
    for (int i = 0; i < P; ++i) {
      const float* next = p + (i + kPrefetchPoints) * dim + d;  // never dereferenced
      _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T0);
      v[i] = _mm512_loadu_ps(p + i * dim + d);
    }
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_loadu_ps(c + g * dim + d);
      for (int i = 0; i < P; ++i) acc[8 * i + g] = _mm512_fmadd_ps(v[i], w, acc[8 * i + g]);
    }
  }
  const __mmask16 rest = static_cast<__mmask16>((1u << (dim - d)) - 1u);
  if (rest) {
    __m512 v[P];
    for (int i = 0; i < P; ++i) v[i] = _mm512_maskz_loadu_ps(rest, p + i * dim + d);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_maskz_loadu_ps(rest, c + g * dim + d);
      for (int i = 0; i < P; ++i) acc[8 * i + g] = _mm512_fmadd_ps(v[i], w, acc[8 * i + g]);
    }
  }
  const __m512 sums = lane_sums(acc);
  _mm512_mask_storeu_ps(out, 0x00FF, sums);
  if (P == 2) _mm512_mask_storeu_ps(out + kDirectClusters - 8, 0xFF00, sums);
}

// tile_dots of P points against all the clusters, in groups of at most 8 centroids.
template <int P>
__attribute__((target("avx512f"), always_inline)) inline void point_dots(const float* p,
                                                                       const float* c,
                                                                       int64_t dim,
                                                                       int64_t clusters,
                                                                       float* out) {
  for (int64_t k0 = 0; k0 < clusters; k0 += 8) {
    const float* group = c + k0 * dim;
    float* o = out + k0;
    switch (std::min<int64_t>(8, clusters - k0)) {
      case 1: tile_dots<P, 1>(p, group, dim, o); break;
      case 2: tile_dots<P, 2>(p, group, dim, o); break;
      case 3: tile_dots<P, 3>(p, group, dim, o); break;
      case 4: tile_dots<P, 4>(p, group, dim, o); break;
      case 5: tile_dots<P, 5>(p, group, dim, o); break;
      case 6: tile_dots<P, 6>(p, group, dim, o); break;
      case 7: tile_dots<P, 7>(p, group, dim, o); break;
      default: tile_dots<P, 8>(p, group, dim, o); break;
    }
  }
}

// Nearest centroid of each point of [begin, end) and its squared distance, for at most
// kDirectClusters clusters, as assign_range finds them (the distance of `distance`, the first
// of the smallest, NaN rows out of range with a NaN distance), tiles of kLloydTile points at a
// time: the dot products of the tile's points with every centroid (point_dots, two points at a
// time), then each point's smallest distance in 16 lanes.
__attribute__((target("avx512f"))) void nearest_direct(const float* x, const float* x_sq,
                                                     const float* c, const float* c_sq,
                                                     int64_t dim, int64_t clusters,
                                                     int64_t begin, int64_t end, int32_t* nearest,
                                                     float* best) {
  alignas(64) float dots[kLloydTile * kDirectClusters];
  const __mmask16 used = static_cast<__mmask16>((1u << clusters) - 1u);
  const float infinity = std::numeric_limits<float>::infinity();
  const __m512 inf = _mm512_set1_ps(infinity);
  const __m512 zero = _mm512_setzero_ps(), two = _mm512_set1_ps(2.0f);
  const __m512 cs = _mm512_maskz_loadu_ps(used, c_sq);
  for (int64_t t0 = begin; t0 < end; t0 += kLloydTile) {
    const int64_t rows = std::min(kLloydTile, end - t0);
    int64_t i = 0;
    for (; i + 2 <= rows; i += 2) {
      point_dots<2>(x + (t0 + i) * dim, c, dim, clusters, dots + i * kDirectClusters);
    }
    if (i < rows) point_dots<1>(x + (t0 + i) * dim, c, dim, clusters, dots + i * kDirectClusters);
    for (i = 0; i < rows; ++i) {
      const __m512 dot = _mm512_load_ps(dots + i * kDirectClusters);
      __m512 d = _mm512_sub_ps(_mm512_add_ps(_mm512_set1_ps(x_sq[t0 + i]), cs),
                               _mm512_mul_ps(two, dot));
      d = _mm512_mask_mov_ps(d, _mm512_cmp_ps_mask(d, zero, _CMP_LT_OQ), zero);
      // NaN lanes and the lanes past the clusters are never nearest
      d = _mm512_mask_mov_ps(inf, _mm512_cmp_ps_mask(d, d, _CMP_ORD_Q) & used, d);
      const float smallest = _mm512_reduce_min_ps(d);
      if (smallest < infinity) {
        const __mmask16 at = _mm512_cmp_ps_mask(d, _mm512_set1_ps(smallest), _CMP_EQ_OQ);
        nearest[t0 + i] = __builtin_ctz(at);
        best[t0 + i] = smallest;
      } else {
        nearest[t0 + i] = static_cast<int32_t>(clusters);
        best[t0 + i] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
}

// Adds the points `members[0..m)` (rows of x, in increasing order) to one cluster's float32 sum
// `row`, dimensions [d0, min(d0 + 16 R, dim)) in R registers, continuing from the row's values
// and storing them back once, so that calls on consecutive ranges of points add them in point
// order as one call would.
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void add_members(
    const float* x, const int32_t* members, int64_t m, int64_t dim, int64_t d0, float* row) {
  __mmask16 lanes[R];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) {
    const int64_t width = std::clamp<int64_t>(dim - d0 - 16 * r, 0, 16);
    lanes[r] = static_cast<__mmask16>((1u << width) - 1u);
    acc[r] = _mm512_maskz_loadu_ps(lanes[r], row + d0 + 16 * r);
  }
  for (int64_t j = 0; j < m; ++j) {
    // The members are not contiguous, so the hardware prefetcher misses them: ask for the one
    // kPrefetchPoints ahead, a cache line per register
    if (j + kPrefetchPoints < m) {
      const float* ahead = x + static_cast<int64_t>(members[j + kPrefetchPoints]) * dim + d0;
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 16 * r), _MM_HINT_T0);
      }
    }
    const float* point = x + static_cast<int64_t>(members[j]) * dim + d0;
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(lanes[r], point + 16 * r));
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(row + d0 + 16 * r, lanes[r], acc[r]);
}

// add_rows for at most kDirectClusters clusters: the points [begin, end) sorted by cluster in
// point order (a counting sort, without branches), then each cluster's sum over its own points
// with its row in registers, 16 R dimensions at a time. Each sum is the same float32 sum in point
// order as a pass that adds every point to its cluster's row. That pass (the rows of a group of
// clusters in registers, a branch per point to find its cluster's) had taken about half of a
// 5-cluster reference k-means; with the sorted sums, 20,000 x 128 points into 5 clusters went
// from 1.02x to 1.33x faiss's speed (random, warm) and from 1.00x to 1.09x (reference).
__attribute__((target("avx512f"))) void add_rows_direct(const float* x, const int32_t* nearest,
                                                      int64_t begin, int64_t end, int64_t dim,
                                                      int64_t first, int64_t clusters,
                                                      float* sums, int64_t* counts) {
  // bucket g < clusters: the points of cluster first + g; bucket `clusters`: all others
  thread_local std::vector<int32_t> members;
  thread_local std::vector<int64_t> starts;
  members.resize(std::max<int64_t>(end - begin, 0));
  starts.assign(clusters + 2, 0);
  const auto bucket = [&](int64_t i) {
    const uint32_t g = static_cast<uint32_t>(nearest[i] - first);
    return g < static_cast<uint32_t>(clusters) ? static_cast<int64_t>(g) : clusters;
  };
  for (int64_t i = begin; i < end; ++i) ++starts[bucket(i) + 1];
  for (int64_t g = 0; g <= clusters; ++g) starts[g + 1] += starts[g];
  std::vector<int64_t> next(starts.begin(), starts.end() - 1);
  for (int64_t i = begin; i < end; ++i) members[next[bucket(i)]++] = static_cast<int32_t>(i);
  for (int64_t g = 0; g < clusters; ++g) {
    const int32_t* list = members.data() + starts[g];
    const int64_t m = starts[g + 1] - starts[g];
    float* row = sums + g * dim;
    counts[g] += m;
    if (m == 0) continue;
    for (int64_t d0 = 0; d0 < dim;) {
      const int64_t registers = (dim - d0 + 15) / 16;
      const int R = registers >= 8 ? 8 : registers >= 4 ? 4 : registers >= 2 ? 2 : 1;
      switch (R) {
        case 8: add_members<8>(x, list, m, dim, d0, row); break;
        case 4: add_members<4>(x, list, m, dim, d0, row); break;
        case 2: add_members<2>(x, list, m, dim, d0, row); break;
        default: add_members<1>(x, list, m, dim, d0, row);
      }
      d0 = std::min(dim, d0 + 16 * R);
    }
  }
}

bool direct_available() {
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
}
#else
void nearest_direct(const float*, const float*, const float*, const float*, int64_t, int64_t,
                    int64_t, int64_t, int32_t*, float*) {}
void add_rows_direct(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                     float*, int64_t*) {}
bool direct_available() { return false; }
#endif

// Whether the clusters are few enough for nearest_direct and add_rows_direct, on a CPU that has
// their instructions.
bool use_direct(int64_t clusters) { return clusters <= kDirectClusters && direct_available(); }

// Points [begin, end): nearest centroid and squared distance, from sgemm's tiles of scores.
void assign_range_sgemm(const float* x, const float* x_sq, const float* c, const float* c_sq,
                  int64_t dim, int64_t clusters, int64_t begin, int64_t end, int32_t* nearest,
                  float* best) {
  const int64_t ctile = std::min(clusters, kCentroidTile);
  const int64_t ptile = std::clamp<int64_t>(kTileScores / ctile, 1, kMaxPointTile);
  std::vector<float> scores(jdml::tile_floats(ptile, ctile));
  static const NearestInRow nearest_in = nearest_in_row<false>();
  float unused = 0;
  jdml::OneThread one_thread;  // sgemm runs on this piece's thread only
  for (int64_t p0 = begin; p0 < end; p0 += ptile) {
    const int64_t rows = std::min(ptile, end - p0);
    for (int64_t i = 0; i < rows; ++i) {
      nearest[p0 + i] = static_cast<int32_t>(clusters);  // stays out of range for NaN rows
      best[p0 + i] = std::numeric_limits<float>::infinity();
    }
    for (int64_t k0 = 0; k0 < clusters; k0 += ctile) {
      const int64_t cols = std::min(ctile, clusters - k0), ld = jdml::tile_stride(cols);
      // scores (rows x cols) = x[p0:p0+rows] (rows x dim) . c[k0:k0+cols]^T, row-major
      jdml::score_tile(x + p0 * dim, rows, c + k0 * dim, cols, dim, 1.0f, scores.data());
      for (int64_t i = 0; i < rows; ++i) {
        nearest_in(scores.data() + i * ld, x_sq[p0 + i], c_sq + k0, cols,
                       static_cast<int32_t>(k0), best[p0 + i], nearest[p0 + i], unused);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      if (nearest[p0 + i] == clusters) best[p0 + i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// Points [begin, end): nearest centroid and squared distance.
void assign_range(const float* x, const float* x_sq, const float* c, const float* c_sq,
                  int64_t dim, int64_t clusters, int64_t begin, int64_t end, int32_t* nearest,
                  float* best) {
  (use_direct(clusters) ? nearest_direct : assign_range_sgemm)(x, x_sq, c, c_sq, dim, clusters,
                                                               begin, end, nearest, best);
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
__attribute__((always_inline)) inline void add_rows_body(const float* x, const int32_t* nearest,
                                                         int64_t begin, int64_t end, int64_t dim,
                                                         int64_t first, int64_t clusters,
                                                         float* sums, int64_t* counts) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t k = nearest[i] - first;
    if (k < 0 || k >= clusters) continue;
    ++counts[k];
    float* __restrict__ row = sums + k * dim;
    const float* __restrict__ point = x + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] += point[d];
  }
}

using AddRows = void (*)(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                         float*, int64_t*);

void add_rows_baseline(const float* x, const int32_t* nearest, int64_t begin, int64_t end,
                       int64_t dim, int64_t first, int64_t clusters, float* sums,
                       int64_t* counts) {
  add_rows_body(x, nearest, begin, end, dim, first, clusters, sums, counts);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void add_rows_avx2(const float* x, const int32_t* nearest,
                                                   int64_t begin, int64_t end, int64_t dim,
                                                   int64_t first, int64_t clusters, float* sums,
                                                   int64_t* counts) {
  add_rows_body(x, nearest, begin, end, dim, first, clusters, sums, counts);
}
#endif

// Adds the points [begin, end) of the clusters [first, first + clusters) to the float32 sums
// (clusters x dim) of their nearest centroids, in point order, and counts them; the others, and
// NaN points, are left out.
void add_rows(const float* x, const int32_t* nearest, int64_t begin, int64_t end, int64_t dim,
              int64_t first, int64_t clusters, float* sums, int64_t* counts) {
  if (use_direct(clusters)) {
    add_rows_direct(x, nearest, begin, end, dim, first, clusters, sums, counts);
    return;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  static const AddRows chosen = __builtin_cpu_supports("avx2") ? add_rows_avx2 : add_rows_baseline;
#else
  static const AddRows chosen = add_rows_baseline;
#endif
  chosen(x, nearest, begin, end, dim, first, clusters, sums, counts);
}

// The centroids' squared norms, sum over d of c[k, d]^2 in order (the centroids move inside a
// jdml_kmeans_lloyd call, so they cannot come from XLA's squared_norms, as they do for
// jdml_kmeans_assign).
void centroid_norms(const float* centroids, int64_t clusters, int64_t dim, float* c_sq) {
  for (int64_t k = 0; k < clusters; ++k) {
    float total = 0.0f;
    for (int64_t d = 0; d < dim; ++d) total += centroids[k * dim + d] * centroids[k * dim + d];
    c_sq[k] = total;
  }
}

// Pieces of the points for the mean (column_mean): a fixed count for N, whatever the threads, so
// that the mean's float64 sums are added in the same order on every machine.
constexpr int64_t kCentrePiecePoints = 4096;

// Adds the rows [begin, end) of x (N x dim) to the float64 column sums `sum`. Compiled for
// AVX-512 and for the baseline, chosen when the library loads (target_clones).
__attribute__((target_clones("avx512f", "default"))) void add_columns(const float* x,
                                                                     int64_t begin, int64_t end,
                                                                     int64_t dim, double* sum) {
  for (int64_t i = begin; i < end; ++i) {
    const float* __restrict__ row = x + i * dim;
    for (int64_t d = 0; d < dim; ++d) sum[d] += row[d];
  }
}

// Writes the rows [begin, end) of x minus `mean` to `centred`, and their squared norms to
// `norms` (16 float32 partial sums per row, then added in lane order).
__attribute__((target_clones("avx512f", "default"))) void centre_rows(
    const float* x, const float* mean, int64_t begin, int64_t end, int64_t dim, float* centred,
    float* norms) {
  constexpr int64_t kLanes = 16;
  for (int64_t i = begin; i < end; ++i) {
    const float* __restrict__ row = x + i * dim;
    float* __restrict__ out = centred + i * dim;
    float squares[kLanes] = {};
    int64_t d = 0;
    for (; d + kLanes <= dim; d += kLanes) {
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        const float v = row[d + lane] - mean[d + lane];
        out[d + lane] = v;
        squares[lane] += v * v;
      }
    }
    float total = 0.0f;
    for (int64_t lane = 0; lane < kLanes; ++lane) total += squares[lane];
    for (; d < dim; ++d) {
      const float v = row[d] - mean[d];
      out[d] = v;
      total += v * v;
    }
    norms[i] = total;
  }
}

// The mean of the points (N x dim) into `mean`: float64 column sums per piece of the points
// (a fixed count of pieces for N), added in piece order.
template <class Pool>
void column_mean(Pool& pool, const float* x, int64_t n, int64_t dim, float* mean) {
  const int64_t pieces = std::clamp<int64_t>(n / kCentrePiecePoints, 1, kLloydPieces);
  std::vector<double> sums(pieces * dim, 0.0);
  const std::function<void(int64_t, int64_t)> piece = [&](int64_t, int64_t p) {
    std::vector<double> sum(dim, 0.0);  // the thread's own (no false sharing)
    add_columns(x, n * p / pieces, n * (p + 1) / pieces, dim, sum.data());
    std::copy(sum.begin(), sum.end(), sums.begin() + p * dim);
  };
  const std::function<bool(int64_t)> to_mean = [&](int64_t) {
    for (int64_t d = 0; d < dim; ++d) {
      double total = 0.0;
      for (int64_t p = 0; p < pieces; ++p) total += sums[p * dim + d];
      mean[d] = static_cast<float>(total / static_cast<double>(n));
    }
    return true;
  };
  jdml::run_rounds(pool, pieces, 1, piece, to_mean);
}

// Lloyd iterations for few clusters on the points x minus `mean`, each one pass over the points:
// every tile of kLloydTile points is centred into its thread's own buffer (centre_rows, which
// also gives the centred rows' squared norms), assigned (assign_range) and summed while it is in
// cache (float32 sums per tile, added to the piece's float64 sums); the pieces' sums are added
// in piece order, so the result does not depend on the threads. The centred points are never
// written out. A cluster with no point keeps its centroid (`centroids`, centred). After the last
// iteration, one more pass assigns the points to the final centroids (`nearest`, `best`) and
// sums their squared distances (`inertia`: float64 per piece, added in piece order). XLA's loop
// instead scatters the points into the sums in a second pass, which at 5 clusters costs as much
// as the assignment.
template <class Pool>
void lloyd(Pool& pool, const float* x, const float* mean, int64_t n, int64_t dim,
           int64_t clusters, int64_t iters, float* centroids, int32_t* nearest, float* best,
           float* inertia) {
  const int64_t pieces = std::clamp<int64_t>(n / kLloydPiecePoints, 1, kLloydPieces);
  std::vector<double> sums(pieces * clusters * dim), squares(pieces);
  std::vector<int64_t> counts(pieces * clusters);
  std::vector<float> c_sq(clusters);
  centroid_norms(centroids, clusters, dim, c_sq.data());
  // Rounds 0, ..., iters - 1 are the iterations, round iters the final assignment.
  const std::function<void(int64_t, int64_t)> piece = [&](int64_t round, int64_t p) {
    const int64_t begin = n * p / pieces, end = n * (p + 1) / pieces;
    const bool last = round == iters;
    thread_local std::vector<float> tile, tile_sq;
    tile.resize(kLloydTile * dim);
    tile_sq.resize(kLloydTile);
    // This piece's sums and counts are its thread's own until the end: the pieces' slices of
    // `sums` and `counts` share cache lines, and counting into them directly (false sharing)
    // had cost more than the arithmetic.
    std::vector<double> sum(last ? 0 : clusters * dim, 0.0);
    std::vector<float> tile_sum(last ? 0 : clusters * dim);
    std::vector<int64_t> count(clusters, 0);
    double square = 0.0;
    for (int64_t t0 = begin; t0 < end; t0 += kLloydTile) {
      const int64_t rows = std::min(end, t0 + kLloydTile) - t0;
      centre_rows(x + t0 * dim, mean, 0, rows, dim, tile.data(), tile_sq.data());
      assign_range(tile.data(), tile_sq.data(), centroids, c_sq.data(), dim, clusters, 0, rows,
                   nearest + t0, best + t0);
      if (last) {
        for (int64_t i = t0; i < t0 + rows; ++i) square += best[i];
        continue;
      }
      std::fill(tile_sum.begin(), tile_sum.end(), 0.0f);
      add_rows(tile.data(), nearest + t0, 0, rows, dim, 0, clusters, tile_sum.data(),
               count.data());
      for (int64_t j = 0; j < clusters * dim; ++j) sum[j] += tile_sum[j];
    }
    if (last) {
      squares[p] = square;
      return;
    }
    std::copy(sum.begin(), sum.end(), sums.begin() + p * clusters * dim);
    std::copy(count.begin(), count.end(), counts.begin() + p * clusters);
  };
  const std::function<bool(int64_t)> update = [&](int64_t round) {
    if (round == iters) {
      double total = 0.0;
      for (int64_t p = 0; p < pieces; ++p) total += squares[p];
      *inertia = static_cast<float>(total);
      return true;
    }
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
    centroid_norms(centroids, clusters, dim, c_sq.data());
    return true;
  };
  jdml::run_rounds(pool, pieces, iters + 1, piece, update);
}

// The points minus their mean and the centred points' squared norms: column_mean, then a pass
// that writes the centred rows and their squared norms. XLA's column reduction, subtraction and
// row reduction took 0.6 ms on 20,000 x 128 points, a tenth of a 5-cluster k-means.
ffi::Error Centre(ffi::ThreadPool pool, Points x, ffi::ResultBuffer<ffi::F32, 2> centred,
                  ffi::ResultBuffer<ffi::F32, 1> norms, ffi::ResultBuffer<ffi::F32, 1> mean) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1];
  const int64_t pieces = std::clamp<int64_t>(n / kCentrePiecePoints, 1, kLloydPieces);
  try {
    column_mean(pool, x.typed_data(), n, dim, mean->typed_data());
    jdml::run_pieces(pool, pieces, [&](int64_t p) {
      centre_rows(x.typed_data(), mean->typed_data(), n * p / pieces, n * (p + 1) / pieces, dim,
                  centred->typed_data(), norms->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means centring: ") + err.what());
  }
  return ffi::Error::Success();
}

ffi::Error Mean(ffi::ThreadPool pool, Points x, ffi::ResultBuffer<ffi::F32, 1> mean) {
  try {
    column_mean(pool, x.typed_data(), x.dimensions()[0], x.dimensions()[1], mean->typed_data());
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means mean: ") + err.what());
  }
  return ffi::Error::Success();
}

// Squared norms of the rows [begin, end) of x as centre_rows computes them for centred rows (16
// float32 partial sums per row, added in lane order).
__attribute__((target_clones("avx512f", "default"))) void row_norms(const float* x, int64_t begin,
                                                                   int64_t end, int64_t dim,
                                                                   float* norms) {
  constexpr int64_t kLanes = 16;
  for (int64_t i = begin; i < end; ++i) {
    const float* __restrict__ row = x + i * dim;
    float squares[kLanes] = {};
    int64_t d = 0;
    for (; d + kLanes <= dim; d += kLanes) {
      for (int64_t lane = 0; lane < kLanes; ++lane) squares[lane] += row[d + lane] * row[d + lane];
    }
    float total = 0.0f;
    for (int64_t lane = 0; lane < kLanes; ++lane) total += squares[lane];
    for (; d < dim; ++d) total += row[d] * row[d];
    norms[i] = total;
  }
}

// Updates of faiss's k-means (the "reference" mode, jdml/evaluation/kmeans/reference.py) for
// few clusters, up to `iters` of them from `c` (clusters x dim, updated in place), stopping after
// the first that leaves a cluster empty (the caller then splits clusters as faiss does). A first
// round computes the points' squared norms (row_norms). Each update is every point's nearest
// centroid (assign_range), then each centroid the float32 sum of its points in point order times
// the float32 1 / count (faiss's compute_centroids, which also gives each thread a range of
// centroids and scans every point for them); an empty cluster's centroid becomes 0. NaN points
// are in no cluster. `sizes` are the last update's counts (all 1 without an update). When all
// `iters` updates ran (none with iters = 0) and the last left no cluster empty, one more round
// assigns the points to the final centroids (`final_nearest`, `final_best`, as
// jdml_kmeans_assign) and sums their distances (`inertia`, float64 per piece, added in piece
// order); otherwise those hold K, NaN and NaN. Returns the number of updates run.
// Chunks of points of an update: each is assigned by whichever thread claims it first, and
// summed by every thread (its own range of clusters) in chunk order once it is assigned.
constexpr int64_t kReferenceChunk = 1024;

template <class Pool>
int64_t reference_lloyd(Pool& pool, const float* x, int64_t n, int64_t dim, int64_t clusters,
                        int64_t iters, float* c, float* sizes, int32_t* final_nearest,
                        float* final_best, float* inertia) {
  const int64_t pieces = std::clamp<int64_t>(n / kLloydPiecePoints, 1, kLloydPieces);
  const int64_t ranges = std::clamp<int64_t>(pool.num_threads(), 1, clusters);
  const int64_t chunks = std::max<int64_t>(1, (n + kReferenceChunk - 1) / kReferenceChunk);
  std::fill(sizes, sizes + clusters, 1.0f);  // no update: as XLA's
  std::vector<int32_t> nearest(n);
  std::vector<float> x_sq(n), best(n), c_sq(clusters), next(clusters * dim);
  std::vector<double> squares(pieces);
  centroid_norms(c, clusters, dim, c_sq.data());
  // an update's chunks: the next one to claim for assignment, and which are assigned
  std::atomic<int64_t> claimed{0};
  std::unique_ptr<std::atomic<bool>[]> assigned(new std::atomic<bool>[chunks]);
  const auto open_update = [&] {
    claimed.store(0);
    for (int64_t j = 0; j < chunks; ++j) assigned[j].store(false);
  };
  open_update();
  int64_t done = 0;
  bool empty = false;
  // Round 0 computes the norms, rounds 1 .. iters are updates, round iters + 1 the final
  // assignment. In an update each of `ranges` pieces sums its range of clusters over the chunks
  // in point order (faiss's float32 order, one range of centroids per thread), assigning the
  // next unclaimed chunks itself whenever the chunk it needs is not assigned yet: no pass over
  // the points is waited for, and each chunk is summed soon after it is assigned, while it is in
  // cache.
  const std::function<void(int64_t, int64_t)> piece = [&](int64_t round, int64_t p) {
    if (round == 0 || round == iters + 1) {
      if (p >= pieces) return;
      const int64_t begin = n * p / pieces, end = n * (p + 1) / pieces;
      if (round == 0) {
        row_norms(x, begin, end, dim, x_sq.data());
        return;
      }
      assign_range(x, x_sq.data(), c, c_sq.data(), dim, clusters, begin, end, final_nearest,
                   final_best);
      double square = 0.0;
      for (int64_t i = begin; i < end; ++i) square += final_best[i];
      squares[p] = square;
      return;
    }
    if (p >= ranges) return;
    const int64_t first = clusters * p / ranges, last = clusters * (p + 1) / ranges;
    float* sums = next.data() + first * dim;
    std::fill(sums, sums + (last - first) * dim, 0.0f);
    std::vector<int64_t> counts(last - first, 0);
    for (int64_t j = 0; j < chunks; ++j) {
      while (!assigned[j].load(std::memory_order_acquire)) {
        const int64_t mine =
            claimed.load(std::memory_order_relaxed) < chunks ? claimed.fetch_add(1) : chunks;
        if (mine >= chunks) {  // every chunk is claimed: another thread is assigning this one
          std::this_thread::yield();
          continue;
        }
        const int64_t begin = mine * kReferenceChunk;
        const int64_t end = std::min(n, begin + kReferenceChunk);
        assign_range(x, x_sq.data(), c, c_sq.data(), dim, clusters, begin, end, nearest.data(),
                     best.data());
        assigned[mine].store(true, std::memory_order_release);
      }
      const int64_t begin = j * kReferenceChunk, end = std::min(n, begin + kReferenceChunk);
      add_rows(x, nearest.data(), begin, end, dim, first, last - first, sums, counts.data());
    }
    for (int64_t k = 0; k < last - first; ++k) {
      const float size = static_cast<float>(counts[k]);
      const float scale = counts[k] > 0 ? 1.0f / size : 0.0f;
      for (int64_t d = 0; d < dim; ++d) sums[k * dim + d] *= scale;
      sizes[first + k] = size;
    }
  };
  const std::function<bool(int64_t)> after = [&](int64_t round) {
    if (round == 0) return true;
    if (round == iters + 1) {
      double total = 0.0;
      for (int64_t p = 0; p < pieces; ++p) total += squares[p];
      *inertia = static_cast<float>(total);
      return true;
    }
    ++done;
    // every thread has read the centroids of this update: the new ones replace them now
    std::copy(next.begin(), next.end(), c);
    empty = std::find(sizes, sizes + clusters, 0.0f) != sizes + clusters;
    if (empty) return false;
    centroid_norms(c, clusters, dim, c_sq.data());
    open_update();
    return true;
  };
  jdml::run_rounds(pool, std::max(pieces, ranges), iters + 2, piece, after);
  if (done < iters || empty) {  // no final assignment: out of range
    std::fill(final_nearest, final_nearest + n, static_cast<int32_t>(clusters));
    std::fill(final_best, final_best + n, std::numeric_limits<float>::quiet_NaN());
    *inertia = std::numeric_limits<float>::quiet_NaN();
  }
  return done;
}

ffi::Error ReferenceLloyd(ffi::ThreadPool pool, Points x, Points initial, Ints remaining,
                          ffi::ResultBuffer<ffi::F32, 2> centroids,
                          ffi::ResultBuffer<ffi::F32, 1> sizes,
                          ffi::ResultBuffer<ffi::S32, 1> steps,
                          ffi::ResultBuffer<ffi::S32, 1> final_nearest,
                          ffi::ResultBuffer<ffi::F32, 1> final_best,
                          ffi::ResultBuffer<ffi::F32, 1> inertia) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1];
  const int64_t clusters = initial.dimensions()[0];
  float* c = centroids->typed_data();
  std::copy(initial.typed_data(), initial.typed_data() + clusters * dim, c);
  try {
    steps->typed_data()[0] = static_cast<int32_t>(reference_lloyd(
        pool, x.typed_data(), n, dim, clusters, remaining.typed_data()[0], c,
        sizes->typed_data(), final_nearest->typed_data(), final_best->typed_data(),
        inertia->typed_data()));
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means updates: ") + err.what());
  }
  return ffi::Error::Success();
}

ffi::Error Lloyd(ffi::ThreadPool pool, Points x, Floats mean, Points initial, int64_t iters,
                 ffi::ResultBuffer<ffi::F32, 2> centroids, ffi::ResultBuffer<ffi::S32, 1> nearest,
                 ffi::ResultBuffer<ffi::F32, 1> best, ffi::ResultBuffer<ffi::F32, 1> inertia) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1];
  const int64_t clusters = initial.dimensions()[0];
  std::copy(initial.typed_data(), initial.typed_data() + clusters * dim,
            centroids->typed_data());
  try {
    lloyd(pool, x.typed_data(), mean.typed_data(), n, dim, clusters, iters,
          centroids->typed_data(), nearest->typed_data(), best->typed_data(),
          inertia->typed_data());
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means iterations: ") + err.what());
  }
  return ffi::Error::Success();
}

// Pieces of jdml_kmeans_sums per thread: each piece sums a range of clusters (unequal clusters
// make equal ranges unequal work, so the threads claim pieces as they come free).
constexpr int64_t kSumPiecesPerThread = 4;

// Every cluster's float32 sum of its points in point order, and its float32 count, for any
// number of clusters (nearest out of [0, K), e.g. NaN points, count for none): the sums of XLA's
// segment_sum bit for bit (a scatter-add, one point after another). Each piece takes a range of
// clusters and sums each one's points with its row in registers (add_rows_direct: a counting
// sort of the points by cluster, then the members of each), in parallel where XLA's scatter-add
// runs on one thread; that scatter had been the hottest XLA kernel of a 100-cluster k-means.
ffi::Error Sums(ffi::ThreadPool pool, Points x, Ints nearest, ffi::ResultBuffer<ffi::F32, 2> sums,
                ffi::ResultBuffer<ffi::F32, 1> counts) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1];
  const int64_t clusters = sums->dimensions()[0];
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t pieces = std::clamp<int64_t>(threads * kSumPiecesPerThread, 1, clusters);
  float* out = sums->typed_data();
  try {
    jdml::run_pieces(pool, pieces, [&](int64_t p) {
      const int64_t first = clusters * p / pieces, last = clusters * (p + 1) / pieces;
      std::fill(out + first * dim, out + last * dim, 0.0f);
      std::vector<int64_t> count(last - first, 0);
      if (direct_available()) {
        add_rows_direct(x.typed_data(), nearest.typed_data(), 0, n, dim, first, last - first,
                        out + first * dim, count.data());
      } else {
        add_rows(x.typed_data(), nearest.typed_data(), 0, n, dim, first, last - first,
                 out + first * dim, count.data());
      }
      for (int64_t k = first; k < last; ++k) {
        counts->typed_data()[k] = static_cast<float>(count[k - first]);
      }
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means sums: ") + err.what());
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------------------
// jdml_kmeans_assign_bounded: jdml_kmeans_assign inside Lloyd's iterations, skipping the points
// whose nearest centroid cannot have changed (Hamerly, "Making k-means even faster", SDM 2010).
// Each point keeps an upper bound U on its distance to its centroid and a lower bound L on its
// distance to every other centroid. When the centroids move by delta_j, U grows by its
// centroid's delta and L shrinks by the largest delta of another centroid (triangle
// inequality). A point is skipped if
//     L^2 - U^2 > 2 E,   E = gamma (|x| + max_j |c_j|)^2,   gamma = (D + 8) 2^-23,
// where E bounds the float32 rounding of the assignment's squared distance (|x|^2 + |c|^2 -
// 2 x.c, the dot product summed in any order, Higham's gamma_D with room to spare): then the
// distance the brute-force pass would compute to its centroid is below every other it would
// compute, so it would keep the point where it is, and skipping gives its very assignment.
// Otherwise U is first tightened to the exact distance (float64); if the test still fails, the
// point is assigned as jdml_kmeans_assign does, on sgemm tiles of the points that need it,
// and its bounds are reset from the smallest and second smallest squared distances. Bounds are
// stored in float32, rounded outward.
constexpr double kOutward = 1.0 / (1 << 22);  // float32 rounding, with room to spare

struct Drift {
  std::vector<double> delta;  // how far each centroid moved, rounded up
  double largest = 0, second = 0;
  int64_t farthest = -1;
  double max_norm = 0;  // max_j |c_j| of the new centroids
  double gamma = 0;
};

Drift drift(const float* c, const float* c_old, int64_t clusters, int64_t dim) {
  Drift out;
  out.delta.resize(clusters);
  out.gamma = static_cast<double>(dim + 8) * std::ldexp(1.0, -23);
  for (int64_t k = 0; k < clusters; ++k) {
    double moved = 0, norm = 0;
    for (int64_t d = 0; d < dim; ++d) {
      const double step = static_cast<double>(c[k * dim + d]) - c_old[k * dim + d];
      moved += step * step;
      norm += static_cast<double>(c[k * dim + d]) * c[k * dim + d];
    }
    const double delta = std::sqrt(moved) * (1 + 1e-12);
    out.delta[k] = delta;
    out.max_norm = std::max(out.max_norm, std::sqrt(norm) * (1 + 1e-12));
    if (delta > out.largest || out.farthest < 0) {
      out.second = out.largest;
      out.largest = delta;
      out.farthest = k;
    } else {
      out.second = std::max(out.second, delta);
    }
  }
  return out;
}

// The rounding bound E of one point's squared distances (see above).
inline double rounding_bound(const Drift& drift, float xs) {
  const double reach = std::sqrt(std::max(static_cast<double>(xs), 0.0)) + drift.max_norm;
  return drift.gamma * reach * reach;
}

// Whether bounds u and l keep the point's nearest centroid (NaN bounds never do).
inline bool settled(double u, double l, double bound) {
  return l > u && l * l - u * u > 2 * bound * (1 + 1e-9);
}

inline float round_up(double v) { return static_cast<float>(v * (1 + kOutward)); }
inline float round_down(double v) { return static_cast<float>(std::max(v, 0.0) * (1 - kOutward)); }

// Points [begin, end) of a bounded assignment (see above).
void assign_bounded_range(const float* x, const float* x_sq, const float* c, const float* c_sq,
                          const Drift& drift, int64_t dim, int64_t clusters, int64_t begin,
                          int64_t end, const int32_t* old_nearest, const float* old_upper,
                          const float* old_lower, int32_t* nearest, float* upper, float* lower) {
  std::vector<int64_t> todo;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t a = old_nearest[i];
    const double bound = rounding_bound(drift, x_sq[i]);
    nearest[i] = a;
    if (a < 0 || a >= clusters) {
      todo.push_back(i);
      continue;
    }
    double u = old_upper[i] + drift.delta[a];
    const double l = old_lower[i] - (a == drift.farthest ? drift.second : drift.largest);
    if (l > 0 && !settled(u, l, bound)) {  // tighten u to the exact distance
      double d2 = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const double diff = static_cast<double>(x[i * dim + d]) - c[a * dim + d];
        d2 += diff * diff;
      }
      u = std::sqrt(d2) * (1 + 1e-12);
    }
    if (!settled(u, l, bound)) {
      todo.push_back(i);
      continue;
    }
    upper[i] = round_up(u);
    lower[i] = round_down(l);
  }
  if (todo.empty()) return;
  static const NearestInRow nearest_two = nearest_in_row<true>();
  const int64_t ctile = std::min(clusters, kCentroidTile);
  const int64_t count = static_cast<int64_t>(todo.size());
  // Tiles of at most the points to assign, left uninitialised (every entry read is written
  // first): zero-filled tiles of the full size had cost more than the copies into them.
  const int64_t ptile = std::min(count, std::clamp<int64_t>(kTileScores / ctile, 1, kMaxPointTile));
  std::unique_ptr<float[]> rows_x(new float[ptile * dim]);
  std::unique_ptr<float[]> scores(new float[jdml::tile_floats(ptile, ctile)]);
  std::vector<float> rows_sq(ptile), best(ptile), second(ptile);
  std::vector<int32_t> found(ptile);
  jdml::OneThread one_thread;  // sgemm runs on this piece's thread only
  for (int64_t t0 = 0; t0 < count; t0 += ptile) {
    const int64_t rows = std::min(ptile, count - t0);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(rows_x.get() + r * dim, x + todo[t0 + r] * dim, dim * sizeof(float));
      rows_sq[r] = x_sq[todo[t0 + r]];
      best[r] = second[r] = std::numeric_limits<float>::infinity();
      found[r] = static_cast<int32_t>(clusters);  // stays out of range for NaN rows
    }
    for (int64_t k0 = 0; k0 < clusters; k0 += ctile) {
      const int64_t cols = std::min(ctile, clusters - k0), ld = jdml::tile_stride(cols);
      jdml::score_tile(rows_x.get(), rows, c + k0 * dim, cols, dim, 1.0f, scores.get());
      for (int64_t r = 0; r < rows; ++r) {
        nearest_two(scores.get() + r * ld, rows_sq[r], c_sq + k0, cols,
                    static_cast<int32_t>(k0), best[r], found[r], second[r]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = todo[t0 + r];
      const double bound = rounding_bound(drift, rows_sq[r]);
      nearest[i] = found[r];
      const bool point = found[r] < clusters;  // else a NaN point: tried again next time
      upper[i] = point ? round_up(std::sqrt(best[r] + bound))
                       : std::numeric_limits<float>::quiet_NaN();
      lower[i] = point ? round_down(std::sqrt(std::max(second[r] - bound, 0.0)))
                       : std::numeric_limits<float>::quiet_NaN();
    }
  }
}

ffi::Error AssignBounded(ffi::ThreadPool pool, Points x, Floats x_sq, Points c, Floats c_sq,
                         Points c_old, Ints old_nearest, Floats old_upper, Floats old_lower,
                         ffi::ResultBuffer<ffi::S32, 1> nearest,
                         ffi::ResultBuffer<ffi::F32, 1> upper,
                         ffi::ResultBuffer<ffi::F32, 1> lower) {
  const int64_t n = x.dimensions()[0], dim = x.dimensions()[1], clusters = c.dimensions()[0];
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), n / 256));
  try {
    const Drift moved = drift(c.typed_data(), c_old.typed_data(), clusters, dim);
    jdml::run_pieces(pool, pieces, [&](int64_t i) {
      assign_bounded_range(x.typed_data(), x_sq.typed_data(), c.typed_data(), c_sq.typed_data(),
                           moved, dim, clusters, n * i / pieces, n * (i + 1) / pieces,
                           old_nearest.typed_data(), old_upper.typed_data(),
                           old_lower.typed_data(), nearest->typed_data(), upper->typed_data(),
                           lower->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-means assignment: ") + err.what());
  }
  return ffi::Error::Success();
}

// Throws for shapes a host function cannot take: N x dim points (both at least 1), clusters in
// [1, N], iterations at least 0.
void check_shapes(int64_t n, int64_t dim, int64_t clusters, int64_t iters) {
  if (n < 1 || dim < 1 || clusters < 1 || clusters > n || iters < 0) {
    throw std::invalid_argument("bad shapes: " + std::to_string(n) + " points, " +
                                std::to_string(dim) + " dimensions, " + std::to_string(clusters) +
                                " clusters, " + std::to_string(iters) + " iterations");
  }
}

// Writes `failure`, if any, to `error` (at most `error_size` bytes with its NUL) after `what`;
// returns 0 without a failure, else 1 (the host functions' convention, as jdml_knn_search_host).
int host_status(const std::string& failure, const char* what, char* error, int64_t error_size) {
  if (failure.empty()) return 0;
  if (error_size > 0) std::snprintf(error, error_size, "%s: %s", what, failure.c_str());
  return 1;
}

}  // namespace

// The k-means of host memory, called directly (ctypes) rather than through XLA, as faiss is
// called on NumPy arrays: the points are read where they are (any alignment), where a jitted
// call needs them 64-byte aligned, and a NumPy array's memory rarely is (an aligned copy of
// 20,000 x 512 points took 11 ms, as long as a 5-cluster k-means of them). The same functions
// as the XLA handlers, on OpenMP's threads (jdml::HostPool), so the same results bit for bit.
// Each returns 0, or 1 with a message in `error`.

// jdml_kmeans_mean on host memory: the (dim) mean of x (n x dim).
extern "C" int jdml_kmeans_mean_host(const float* x, int64_t n, int64_t dim, float* mean,
                                     char* error, int64_t error_size) {
  const std::string failure = jdml::host_call([&](jdml::HostPool& pool) {
    check_shapes(n, dim, 1, 0);
    column_mean(pool, x, n, dim, mean);
  });
  return host_status(failure, "k-means mean", error, error_size);
}

// jdml_kmeans_lloyd on host memory: `iters` Lloyd steps on x (n x dim) minus `mean` from
// `centroids` (clusters x dim, centred; updated in place), then the final assignment.
extern "C" int jdml_kmeans_lloyd_host(const float* x, int64_t n, int64_t dim, const float* mean,
                                      float* centroids, int64_t clusters, int64_t iters,
                                      int32_t* nearest, float* best, float* inertia, char* error,
                                      int64_t error_size) {
  const std::string failure = jdml::host_call([&](jdml::HostPool& pool) {
    check_shapes(n, dim, clusters, iters);
    lloyd(pool, x, mean, n, dim, clusters, iters, centroids, nearest, best, inertia);
  });
  return host_status(failure, "k-means iterations", error, error_size);
}

// jdml_kmeans_reference_lloyd on host memory: up to `iters` updates of `centroids` (in place),
// the last update's `sizes`, the updates run (`steps`), and the final assignment if it was made.
extern "C" int jdml_kmeans_reference_lloyd_host(const float* x, int64_t n, int64_t dim,
                                                float* centroids, int64_t clusters, int64_t iters,
                                                float* sizes, int64_t* steps, int32_t* nearest,
                                                float* best, float* inertia, char* error,
                                                int64_t error_size) {
  const std::string failure = jdml::host_call([&](jdml::HostPool& pool) {
    check_shapes(n, dim, clusters, iters);
    *steps = reference_lloyd(pool, x, n, dim, clusters, iters, centroids, sizes, nearest, best,
                             inertia);
  });
  return host_status(failure, "k-means updates", error, error_size);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_lloyd, Lloyd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Attr<int64_t>("iters")
                                  .Ret<Points>()
                                  .Ret<Ints>()
                                  .Ret<Floats>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_mean, Mean,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_reference_lloyd, ReferenceLloyd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Points>()
                                  .Arg<Ints>()
                                  .Ret<Points>()
                                  .Ret<Floats>()
                                  .Ret<Ints>()
                                  .Ret<Ints>()
                                  .Ret<Floats>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_centre, Centre,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Ret<Points>()
                                  .Ret<Floats>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_assign_bounded, AssignBounded,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Arg<Ints>()
                                  .Arg<Floats>()
                                  .Arg<Floats>()
                                  .Ret<Ints>()
                                  .Ret<Floats>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_sums, Sums,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Ints>()
                                  .Ret<Points>()
                                  .Ret<Floats>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_kmeans_assign, Assign,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Arg<Points>()
                                  .Arg<Floats>()
                                  .Ret<Ints>()
                                  .Ret<Floats>());
