// oneDNN convolutions as XLA FFI handlers for the CPU backend (see jdml/native/build.py).
//
// Three handlers, NHWC activations and HWIO kernels in float32, padding given per side (the
// SAME padding the Python side computes) and a number of groups (1: an ordinary convolution;
// the channel count: a depthwise one, whose HWIO kernel is (KH, KW, 1, C)):
//   jdml_dnnl_conv_fwd:          y  = conv(x, w)
//   jdml_dnnl_conv_bwd_data:     dx = d conv / d x  applied to dy
//   jdml_dnnl_conv_bwd_weights:  dw = d conv / d w  applied to dy
// Each call splits its batch into one piece per thread of XLA's intra-op pool and runs every
// piece single-threaded (oneDNN's own OpenMP threads would compete with XLA's for the cores).
// Each primitive is created once per shape and cached; its scratchpad is the caller's, so
// pieces and concurrent calls can run it at once.
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using jdml::OneThread;
using jdml::run_pieces;
using dnnl::memory;
using Tag = memory::format_tag;

namespace {

enum Kind { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

// (kind, N, H, W, C, O, KH, KW, stride, pad_top, pad_bottom, pad_left, pad_right, groups)
using Key = std::array<int64_t, 14>;

// One primitive for one batch size, with user-managed scratchpad so that pieces of a batch can
// run it concurrently on different threads.
struct Entry {
  dnnl::primitive conv;
  memory::desc src, weights, dst, user_weights;
  dnnl::reorder to_primitive, to_user;  // HWIO <-> the primitive's weights format, if different
  size_t scratchpad_bytes = 0;
  bool packed = false;
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;  // guards the cache only; execution runs outside it
  std::map<Key, std::unique_ptr<Entry>> cache;
};

Context& context() {
  static Context* ctx = new Context();  // never destroyed: handlers may run at exit
  return *ctx;
}

const Entry& entry(Context& ctx, const Key& key) {
  OneThread one_thread;
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto found = ctx.cache.find(key);
  if (found != ctx.cache.end()) return *found->second;
  const auto [kind, n, h, w, c, o, kh, kw, s, top, bottom, left, right, groups] = key;
  const int64_t oh = (h + top + bottom - kh) / s + 1, ow = (w + left + right - kw) / s + 1;
  auto e = std::make_unique<Entry>();
  const auto f32 = memory::data_type::f32;
  e->src = memory::desc({n, c, h, w}, f32, Tag::nhwc);
  e->dst = memory::desc({n, o, oh, ow}, f32, Tag::nhwc);
  // The weights as oneDNN sees them: (O, C, KH, KW), or per group (G, O/G, C/G, KH, KW); the
  // user's are HWIO, (KH, KW, C/G, O) in memory with output channel g * O/G + o.
  const int64_t og = o / groups, cg = c / groups;
  const memory::dims weight_dims = groups == 1 ? memory::dims{o, c, kh, kw}
                                               : memory::dims{groups, og, cg, kh, kw};
  e->user_weights = groups == 1 ? memory::desc(weight_dims, f32, Tag::hwio)
                                : memory::desc(weight_dims, f32,
                                               memory::dims{og, 1, o, kw * cg * o, cg * o});
  const auto any = memory::desc(weight_dims, f32, Tag::any);
  const memory::dims strides{s, s}, pad_l{top, left}, pad_r{bottom, right};
  const auto direct = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  dnnl::convolution_forward::primitive_desc fwd(ctx.engine, dnnl::prop_kind::forward_training,
                                                direct, e->src, any, e->dst, strides, pad_l,
                                                pad_r, attr);
#else
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, e->src, any,
                                      e->dst, strides, pad_l, pad_r),
      attr, ctx.engine);
#endif
  if (kind == kForward) {
    e->weights = fwd.weights_desc();
    e->scratchpad_bytes = fwd.scratchpad_desc().get_size();
    e->conv = dnnl::convolution_forward(fwd);
  } else if (kind == kBackwardData) {
#if DNNL_VERSION_MAJOR >= 3
    dnnl::convolution_backward_data::primitive_desc pd(ctx.engine, direct, e->src, any, e->dst,
                                                       strides, pad_l, pad_r, fwd, attr);
#else
    dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(direct, e->src, any, e->dst, strides, pad_l, pad_r),
        attr, ctx.engine, fwd);
#endif
    e->weights = pd.weights_desc();
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->conv = dnnl::convolution_backward_data(pd);
  } else {
#if DNNL_VERSION_MAJOR >= 3
    dnnl::convolution_backward_weights::primitive_desc pd(ctx.engine, direct, e->src, any, e->dst,
                                                          strides, pad_l, pad_r, fwd, attr);
#else
    dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(direct, e->src, any, e->dst, strides, pad_l,
                                                 pad_r),
        attr, ctx.engine, fwd);
