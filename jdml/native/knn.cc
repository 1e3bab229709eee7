// Exact top-k of nearest-neighbour search as XLA FFI handlers for the CPU backend (see
// jdml/native/knn.py and jdml/native/build.py).
//
//   jdml_knn_top: for every query q, the k references r with the largest scores
//     scale * q.r + bias[r], best first: score descending, equal scores by lower reference
//     index. knn.py passes the scale and biases of its ranking scores, 2 q.r - |r|^2 (Euclidean)
//     or q.r (cosine); padding references have bias -inf, and -inf never enters a result. Rows
//     with fewer than k finite scores end in (-inf, INT32_MAX) slots.
//   jdml_order_rows: rows of (distance, index) pairs in (distance, index) order.
//   jdml_knn_bias: the Euclidean ranking score's reference terms -|r|^2, once for a search of
//     several blocks (jdml_knn_search computes them itself for one block).
//   jdml_knn_search: the whole search of a block of queries, as knn.py's XLA path finishes it:
//     the k (+ 1 with exclude_self) best of jdml_knn_top, the query's own index dropped,
//     the scores turned into distances and the rows put in (distance, index) order, in one call.
//     knn.py's jitted block is then this call alone, which XLA's CPU client runs on the calling
//     thread (a program of fewer than 1,000 XLA flops is "cheap" and is not handed to another
//     thread; after the process has been idle, that hand-off costs about a millisecond on a
//     2-core VM, as much as the whole search of 1,000 x 1,000).
//   jdml_knn_search_host (a plain C function, not an FFI handler): the same search of every
//     query against every reference on host memory, called directly (see its comment).
//
// XLA computes a block's scores with a matmul whose (queries x references) result goes to
// memory, and a top-k pass reads them back. Here each thread takes a range of queries; for a tile
// of queries against a tile of references, oneDNN's sgemm writes the scores into a tile that
// stays in cache, and each query's scores are filtered against the k-th best score found so far
// (vector compares; almost every score fails once the first tiles are seen; the first tile starts
// from a floor of its k-th best rather than -inf). The few that pass go to the query's buffer of
// 2k + 16 candidates; a full buffer is cut back to its k best (a branch-free quickselect), which
// raises the threshold.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "gemm.h"
#include "oneapi/dnnl/dnnl.h"
#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using Matrix = ffi::Buffer<ffi::F32, 2>;
using IntMatrix = ffi::Buffer<ffi::S32, 2>;
using Vector = ffi::Buffer<ffi::F32, 1>;
using IntScalar = ffi::BufferR0<ffi::S32>;

namespace {

// Tiles of query_tile(width) queries against tile_scores(width) / query_tile(width) references.
// Below kWideDims dimensions, 256 queries and 1 MB of scores, which stay in cache while they are
// filtered. From it on the search is sgemm's arithmetic (at 2,048 dimensions both jdml and faiss
// run at this CPU's matmul peak): 1,024 queries against 1,024 references (4 MB of scores), so
// that sgemm reads each reference tile, from the last-level cache, for 4 times as many queries
// (20,000 x 2,048 against a gallery: 0.40 TFLOP/s, 1.13-1.14x faiss, where 256 x 1,024 gave
// 0.35, 0.99x).
constexpr int64_t kWideDims = 1024;

int64_t query_tile(int64_t width) { return width < kWideDims ? 256 : 1024; }
int64_t tile_scores(int64_t width) { return width < kWideDims ? 1 << 18 : 1 << 20; }

// A candidate as one integer key, smaller for a better candidate: the score's bits mapped to an
// unsigned integer of the same order and complemented (higher score first) above the index (lower
// index first on equal scores), so that selection and sorting compare integers.
inline uint64_t key(float score, int32_t index) {
  score += 0.0f;  // -0.0 + 0.0 = +0.0: equal zeros get one key
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ordered) << 32) | static_cast<uint32_t>(index);
}

