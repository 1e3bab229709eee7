"""The native boundary: every call from Python into the compiled CPU kernels.

XLA's CPU backend is slow in a few places that matter to this library: convolutions (forward
and both gradients), the assignment pass of k-means and the selection of the k nearest
neighbours. C++ kernels in this folder replace them on the CPU backend, called from jitted code
as XLA FFI custom calls, and on host (NumPy) arrays through ``ctypes``, as faiss is called.
Other backends never use them, and every one has a pure-XLA counterpart that the rest of the
library keeps complete and tested.

The modules, and the only places in ``jdml`` that name ``jax.ffi`` or ``ctypes``:

* :mod:`jdml.native.build`: compiles the sources on first use into a cached shared library,
  loads it and registers its FFI targets;
* :mod:`jdml.native.switches`: ``$JDML_CONV``, ``$JDML_KMEANS``, ``$JDML_KNN``
  (``auto|xla|onednn``, the defaults of a config's ``backends`` section, read once by
  :func:`jdml.backends.resolve_backends`), whether the native kernels of a switch run, and the
  one warning of a fallback;
* :mod:`jdml.native.conv`: the oneDNN convolutions and matrix products (``jdml.nn``);
* :mod:`jdml.native.knn`: the nearest-neighbour search (``jdml.evaluation.knn``);
* :mod:`jdml.native.kmeans`: k-means' passes over the points (``jdml.evaluation.kmeans``).

The wrappers take and return JAX arrays (the FFI calls, traceable inside ``jit``) or NumPy
arrays (the ``*_host`` functions); callers decide with :func:`jdml.native.switches.onednn_enabled`
whether to use them.
"""
