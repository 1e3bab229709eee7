// The kernel gradient of a depthwise convolution as an XLA FFI handler for the CPU backend (see
// jdml/native/build.py and jdml/nn/depthwise.py).
//
//   jdml_depthwise_bwd_weights:  dw[i, j, 0, c] = sum_{b, y, x} xp[b, s*y + i, s*x + j, c] * dy[b, y, x, c]
//
// x is NHWC, dy NHWC, dw (KH, KW, 1, C), all float32; xp is x padded by (top, bottom, left,
// right) with zeros (the taps that read padding are skipped). oneDNN 2.6 computes this with its
// generic grouped-convolution kernel for 5x5 kernels and small maps, 10-100 times slower than
// the forward pass of the same layer; here it is one pass over x and dy with the channels
// innermost. The batch is split into one piece per thread of XLA's intra-op pool; each piece
// sums its images in order into its own buffer and the buffers are added in piece order, so a
// call's result depends only on its shapes and the pool's size.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jdml::run_pieces;

namespace {

struct Shape {
  int64_t h, w, c, oh, ow, kh, kw, stride, top, left;
};

// acc[(i * kw + j) * c + ch] += the products of images [first, last).
void accumulate(const Shape& s, const float* x, const float* dy, int64_t first, int64_t last,
                float* __restrict acc) {
  const int64_t c = s.c;
  for (int64_t b = first; b < last; ++b) {
    const float* xb = x + b * s.h * s.w * c;
    const float* gb = dy + b * s.oh * s.ow * c;
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const float* __restrict g = gb + (oy * s.ow + ox) * c;
        for (int64_t i = 0; i < s.kh; ++i) {
          const int64_t iy = s.stride * oy + i - s.top;
          if (iy < 0 || iy >= s.h) continue;
          for (int64_t j = 0; j < s.kw; ++j) {
            const int64_t ix = s.stride * ox + j - s.left;
            if (ix < 0 || ix >= s.w) continue;
            const float* __restrict xv = xb + (iy * s.w + ix) * c;
            float* __restrict a = acc + (i * s.kw + j) * c;
            for (int64_t ch = 0; ch < c; ++ch) a[ch] += xv[ch] * g[ch];
          }
        }
      }
    }
  }
}

using F32 = ffi::Buffer<ffi::F32, 4>;
using OutF32 = ffi::ResultBuffer<ffi::F32, 4>;

ffi::Error BackwardWeights(ffi::ThreadPool pool, F32 x, F32 dy, OutF32 dw, int64_t stride,
                           int64_t top, int64_t left) {
  try {
    const auto xd = x.dimensions(), gd = dy.dimensions(), wd = dw->dimensions();
    if (wd[2] != 1 || wd[3] != xd[3] || gd[3] != xd[3] || gd[0] != xd[0]) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "depthwise kernel gradient: shapes do not match");
    }
    const Shape s{xd[1], xd[2], xd[3], gd[1], gd[2], wd[0], wd[1], stride, top, left};
    const int64_t batch = xd[0], size = s.kh * s.kw * s.c;
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), batch));
    std::vector<std::vector<float>> parts(pieces, std::vector<float>(size, 0.0f));
    const float* xp = reinterpret_cast<const float*>(x.untyped_data());
    const float* gp = reinterpret_cast<const float*>(dy.untyped_data());
    run_pieces(pool, pieces, [&](int64_t p) {
      accumulate(s, xp, gp, batch * p / pieces, batch * (p + 1) / pieces, parts[p].data());
    });
    float* out = reinterpret_cast<float*>(dw->untyped_data());
    std::copy(parts[0].begin(), parts[0].end(), out);
    for (int64_t p = 1; p < pieces; ++p) {
      const float* part = parts[p].data();
      for (int64_t k = 0; k < size; ++k) out[k] += part[k];
    }
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("depthwise kernel gradient: ") + err.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jdml_depthwise_bwd_weights, BackwardWeights,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Ret<F32>()
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("pad_top")
                                  .Attr<int64_t>("pad_left"));