inline float score_of(uint64_t key) {
  const uint32_t ordered = ~static_cast<uint32_t>(key >> 32);
  const uint32_t bits = (ordered & 0x80000000u) ? (ordered & 0x7FFFFFFFu) : ~ordered;
  float score;
  std::memcpy(&score, &bits, sizeof score);
  return score;
}

inline int32_t index_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// Rearranges keys[0:n) so that keys[k - 1] is the k-th smallest and none before it is larger
// (quickselect). Keys are distinct. The partitions are branch-free, each key written to both ends
// of `scratch` (n keys) and the end it belongs to advanced: random keys would mispredict half the
// branches of std::nth_element's partition, which then costs more than the rest of the search.
void select_kth(uint64_t* keys, int64_t n, int64_t k, uint64_t* scratch) {
  int64_t lo = 0, hi = n;
  const int64_t target = k - 1;
  while (hi - lo > 32) {
    uint64_t a = keys[lo], b = keys[lo + (hi - lo) / 2], c = keys[hi - 1];
    // median of three: at least one key is below it and two are not, so both sides shrink
    const uint64_t pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    int64_t left = 0, right = hi - lo - 1;
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t x = keys[i];
      const bool below = x < pivot;
      scratch[left] = x;
      scratch[right] = x;
      left += below;
      right -= !below;
    }
    std::memcpy(keys + lo, scratch, (hi - lo) * sizeof(uint64_t));
    if (target < lo + left) {
      hi = lo + left;
    } else {
      lo += left;
    }
  }
  std::nth_element(keys + lo, keys + target, keys + hi);
}

// The best k candidates seen so far of one query, among at most `cap` kept.
//
// References arrive in increasing index order, so a new candidate whose score equals the k-th
// best's is worse than it (higher index): only scores strictly above the threshold can enter.
struct Best {
  uint64_t* buffer;
  int64_t count;
  float threshold;

  uint64_t* scratch;

  // Keeps the k best of the buffer; the k-th best's score becomes the threshold.
  void cut(int64_t k) {
    select_kth(buffer, count, k, scratch);
    count = k;
    threshold = score_of(buffer[k - 1]);
  }

  inline void push(float score, int32_t index, int64_t k, int64_t cap) {
    if (!(score > threshold)) return;  // the threshold may have risen since the compare
    buffer[count++] = key(score, index);
    if (count == cap) cut(k);
  }
};

// Offers the scores dots[j] + bias[j], j < cols, of references first, first + 1, ... to `best`,
// a scalar compare each.
void offer_scalar(const float* dots, const float* bias, int64_t cols, int32_t first, Best& best,
                  int64_t k, int64_t cap) {
  for (int64_t j = 0; j < cols; ++j) {
    const float score = dots[j] + bias[j];
    if (score > best.threshold) best.push(score, first + static_cast<int32_t>(j), k, cap);
  }
}

using Offer = void (*)(const float*, const float*, int64_t, int32_t, Best&, int64_t, int64_t);

#if defined(__x86_64__) && defined(__GNUC__)
// Eight compares at once where the CPU has AVX2 (the library is built for baseline x86-64); a
// mask bit per passing score.
__attribute__((target("avx2"))) void offer_avx2(const float* dots, const float* bias,
                                                int64_t cols, int32_t first, Best& best,
                                                int64_t k, int64_t cap) {
  int64_t j = 0;
  alignas(32) float scores[16];
  for (; j + 16 <= cols; j += 16) {
    const __m256 threshold = _mm256_set1_ps(best.threshold);
    const __m256 low_scores =
        _mm256_add_ps(_mm256_loadu_ps(dots + j), _mm256_loadu_ps(bias + j));
    const __m256 high_scores =
        _mm256_add_ps(_mm256_loadu_ps(dots + j + 8), _mm256_loadu_ps(bias + j + 8));
    const int low = _mm256_movemask_ps(_mm256_cmp_ps(low_scores, threshold, _CMP_GT_OQ));
    const int high = _mm256_movemask_ps(_mm256_cmp_ps(high_scores, threshold, _CMP_GT_OQ));
    unsigned mask = static_cast<unsigned>(low | (high << 8));
    if (!mask) continue;
    _mm256_store_ps(scores, low_scores);
    _mm256_store_ps(scores + 8, high_scores);
    for (; mask; mask &= mask - 1) {
      const int c = __builtin_ctz(mask);
      best.push(scores[c], first + static_cast<int32_t>(j + c), k, cap);
    }
  }
  offer_scalar(dots + j, bias + j, cols - j, first + static_cast<int32_t>(j), best, k, cap);
}
#endif

