// Matrix products through oneDNN's sgemm as an XLA FFI handler for the CPU backend (see
// jdml/native/build.py and jdml/nn/pointwise.py).
//
//   jdml_dnnl_matmul:          c = op(a) @ op(b), op(m) = m^T where trans_a / trans_b is set
//   jdml_dnnl_batched_matmul:  c[g] = op(a[g]) @ op(b[g]) for every g of a leading batch axis
//
// All row-major float32 matrices. The rows of c (trans_a unset) or the summed dimension
// (trans_a set, as in the kernel gradient x^T @ dy of a 1x1 convolution) are split into one
// piece per thread of XLA's intra-op pool, each piece run single-threaded; partial products
// of the summed dimension are added in piece order, so a call's result depends only on its
// shapes and the pool's size. A batched call gives each thread a run of whole matrices (the
// attention products of a vision transformer: batch x heads small products). On EfficientNet-Lite0's 32 1x1 layers (batch 112, 64 px, forward
// and backward) these products took 158 ms against 170 for XLA's own dots
// (bench/bench_depthwise.py --sections pointwise).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jdml::OneThread;
using jdml::run_pieces;

namespace {

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc) {
  OneThread one_thread;
  if (dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc) != dnnl_success) {
    throw std::runtime_error("dnnl_sgemm failed");
  }
}

using F32 = ffi::Buffer<ffi::F32, 2>;
using OutF32 = ffi::ResultBuffer<ffi::F32, 2>;

ffi::Error Matmul(ffi::ThreadPool pool, F32 a, F32 b, OutF32 c, bool trans_a, bool trans_b) {
  try {
    const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
    const int64_t m = trans_a ? ad[1] : ad[0], k = trans_a ? ad[0] : ad[1];
    const int64_t n = trans_b ? bd[0] : bd[1];
    if ((trans_b ? bd[1] : bd[0]) != k || cd[0] != m || cd[1] != n || (trans_a && trans_b)) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "matmul: shapes do not match");
    }
    const float* ap = reinterpret_cast<const float*>(a.untyped_data());
    const float* bp = reinterpret_cast<const float*>(b.untyped_data());
    float* cp = reinterpret_cast<float*>(c->untyped_data());
    const char tb = trans_b ? 'T' : 'N';
    const int64_t lda = ad[1], ldb = bd[1];
    if (m == 0 || n == 0) return ffi::Error::Success();
    if (!trans_a) {  // rows of c in pieces
      const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), m));
      run_pieces(pool, pieces, [&](int64_t p) {
        const int64_t first = m * p / pieces, last = m * (p + 1) / pieces;
        if (last > first) {
          sgemm('N', tb, last - first, n, k, ap + first * lda, lda, bp, ldb, cp + first * n, n);
        }
      });
      return ffi::Error::Success();
    }
    // c = a^T @ b: the summed dimension (rows of a and b) in pieces, partial sums added in order
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), k));
    std::vector<std::vector<float>> parts(pieces - 1, std::vector<float>(m * n));
    run_pieces(pool, pieces, [&](int64_t p) {
      const int64_t first = k * p / pieces, last = k * (p + 1) / pieces;
      float* out = p == 0 ? cp : parts[p - 1].data();
      if (last > first) {
        sgemm('T', 'N', m, n, last - first, ap + first * lda, lda, bp + first * ldb, ldb, out, n);
      } else {
        std::fill(out, out + m * n, 0.0f);
      }
    });
    for (const auto& part : parts) {
      for (int64_t i = 0; i < m * n; ++i) cp[i] += part[i];
    }
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("matmul: ") + err.what());
  }
  return ffi::Error::Success();
}

using B32 = ffi::Buffer<ffi::F32, 3>;
using OutB32 = ffi::ResultBuffer<ffi::F32, 3>;

ffi::Error BatchedMatmul(ffi::ThreadPool pool, B32 a, B32 b, OutB32 c, bool trans_a,
                         bool trans_b) {
  try {
    const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
    const int64_t g = ad[0];
    const int64_t m = trans_a ? ad[2] : ad[1], k = trans_a ? ad[1] : ad[2];
    const int64_t n = trans_b ? bd[1] : bd[2];
    if (bd[0] != g || cd[0] != g || (trans_b ? bd[2] : bd[1]) != k || cd[1] != m ||
        cd[2] != n) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "batched matmul: shapes do not match");
    }
    if (g == 0 || m == 0 || n == 0) return ffi::Error::Success();
    const float* ap = reinterpret_cast<const float*>(a.untyped_data());
    const float* bp = reinterpret_cast<const float*>(b.untyped_data());
    float* cp = reinterpret_cast<float*>(c->untyped_data());
    const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    const int64_t lda = ad[2], ldb = bd[2], a_size = ad[1] * ad[2], b_size = bd[1] * bd[2];
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), g));
    run_pieces(pool, pieces, [&](int64_t p) {
      for (int64_t i = g * p / pieces; i < g * (p + 1) / pieces; ++i) {
        if (k == 0) {
          std::fill(cp + i * m * n, cp + (i + 1) * m * n, 0.0f);
        } else {
          sgemm(ta, tb, m, n, k, ap + i * a_size, lda, bp + i * b_size, ldb, cp + i * m * n, n);
        }
      }
    });
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("batched matmul: ") + err.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_dnnl_batched_matmul, BatchedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<B32>()
                                  .Arg<B32>()
                                  .Ret<B32>()
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_dnnl_matmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Ret<F32>()
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b"));