#endif
    e->weights = pd.diff_weights_desc();
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->conv = dnnl::convolution_backward_weights(pd);
  }
  e->packed = e->weights != e->user_weights;
  if (e->packed) {
    e->to_primitive = dnnl::reorder(
        dnnl::reorder::primitive_desc(ctx.engine, e->user_weights, ctx.engine, e->weights));
    e->to_user = dnnl::reorder(
        dnnl::reorder::primitive_desc(ctx.engine, e->weights, ctx.engine, e->user_weights));
  }
  return *ctx.cache.emplace(key, std::move(e)).first->second;
}

struct Geometry {
  int64_t stride, top, bottom, left, right, groups;
};

// The convolution's shape from the NHWC input and HWIO kernel dimensions, for `batch` images.
Key make_key(Kind kind, int64_t batch, ffi::Span<const int64_t> x, ffi::Span<const int64_t> w,
             Geometry g) {
  return Key{kind, batch, x[1],     x[2],  x[3],     w[3],    w[0],
             w[1], g.stride, g.top, g.bottom, g.left, g.right, g.groups};
}

// Runs one batch piece single-threaded on the calling thread: `src` and `dst` point at the
// piece's first image, `weights` at the primitive's weights (or its own kernel gradient).
void run_piece(const Entry& e, Kind kind, float* src, float* weights, float* dst) {
  OneThread one_thread;
  Context& ctx = context();
  dnnl::stream stream(ctx.engine);
  std::vector<uint8_t> scratch(e.scratchpad_bytes);
  memory scratchpad(memory::desc({static_cast<int64_t>(scratch.size())}, memory::data_type::u8,
                                 Tag::x),
                    ctx.engine, scratch.data());
  memory src_m(e.src, ctx.engine, src), dst_m(e.dst, ctx.engine, dst);
  memory w_m(e.weights, ctx.engine, weights);
  if (kind == kForward) {
    e.conv.execute(stream, {{DNNL_ARG_SRC, src_m},
                            {DNNL_ARG_WEIGHTS, w_m},
                            {DNNL_ARG_DST, dst_m},
                            {DNNL_ARG_SCRATCHPAD, scratchpad}});
  } else if (kind == kBackwardData) {
    e.conv.execute(stream, {{DNNL_ARG_DIFF_SRC, src_m},
                            {DNNL_ARG_WEIGHTS, w_m},
                            {DNNL_ARG_DIFF_DST, dst_m},
                            {DNNL_ARG_SCRATCHPAD, scratchpad}});
  } else {
    e.conv.execute(stream, {{DNNL_ARG_SRC, src_m},
                            {DNNL_ARG_DIFF_WEIGHTS, w_m},
                            {DNNL_ARG_DIFF_DST, dst_m},
                            {DNNL_ARG_SCRATCHPAD, scratchpad}});
  }
  stream.wait();
}