Offer offer_function() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) return offer_avx2;
#endif
  return offer_scalar;
}

// A lower bound of the k-th best of the scores dots[j] + bias[j], j < cols (cols >= k): the
// smallest of the maxima of k groups of consecutive scores. Each maximum is a different score,
// so at least k scores reach it. NaN scores are ignored.
float kth_floor_scalar(const float* dots, const float* bias, int64_t cols, int64_t k) {
  const int64_t size = cols / k;
  float floor = std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < k; ++g) {
    float group = -std::numeric_limits<float>::infinity();
    for (int64_t j = g * size; j < (g + 1) * size; ++j) group = std::max(group, dots[j] + bias[j]);
    floor = std::min(floor, group);
  }
  return floor;
}

using KthFloor = float (*)(const float*, const float*, int64_t, int64_t);

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) float kth_floor_avx2(const float* dots, const float* bias,
                                                     int64_t cols, int64_t k) {
  const int64_t size = cols / k;
  float floor = std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < k; ++g) {
    const int64_t start = g * size, stop = start + size;
    __m256 lanes = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t j = start;
    for (; j + 8 <= stop; j += 8) {
      const __m256 scores = _mm256_add_ps(_mm256_loadu_ps(dots + j), _mm256_loadu_ps(bias + j));
      lanes = _mm256_max_ps(scores, lanes);  // a NaN score leaves the lanes as they were
    }
    alignas(32) float lane[8];
    _mm256_store_ps(lane, lanes);
    float group = lane[0];
    for (int l = 1; l < 8; ++l) group = std::max(group, lane[l]);
    for (; j < stop; ++j) group = std::max(group, dots[j] + bias[j]);
    floor = std::min(floor, group);
  }
  return floor;
}
#endif

// A threshold below x that every score >= x exceeds, also where the thread flushes subnormal
// floats to zero (XLA's threads do): the next float down, 0 or a subnormal would compare equal
// to x there. Scores between the threshold and x only add candidates, which the final
// selection drops.
float below(float x) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (std::isinf(x)) return x > 0 ? std::numeric_limits<float>::max() : -kInf;
  return x - std::max(std::abs(x) * 0x1p-20f, 2 * std::numeric_limits<float>::min());
}

KthFloor kth_floor_function() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) return kth_floor_avx2;
#endif
  return kth_floor_scalar;
}

