// The attention kernel's core (decoding/kernels/row_ops_core.h) as one build compiled it, without
// torch: against the plain C++ implementation in the same binary, bit for bit, at every head size,
// key counts inside and at the ends of 16-key blocks and rows at several positions; and on the inputs
// of tests/engine/test_row_invariance.py's cross-ISA test, against the digests every build must give.
// `make test-toolchains` builds it with each compiler for each x86 path this CPU runs (and the plain
// C++ one), `make test-arm` for aarch64 under qemu. A build that summed in another order (a compiler
// that fused a multiply-add of its own accord, a shuffle that took the wrong lanes) fails.
#include "row_ops_core.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "xorshift.h"

namespace {

using draftwise_test::uniform;

// n integers in -2000..2000 over a power of two: exact floats on every machine
std::vector<float> exact(size_t n, float scale) {
  std::vector<float> out(n);
  for (auto& x : out) x = static_cast<float>(uniform(-2000, 2000)) / scale;
  return out;
}

uint64_t fnv1a(const std::vector<float>& t) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
  return h;
}

constexpr int HEADS = 14, KV_HEADS = 2;

// every (row, head) of rows start..start+rows-1, as row_ops.cpp's op computes them: blocks of rows with
// their kv head's query heads where this build shares the cache's reading among them, else (or with
// one_at_a_time) one (row, head) at a time
std::vector<float> attention(int d, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                             int cache_len, int start, int rows, bool one_at_a_time = false) {
  std::vector<float> out(static_cast<size_t>(rows) * HEADS * d);
  const int64_t blocked = one_at_a_time ? 0 : draftwise_rows::blocked_tasks(rows, HEADS, KV_HEADS);
  const bool taken = blocked > 0
      ? draftwise_rows::attend_blocked(d, q.data(), k.data(), v.data(), out.data(), rows, HEADS, KV_HEADS, cache_len,
                                       start, 0, blocked)
      : draftwise_rows::attend(d, q.data(), k.data(), v.data(), out.data(), HEADS, KV_HEADS, cache_len, start, 0,
                               static_cast<int64_t>(rows) * HEADS);
  if (!taken) std::printf("FAIL head size %d not taken\n", d);
  return out;
}

template <int D>
std::vector<float> portable(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                            int cache_len, int start, int rows) {
  constexpr int d = D * draftwise_rows::L;
  std::vector<float> out(static_cast<size_t>(rows) * HEADS * d), buf;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < HEADS; ++h) {
      const size_t offset = static_cast<size_t>(h / (HEADS / KV_HEADS)) * cache_len * d;
      draftwise_rows::attend_one_portable<D>(q.data() + (r * HEADS + h) * d, k.data() + offset, v.data() + offset,
                                             start + r + 1, out.data() + (r * HEADS + h) * d, buf);
    }
  return out;
}

int failures = 0, checks = 0;

template <int D>
void against_portable(int cache_len, int start, int rows) {
  constexpr int d = D * draftwise_rows::L;
  const auto k = exact(static_cast<size_t>(KV_HEADS) * cache_len * d, 1024);
  const auto v = exact(k.size(), 2048);
  const auto q = exact(static_cast<size_t>(rows) * HEADS * d, 4096);
  const auto want = portable<D>(q, k, v, cache_len, start, rows);
  for (const bool one_at_a_time : {false, true}) {
    const auto got = attention(d, q, k, v, cache_len, start, rows, one_at_a_time);
    ++checks;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
        ++failures;
        std::printf("FAIL head size %d, keys up to %d, row %zu (%s): %.9g, the plain C++ build %.9g\n", d, start + rows,
                    i / (HEADS * d), one_at_a_time ? "a query at a time" : "in blocks", got[i], want[i]);
        break;
      }
  }
}

template <int D>
void every_position() {
  for (int start = 0; start < 40; start += 3) against_portable<D>(64, start, 17);  // blocks' ends and middles
  against_portable<D>(1100, 1000, 19);
}

}  // namespace

int main() {
  // test_row_invariance.py's inputs first (its generator's state runs on from them)
  const struct { int d, length, start, rows; } digest_cases[] = {{64, 1100, 1000, 19}, {128, 200, 30, 17}};
  const uint64_t digests[] = {0x840E04803049682Bull, 0x96ADD5EF059F5BD7ull};
  for (int c = 0; c < 2; ++c) {
    const auto& t = digest_cases[c];
    const auto k = exact(static_cast<size_t>(KV_HEADS) * t.length * t.d, 1024);
    const auto v = exact(k.size(), 2048);
    const auto q = exact(static_cast<size_t>(t.rows) * HEADS * t.d, 4096);
    const uint64_t got = fnv1a(attention(t.d, q, k, v, t.length, t.start, t.rows));
    ++checks;
    if (got != digests[c]) {
      ++failures;
      std::printf("FAIL digest of head size %d: %016llx, every build gives %016llx\n", t.d,
                  static_cast<unsigned long long>(got), static_cast<unsigned long long>(digests[c]));
    }
  }
  every_position<1>();
  every_position<2>();
  every_position<4>();
  every_position<5>();
  every_position<6>();
  every_position<8>();
  every_position<16>();
  std::printf("row_ops_core.h (%s build): %d of %d checks failed\n", draftwise_rows::implementation(), failures, checks);
  return failures == 0 ? 0 : 1;
}