// Splits the batch into pieces, one per thread of XLA's intra-op pool (sizes differing by at
// most one image), each run single-threaded: the caller runs the first and every piece no pool
// thread has started yet, so it never waits on work that is not running (no deadlock when
// every pool thread is itself inside such a call). Kernel gradients are summed in piece order,
// so a call's result depends only on its shapes and the pool's size.
ffi::Error run(ffi::ThreadPool pool, Kind kind, ffi::Span<const int64_t> x_dims,
               ffi::Span<const int64_t> w_dims, Geometry g, float* src, float* weights,
               float* dst) {
  try {
    Context& ctx = context();
    const int64_t batch = x_dims[0];
    // One piece per thread (2 or 4 per thread measured the same on the glyph step).
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), batch));
    std::vector<int64_t> starts(pieces + 1);
    for (int64_t i = 0; i <= pieces; ++i) starts[i] = batch * i / pieces;
    const int64_t src_image = x_dims[1] * x_dims[2] * x_dims[3];
    const int64_t oh = (x_dims[1] + g.top + g.bottom - w_dims[0]) / g.stride + 1;
    const int64_t ow = (x_dims[2] + g.left + g.right - w_dims[1]) / g.stride + 1;
    const int64_t dst_image = oh * ow * w_dims[3];

    std::vector<const Entry*> entries(pieces);
    for (int64_t i = 0; i < pieces; ++i) {
      entries[i] = &entry(ctx, make_key(kind, starts[i + 1] - starts[i], x_dims, w_dims, g));
    }
    // The pieces share one weights buffer (or sum their kernel gradients elementwise): if
    // oneDNN chose another weights format for an uneven piece, the batch runs as one piece.
    for (int64_t i = 1; i < pieces; ++i) {
      if (entries[i]->weights != entries[0]->weights) {
        entries.assign(1, &entry(ctx, make_key(kind, batch, x_dims, w_dims, g)));
        starts = {0, batch};
        break;
      }
    }
    const int64_t used = static_cast<int64_t>(entries.size());
    const Entry& first = *entries[0];
    dnnl::stream stream(ctx.engine);
    memory user_w(first.user_weights, ctx.engine, weights);
    // The weights every piece reads (forward, input gradient), or one kernel gradient per
    // piece in the primitive's format, summed in piece order afterwards.
    const size_t packed_floats = first.weights.get_size() / sizeof(float);
    std::vector<std::vector<float>> packed(kind == kBackwardWeights ? used : 1);
    for (auto& p : packed) p.assign(packed_floats, 0.0f);
    if (kind != kBackwardWeights) {
      if (first.packed) {
        memory packed_m(first.weights, ctx.engine, packed[0].data());
        first.to_primitive.execute(stream, user_w, packed_m);
        stream.wait();
      }
    }
    auto piece_weights = [&](int64_t i) -> float* {
      if (kind == kBackwardWeights) return packed[i].data();
      return first.packed ? packed[0].data() : weights;
    };
    auto work = [&, src, dst](int64_t i) {
      run_piece(*entries[i], kind, src + starts[i] * src_image, piece_weights(i),
                dst + starts[i] * dst_image);
    };

    run_pieces(pool, used, work);

    if (kind == kBackwardWeights) {
      float* total = packed[0].data();
      for (int64_t i = 1; i < used; ++i) {
        const float* part = packed[i].data();
        for (size_t j = 0; j < packed_floats; ++j) total[j] += part[j];
      }
      if (first.packed) {
        memory packed_m(first.weights, ctx.engine, total);
        first.to_user.execute(stream, packed_m, user_w);
        stream.wait();
      } else {
        std::copy(total, total + packed_floats, weights);
      }
    }
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("oneDNN convolution: ") + err.what());
  }
  return ffi::Error::Success();
}

using F32 = ffi::Buffer<ffi::F32, 4>;
using OutF32 = ffi::ResultBuffer<ffi::F32, 4>;

float* data(F32 b) { return reinterpret_cast<float*>(b.untyped_data()); }
float* data(OutF32 b) { return reinterpret_cast<float*>(b->untyped_data()); }

ffi::Error Forward(ffi::ThreadPool pool, F32 x, F32 w, OutF32 y, int64_t stride, int64_t top,
                   int64_t bottom, int64_t left, int64_t right, int64_t groups) {
  return run(pool, kForward, x.dimensions(), w.dimensions(),
             {stride, top, bottom, left, right, groups}, data(x), data(w), data(y));
}

ffi::Error BackwardData(ffi::ThreadPool pool, F32 dy, F32 w, OutF32 dx, int64_t stride,
                        int64_t top, int64_t bottom, int64_t left, int64_t right,
                        int64_t groups) {
  return run(pool, kBackwardData, dx->dimensions(), w.dimensions(),
             {stride, top, bottom, left, right, groups}, data(dx), data(w), data(dy));
}

ffi::Error BackwardWeights(ffi::ThreadPool pool, F32 x, F32 dy, OutF32 dw, int64_t stride,
                           int64_t top, int64_t bottom, int64_t left, int64_t right,
                           int64_t groups) {
  return run(pool, kBackwardWeights, x.dimensions(), dw->dimensions(),
             {stride, top, bottom, left, right, groups}, data(x), data(dw), data(dy));
}

}  // namespace

#define JDML_CONV_HANDLER(symbol, impl, In0, In1)                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, impl,                                           \
                                ffi::Ffi::Bind()                                        \
                                    .Ctx<ffi::ThreadPool>()                             \
                                    .Arg<In0>()                                         \
                                    .Arg<In1>()                                         \
                                    .Ret<F32>()                                         \
                                    .Attr<int64_t>("stride")                            \
                                    .Attr<int64_t>("pad_top")                           \
                                    .Attr<int64_t>("pad_bottom")                        \
                                    .Attr<int64_t>("pad_left")                          \
                                    .Attr<int64_t>("pad_right")                         \
                                    .Attr<int64_t>("groups"));

JDML_CONV_HANDLER(jdml_dnnl_conv_fwd, Forward, F32, F32)
JDML_CONV_HANDLER(jdml_dnnl_conv_bwd_data, BackwardData, F32, F32)
JDML_CONV_HANDLER(jdml_dnnl_conv_bwd_weights, BackwardWeights, F32, F32)