// Queries [begin, end) against all references: their k best, written to values / indices.
void top_range(const float* queries, const float* references, const float* bias, float scale,
               int64_t width, int64_t refs, int64_t k, int64_t begin, int64_t end, float* values,
               int32_t* indices) {
  static const Offer offer = offer_function();
  static const KthFloor kth_floor = kth_floor_function();
  const int64_t cap = 2 * k + 16;
  if (end <= begin) return;
  const int64_t qtile = std::min(query_tile(width), end - begin);
  const int64_t rtile =
      std::clamp<int64_t>(tile_scores(width) / std::max<int64_t>(qtile, 1), 16, refs);
  // The tile of scores (1 or 4 MB) is this thread's memory from its last call: a fresh one is
  // mapped and zeroed on every call (a tenth of a 1 ms search). The candidate buffers are
  // left uninitialised, so that only the part that fills is ever touched.
  thread_local std::vector<float> scores_memory;
  const size_t tile = jdml::tile_floats(qtile, rtile);
  if (scores_memory.size() < tile) scores_memory.resize(tile);
  float* scores = scores_memory.data();
  std::unique_ptr<uint64_t[]> buffers(new uint64_t[qtile * cap]), scratch(new uint64_t[cap]);
  std::vector<Best> best(qtile);
  jdml::OneThread one_thread;  // sgemm runs on this piece's thread only
  for (int64_t q0 = begin; q0 < end; q0 += qtile) {
    const int64_t rows = std::min(qtile, end - q0);
    for (int64_t i = 0; i < rows; ++i) {
      best[i] = Best{buffers.get() + i * cap, 0, -std::numeric_limits<float>::infinity(),
                     scratch.get()};
    }
    for (int64_t r0 = 0; r0 < refs; r0 += rtile) {
      const int64_t cols = std::min(rtile, refs - r0), ld = jdml::tile_stride(cols);
      // dots (rows x cols) = scale * queries[q0:q0+rows] . references[r0:r0+cols]^T, row-major
      jdml::score_tile(queries + q0 * width, rows, references + r0 * width, cols, width, scale,
                       scores);
      for (int64_t i = 0; i < rows; ++i) {
        const float* dots = scores + i * ld;
        if (r0 > 0 || cols < 4 * k) {
          offer(dots, bias + r0, cols, static_cast<int32_t>(r0), best[i], k, cap);
          continue;
        }
        // The first tile, from a threshold just below a floor of its k-th best score rather
        // than from -inf: scores equal to the floor enter, and from the next tile on only
        // higher ones, since k scores of lower index reach it. Without it the buffer would be
        // cut again and again while its threshold rises.
        const float floor = kth_floor(dots, bias, cols, k);
        best[i].threshold = below(floor);
        offer(dots, bias, cols, 0, best[i], k, cap);
        best[i].threshold = std::max(best[i].threshold, floor);
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      Best& b = best[i];
      if (b.count > k) b.cut(k);
      std::sort(b.buffer, b.buffer + b.count);
      float* v = values + (q0 + i) * k;
      int32_t* n = indices + (q0 + i) * k;
      for (int64_t j = 0; j < k; ++j) {
        const bool filled = j < b.count;
        v[j] = filled ? score_of(b.buffer[j]) : -std::numeric_limits<float>::infinity();
        n[j] = filled ? index_of(b.buffer[j]) : std::numeric_limits<int32_t>::max();
      }
    }
  }
}

ffi::Error Top(ffi::ThreadPool pool, Matrix queries, Matrix references, Vector bias, int64_t k,
               float scale,
               ffi::ResultBuffer<ffi::F32, 2> values,
               ffi::ResultBuffer<ffi::S32, 2> indices) {
  const int64_t n = queries.dimensions()[0], width = queries.dimensions()[1];
  const int64_t refs = references.dimensions()[0];
  if (references.dimensions()[1] != width || bias.dimensions()[0] != refs || k < 1 || refs < 1) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "k-nearest: bad shapes or k");
  }
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), n / 32));
  try {
    jdml::run_pieces(pool, pieces, [&](int64_t i) {
      top_range(queries.typed_data(), references.typed_data(), bias.typed_data(), scale, width,
                refs, k, n * i / pieces, n * (i + 1) / pieces, values->typed_data(),
                indices->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-nearest: ") + err.what());
  }
  return ffi::Error::Success();
}

// One row of k (distance, index) pairs in (distance, index) order, by insertion sort: the rows
// arrive sorted by distance except within runs of equal distances, so this is one pass. `keys`
// and `row` hold k entries each.
void order_row(const float* d, const int32_t* n, int64_t k, uint64_t* keys, float* row,
               float* out_distances, int32_t* out_indices) {
  for (int64_t j = 0; j < k; ++j) {
    // key() puts higher scores first: negated distances put smaller distances first
    uint64_t x = key(-d[j], n[j]);
    float v = d[j];
    int64_t i = j;
    for (; i > 0 && keys[i - 1] > x; --i) {
      keys[i] = keys[i - 1];
      row[i] = row[i - 1];
    }
    keys[i] = x;
    row[i] = v;
  }
  for (int64_t j = 0; j < k; ++j) {
    out_distances[j] = row[j];
    out_indices[j] = index_of(keys[j]);
  }
}

// Rows [begin, end) of (distance, index) pairs in (distance, index) order (order_row).
void order_range(const float* distances, const int32_t* indices, int64_t k, int64_t begin,
                 int64_t end, float* out_distances, int32_t* out_indices) {
  std::vector<uint64_t> keys(k);
  std::vector<float> row(k);
  for (int64_t r = begin; r < end; ++r) {
    order_row(distances + r * k, indices + r * k, k, keys.data(), row.data(),
              out_distances + r * k, out_indices + r * k);
  }
}

// |x|^2 of a row of `width` floats, in float32: 16 running sums of every 16th square (vector
// registers; one sum would wait on each add, 0.6 ms for 1,000 x 1,024), added up pairwise, then
// the tail. The order is fixed, so every CPU gives the same sums.
float squared_norm(const float* x, int64_t width) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= width; d += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[d + l] * x[d + l];
  }
  for (int half = kLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  }
  float sum = lanes[0];
  for (; d < width; ++d) sum += x[d] * x[d];
  return sum;
}

