// How the kernels split their work among torch's threads, whatever compiler built them.
//
// ATen's at::parallel_for is written in its headers with `#pragma omp parallel` (torch's CPU builds
// use OpenMP), so a kernel gets threads only where its compiler does OpenMP, with the same runtime
// as torch. GCC with -fopenmp does (libgomp, torch's own on Linux). Clang does not: without libomp
// it has no <omp.h>, and with it (LLVM's runtime beside torch's libgomp) it ignored
// torch.set_num_threads and kept two thread pools spinning; Apple's clang has no OpenMP at all.
// There, draftwise::parallel_for starts the team through the OpenMP runtime torch itself loaded,
// by its C entry points (GOMP_parallel: what GCC emits for `#pragma omp parallel`; LLVM's runtime
// provides it too), with torch's thread count. Where none is found the loop runs on one thread.
//
// Either way a task's arithmetic is the same: the kernels give each task its own rows or outputs,
// so the thread count changes how fast a result comes, never its bits.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#if !defined(_OPENMP) && AT_PARALLEL_OPENMP
#include <dlfcn.h>
#define DRAFTWISE_TORCH_OPENMP 1
#endif

namespace draftwise {

#if !defined(DRAFTWISE_TORCH_OPENMP)
// GCC with -fopenmp (or a torch on its own thread pool, whose parallel_for is compiled in torch)
template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}

inline const char* threading() { return "openmp"; }
#else
struct OpenMP {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
  int (*team_size)() = nullptr;
  int (*thread)() = nullptr;
};

// The runtime torch's own library was linked with: looked up from libtorch_cpu's handle, which
// searches its dependencies, so it is torch's copy even where another runtime is loaded too.
inline const OpenMP& torch_openmp() {
  static const OpenMP found = [] {
    OpenMP rt;
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) == 0 || info.dli_fname == nullptr) return rt;
    void* torch = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);  // already loaded: only a handle
    if (torch == nullptr) return rt;
    rt.parallel = reinterpret_cast<decltype(rt.parallel)>(dlsym(torch, "GOMP_parallel"));
    rt.team_size = reinterpret_cast<decltype(rt.team_size)>(dlsym(torch, "omp_get_num_threads"));
    rt.thread = reinterpret_cast<decltype(rt.thread)>(dlsym(torch, "omp_get_thread_num"));
    if (rt.parallel == nullptr || rt.team_size == nullptr || rt.thread == nullptr) rt = OpenMP{};
    return rt;  // the handle stays open: torch's library outlives this one anyway
  }();
  return found;
}

template <class F>
struct Share {
  int64_t begin, end, grain;
  const F* f;
  const OpenMP* rt;
  std::atomic<bool> failed{false};
  std::exception_ptr error;
};

// One thread's part, split as ATen's invoke_parallel splits it: contiguous chunks, at most one a thread.
template <class F>
void run_share(void* data) {
  auto& s = *static_cast<Share<F>*>(data);
  int64_t threads = s.rt->team_size();
  if (s.grain > 0) threads = std::min<int64_t>(threads, (s.end - s.begin + s.grain - 1) / s.grain);
  const int64_t chunk = (s.end - s.begin + threads - 1) / threads;
  const int64_t first = s.begin + s.rt->thread() * chunk;
  if (first >= s.end) return;
  try {
    (*s.f)(first, std::min(s.end, first + chunk));
  } catch (...) {
    if (!s.failed.exchange(true)) s.error = std::current_exception();
  }
}

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const OpenMP& rt = torch_openmp();
  // at::get_num_threads first: it applies torch's thread count to this thread's OpenMP settings
  const bool parallel = rt.parallel != nullptr && at::get_num_threads() > 1 && end - begin > grain &&
                        end - begin > 1 && !at::in_parallel_region();
  if (!parallel) {
    f(begin, end);
    return;
  }
  Share<F> share{begin, end, grain, &f, &rt};
  rt.parallel(&run_share<F>, &share, 0, 0);  // 0 threads: the team torch's thread count sets
  if (share.error) std::rethrow_exception(share.error);
}

inline const char* threading() { return torch_openmp().parallel != nullptr ? "torch's openmp runtime" : "one thread"; }
#endif

}  // namespace draftwise