// What a search asks of jdml_knn_search (see the top of this file).
struct Search {
  int64_t k;          // neighbours per query
  bool exclude_self;  // query i is reference offset + i, and is not its own neighbour
  bool cosine;        // scores q.r and distances 1 - score; else 2 q.r - |r|^2 and the L2
  int32_t offset;     // index of the block's first query among the references
};

// Queries [begin, end): their k nearest, from the k + exclude_self best scores `values` /
// `indices` (jdml_knn_top's rows): the own index dropped wherever it is (the last candidate if
// it is not there), the scores turned into distances (sqrt(max(|q|^2 - score, 0)) or
// 1 - score), and the rows put in (distance, index) order.
void finish_range(const Search& search, const float* queries, int64_t width, const float* values,
                  const int32_t* indices, int64_t begin, int64_t end, float* out_distances,
                  int32_t* out_indices) {
  const int64_t k = search.k, wanted = k + search.exclude_self;
  std::vector<uint64_t> keys(k);
  std::vector<float> row(k), distances(k);
  std::vector<int32_t> kept(k);
  for (int64_t r = begin; r < end; ++r) {
    const float* v = values + r * wanted;
    const int32_t* n = indices + r * wanted;
    int64_t cut = k;
    if (search.exclude_self) {
      for (int64_t j = 0; j < wanted; ++j) {
        if (n[j] == search.offset + r) {
          cut = j;
          break;
        }
      }
    }
    const float q_sq = search.cosine ? 0.0f : squared_norm(queries + r * width, width);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t from = j + (j >= cut);
      distances[j] = search.cosine ? 1.0f - v[from] : std::sqrt(std::max(q_sq - v[from], 0.0f));
      kept[j] = n[from];
    }
    order_row(distances.data(), kept.data(), k, keys.data(), row.data(), out_distances + r * k,
              out_indices + r * k);
  }
}

// Queries [begin, end) of a search: their top-k (top_range) and its finish (finish_range),
// written to rows [begin, end) of distances / indices.
void search_range(const Search& search, const float* queries, const float* references,
                  const float* bias, int64_t width, int64_t refs, int64_t begin, int64_t end,
                  float* distances, int32_t* indices) {
  const int64_t rows = end - begin, wanted = search.k + search.exclude_self;
  if (rows <= 0) return;
  std::vector<float> values(rows * wanted);
  std::vector<int32_t> candidates(rows * wanted);
  Search range = search;  // the range's own rows, from 0
  range.offset += static_cast<int32_t>(begin);
  const float* rows_queries = queries + begin * width;
  top_range(rows_queries, references, bias, search.cosine ? 1.0f : 2.0f, width, refs, wanted, 0,
            rows, values.data(), candidates.data());
  finish_range(range, rows_queries, width, values.data(), candidates.data(), 0, rows,
               distances + begin * search.k, indices + begin * search.k);
}

// Pieces of work over `rows` rows of `width` floats: one per thread (`threads`, the caller's
// included), fewer where a piece would be under `least` floats.
int64_t pieces_of(int64_t threads, int64_t rows, int64_t width, int64_t least) {
  return std::clamp<int64_t>(rows * width / least, 1, std::max<int64_t>(1, threads));
}

// The query ranges of a search of n queries of `width` floats with `threads` threads: at most
// one query tile each (a range of one tile packs the references for sgemm once, as a tile of a
// larger range would), so that after an idle moment, when a helper thread starts late, the
// others take more of them.
int64_t query_ranges(int64_t n, int64_t width, int64_t threads) {
  const int64_t tile = query_tile(width);
  return std::max(pieces_of(threads, n, 1, 32), (n + tile - 1) / tile);
}

ffi::Error Order(ffi::ThreadPool pool, Matrix distances, IntMatrix indices,
                 ffi::ResultBuffer<ffi::F32, 2> out_distances,
                 ffi::ResultBuffer<ffi::S32, 2> out_indices) {
  const int64_t rows = distances.dimensions()[0], k = distances.dimensions()[1];
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), rows / 64));
  try {
    jdml::run_pieces(pool, pieces, [&](int64_t i) {
      order_range(distances.typed_data(), indices.typed_data(), k, rows * i / pieces,
                  rows * (i + 1) / pieces, out_distances->typed_data(),
                  out_indices->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("ordering rows: ") + err.what());
  }
  return ffi::Error::Success();
}

// Biases -|r|^2 of references [begin, end) (the Euclidean ranking score's reference term).
void bias_range(const float* references, int64_t width, int64_t begin, int64_t end, float* bias) {
  for (int64_t r = begin; r < end; ++r) bias[r] = -squared_norm(references + r * width, width);
}

ffi::Error Bias(ffi::ThreadPool pool, Matrix references, ffi::ResultBuffer<ffi::F32, 1> bias) {
  const int64_t refs = references.dimensions()[0], width = references.dimensions()[1];
  const int64_t pieces = pieces_of(pool.num_threads(), refs, width, 1 << 16);
  try {
    jdml::run_pieces(pool, pieces, [&](int64_t i) {
      bias_range(references.typed_data(), width, refs * i / pieces, refs * (i + 1) / pieces,
                 bias->typed_data());
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-nearest: ") + err.what());
  }
  return ffi::Error::Success();
}

ffi::Error SearchBlock(ffi::ThreadPool pool, Matrix queries, Matrix references, Vector bias,
                       IntScalar offset, int64_t k, bool exclude_self, bool cosine,
                       ffi::ResultBuffer<ffi::F32, 2> distances,
                       ffi::ResultBuffer<ffi::S32, 2> indices) {
  const int64_t n = queries.dimensions()[0], width = queries.dimensions()[1];
  const int64_t refs = references.dimensions()[0];
  const int64_t given = bias.dimensions()[0];
  const int64_t wanted = k + exclude_self;
  if (references.dimensions()[1] != width || (given != 0 && given != refs) || k < 1 ||
      wanted > refs) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "k-nearest: bad shapes or k");
  }
  const Search search{k, exclude_self, cosine, offset.typed_data()[0]};
  // Round 0 computes the biases -|r|^2 (0 for cosine) unless they are given (a search of several
  // blocks computes them once, with jdml_knn_bias); round 1 searches ranges of queries.
  const bool compute_bias = !given && !cosine;
  std::vector<float> own_bias(given ? 0 : refs, 0.0f);
  const float* bias_data = given ? bias.typed_data() : own_bias.data();
  const int64_t bias_pieces =
      compute_bias ? pieces_of(pool.num_threads(), refs, width, 1 << 16) : 0;
  const int64_t query_pieces = query_ranges(n, width, pool.num_threads());
  const int64_t first = compute_bias ? 0 : 1;
  try {
    jdml::run_rounds(
        pool, std::max(bias_pieces, query_pieces), 2 - first,
        [&](int64_t round, int64_t i) {
          if (round + first == 0) {
            if (i < bias_pieces) {
              bias_range(references.typed_data(), width, refs * i / bias_pieces,
                         refs * (i + 1) / bias_pieces, own_bias.data());
            }
            return;
          }
          if (i >= query_pieces) return;
          search_range(search, queries.typed_data(), references.typed_data(), bias_data, width,
                       refs, n * i / query_pieces, n * (i + 1) / query_pieces,
                       distances->typed_data(), indices->typed_data());
        },
        [](int64_t) { return true; });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("k-nearest: ") + err.what());
  }
  return ffi::Error::Success();
}

}  // namespace

// jdml_knn_search on host memory, for every query against every reference, called directly
// (ctypes) rather than through XLA, as faiss is called on NumPy arrays: a jitted call of the
// same search costs 0.3-0.6 ms of JAX dispatch after an idle moment, and host arrays must first
// be copied to 64-byte alignment, together a third of a search of 1,000 x 1,000. Here the arrays
// are read where they are (any alignment: sgemm and the vector loads are unaligned ones). The
// threads are OpenMP's (XLA's pool is reachable only from inside a program); the query ranges
// and the biases are the XLA handler's for one block, so the results are its results, bit for
// bit. Returns 0, or 1 with a message in `error` (at most `error_size` bytes with its NUL).
extern "C" int jdml_knn_search_host(const float* queries, int64_t n, const float* references,
                                    int64_t refs, int64_t width, int64_t k, int exclude_self,
                                    int cosine, float* distances, int32_t* indices, char* error,
                                    int64_t error_size) {
  std::string failure;
  if (n < 0 || width < 1 || k < 1 || k + (exclude_self != 0) > refs) failure = "bad shapes or k";
  const Search search{k, exclude_self != 0, cosine != 0, 0};
  std::vector<float> bias(failure.empty() && !cosine ? refs : 0, 0.0f);
  const int64_t bias_rows = bias.size();
  const int64_t ranges = failure.empty() ? query_ranges(n, width, omp_get_max_threads()) : 0;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < bias_rows; ++r) bias_range(references, width, r, r + 1, bias.data());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < ranges; ++i) {
      try {
        search_range(search, queries, references, bias.data(), width, refs, n * i / ranges,
                     n * (i + 1) / ranges, distances, indices);
      } catch (const std::exception& err) {
#pragma omp critical
        if (failure.empty()) failure = err.what();
      }
    }
  }
  if (failure.empty()) return 0;
  if (error_size > 0) std::snprintf(error, error_size, "k-nearest: %s", failure.c_str());
  return 1;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_knn_bias, Bias,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Matrix>()
                                  .Ret<Vector>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_knn_search, SearchBlock,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Matrix>()
                                  .Arg<Matrix>()
                                  .Arg<Vector>()
                                  .Arg<IntScalar>()
                                  .Attr<int64_t>("k")
                                  .Attr<bool>("exclude_self")
                                  .Attr<bool>("cosine")
                                  .Ret<Matrix>()
                                  .Ret<IntMatrix>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_order_rows, Order,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Matrix>()
                                  .Arg<IntMatrix>()
                                  .Ret<Matrix>()
                                  .Ret<IntMatrix>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_knn_top, Top,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Matrix>()
                                  .Arg<Matrix>()
                                  .Arg<Vector>()
                                  .Attr<int64_t>("k")
                                  .Attr<float>("scale")
                                  .Ret<Matrix>()
                                  .Ret<IntMatrix>());
