// A small SIMT machine on the CPU, so that the CUDA kernels of cuda/window.cu run
// unchanged (same source, same launch code, same FFI handlers) on a machine without
// a GPU. tests/cuda/emulate_window.cc includes this header and then window.cu with
// ZIPCCL_SIMT_HOST defined, and compares every byte with the CPU codec.
//
// Model. Every CUDA thread is a fiber (ucontext) with its own stack; all fibers run
// on one OS thread, switched only at synchronisation points, in an order drawn
// from a seeded RNG. A launch runs at most `resident` CTAs at a time (CUDA's
// occupancy; a CTA starts when one finishes, in blockIdx order), so kernels whose
// CTAs wait on each other (the encoder's look-back) are exercised with real
// concurrency between CTAs. The emulation is deliberately adversarial and strict:
//   - __syncthreads: every live thread of the CTA must arrive at the same call
//     site (a barrier after a thread exited, or two sites meeting, is an error);
//   - warp intrinsics (__shfl_*, __reduce_*, __ballot, __any): the mask must be the
//     full warp, all 32 lanes must take part from the same call site;
//   - cp.async: the destination is overwritten with garbage when the copy is
//     issued and receives the data only at the cp.async.wait_group that retires
//     its group (the earliest and the latest moments PTX allows): reading a slot
//     before its wait, or refilling one that another thread still reads, shows;
//   - shared memory starts as garbage in every CTA;
//   - relaxed loads/stores, atomics and __nanosleep are points where another
//     fiber may run (randomly), so inter-CTA protocols meet many interleavings;
//   - no progress (every fiber blocked, or 20 M switches without a barrier
//     completing) is reported as a deadlock.
// Any violation prints what and where, and exits with status 3.
//
// What it cannot show: the hardware memory model (it is sequentially consistent
// here), timing, and the inline PTX itself (ptxas checks that it assembles; the
// host build uses plain C++ equivalents selected by ZIPCCL_SIMT_HOST).
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <setjmp.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <random>
#include <vector>

// ---- CUDA keywords and vector types ------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }

namespace simt {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

[[noreturn]] inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "SIMT emulation error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stdout);
  fflush(stderr);
  _exit(3);
}

struct Config {
  unsigned resident = 3;     // CTAs running at once (what the occupancy query returns)
  uint64_t seed = 1;         // scheduling order
  unsigned yield_one_in = 4; // a relaxed access / atomic yields with probability 1/this
};

// Schedules. kRandom: the next fiber is drawn uniformly from the runnable ones.
// kPriority: every warp has a random priority, redrawn whenever its CTA passes a
// barrier, and the runnable fiber of highest priority runs (1 time in 16 a
// uniform draw instead): whole warps race ahead of the rest of their CTA, and
// CTAs of each other, which is what exposes a missing barrier or an early refill.
// A fiber that sleeps (__nanosleep: a spin-wait) drops below every priority until
// the next barrier, so a waiter cannot starve the CTA it waits for. Each launch
// picks one of the two from its seed.
enum class Schedule { kRandom, kPriority };
inline Config& config() {
  static Config c;
  return c;
}

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kSmemBytes = 64 * 1024;  // per CTA; more than any kernel declares
constexpr size_t kStackBytes = 128 * 1024;
constexpr uint8_t kPoison = 0xCD;

struct Fiber;

struct WaitList {
  std::vector<Fiber*> v;
};

struct Warp {
  uint64_t slot[2][32];  // double-buffered by generation parity (see exchange())
  unsigned arrived = 0, gen = 0, exited = 0;
  int line = 0;
  WaitList waiters;
};

struct Cta {
  Dim3 bid;
  unsigned nthreads = 0, live = 0, exited = 0;
  unsigned bar_arrived = 0;
  int bar_line = 0;
  WaitList bar_waiters;
  Warp warps[kMaxThreads / 32];
  Fiber* fibers = nullptr;  // nthreads of them
  uint8_t* smem = nullptr;
  std::vector<size_t> smem_offsets;  // offset of the k-th shared object declared
  size_t smem_used = 0;
};

struct CpCopy {
  void* dst;
  uint8_t data[16];
  int size;
};

struct Fiber {
  ucontext_t ctx;  // first entry only
  jmp_buf jb;      // where it was switched out
  bool started = false;
  uint8_t* stack = nullptr;  // kStackBytes, a guard page below
  Cta* cta = nullptr;
  unsigned tid = 0;
  bool done = false;
  int ridx = -1;  // index in the runnable list, -1 while blocked
  uint64_t prio = 0;
  unsigned smem_calls = 0;
  std::vector<CpCopy> cp_open;               // issued, not yet committed
  std::deque<std::vector<CpCopy>> cp_groups;  // committed, oldest first
};

struct Machine {
  std::mt19937_64 rng{1};
  std::vector<Fiber*> runnable;
  Fiber* cur = nullptr;
  ucontext_t main_ctx;
  jmp_buf main_jb;
  std::function<void()> body;  // the kernel call of the current launch
  Dim3 grid, block;
  Schedule schedule = Schedule::kRandom;
  uint64_t switches_since_progress = 0;
  std::vector<uint8_t*> free_stacks;
  std::vector<uint8_t*> free_smem;
  int last_error = 0;
};
inline Machine& m() {
  static Machine mm;
  return mm;
}

inline Fiber* cur() {
  if (!m().cur) fail("a device function was called outside a kernel launch");
  return m().cur;
}

// ---- scheduling -----------------------------------------------------------------------------

inline void make_runnable(Fiber* f) {
  f->ridx = (int)m().runnable.size();
  m().runnable.push_back(f);
}

inline void remove_runnable(Fiber* f) {
  auto& r = m().runnable;
  const int i = f->ridx;
  r[i] = r.back();
  r[i]->ridx = i;
  r.pop_back();
  f->ridx = -1;
}

// Context switches: a fiber is entered the first time with swapcontext (which
// sets up its stack) and afterwards with _setjmp/_longjmp, which, unlike
// swapcontext, make no sigprocmask system call -- two thirds of the emulator's
// time otherwise. Jumping between stacks this way is the classic coroutine
// technique; it needs the non-fortified _longjmp (emulate_window.cc is built with
// -U_FORTIFY_SOURCE, see tests/test_cuda_build.py).
inline void to_scheduler() {
  if (_setjmp(cur()->jb) == 0) _longjmp(m().main_jb, 1);
}

// Lets another fiber run (the current one stays runnable).
inline void yield() { to_scheduler(); }

inline void maybe_yield() {
  if (m().rng() % config().yield_one_in == 0) yield();
}

// Parks the current fiber on `w` until wake_all(w).
inline void block_on(WaitList& w) {
  Fiber* f = cur();
  remove_runnable(f);
  w.v.push_back(f);
  to_scheduler();
}

inline void wake_all(WaitList& w) {
  for (Fiber* f : w.v) make_runnable(f);
  w.v.clear();
  m().switches_since_progress = 0;
}

// kPriority: new random priorities for the warps of CTA c (lanes get a small
// jitter, so lanes of a warp do not always run in the same order).
inline void draw_priorities(struct Cta& c) {
  uint64_t wp[kMaxThreads / 32];
  for (unsigned w = 0; w < (c.nthreads + 31) / 32; ++w) wp[w] = (m().rng() >> 24) | (1ull << 40);
  for (unsigned t = 0; t < c.nthreads; ++t) c.fibers[t].prio = (wp[t / 32] << 8) | (m().rng() & 0xFF);
}

inline void sleep_now() {
  cur()->prio = m().rng() & 0xFFFF;  // below every drawn priority
  yield();
}

// ---- thread indices -----------------------------------------------------------------------
inline Dim3 thread_idx() { return Dim3{cur()->tid, 0, 0}; }
inline Dim3 block_idx() { return cur()->cta->bid; }

// ---- barriers and warp intrinsics -----------------------------------------------------------

inline void syncthreads(int line) {
  Fiber* f = cur();
  Cta& c = *f->cta;
  if (c.exited) fail("__syncthreads (line %d) after %u thread(s) of CTA %u exited", line, c.exited, c.bid.x);
  if (c.bar_arrived == 0) {
    c.bar_line = line;
  } else if (c.bar_line != line) {
    fail("__syncthreads of CTA %u reached at lines %d and %d by different threads", c.bid.x, c.bar_line, line);
  }
  if (++c.bar_arrived == c.nthreads) {
    c.bar_arrived = 0;
    if (m().schedule == Schedule::kPriority) draw_priorities(c);
    wake_all(c.bar_waiters);
    yield();
  } else {
    block_on(c.bar_waiters);
  }
}

// Deposits this lane's value and returns the 32 values of the warp once every lane
// has deposited. Slot parity alternates by generation: a lane writes slot[g & 1]
// for op g only after all lanes arrived at op g - 1, i.e. after every lane read the
// results of op g - 2 (which used the same parity) -- reads happen right after the
// return, before the fiber can be switched out.
inline const uint64_t* exchange(int line, unsigned mask, uint64_t v, const char* what) {
  Fiber* f = cur();
  Cta& c = *f->cta;
  if (mask != 0xFFFFFFFFu) fail("%s (line %d) with mask %08x: only full-warp masks are emulated", what, line, mask);
  if (c.nthreads % 32) fail("%s (line %d) in a CTA of %u threads", what, line, c.nthreads);
  Warp& w = c.warps[f->tid / 32];
  if (w.exited) fail("%s (line %d) after lanes of warp %u (CTA %u) exited", what, line, f->tid / 32, c.bid.x);
  const unsigned b = w.gen & 1;
  if (w.arrived == 0) {
    w.line = line;
  } else if (w.line != line) {
    fail("%s: lanes of warp %u (CTA %u) met at lines %d and %d (divergent warp)", what, f->tid / 32, c.bid.x,
         w.line, line);
  }
  w.slot[b][f->tid % 32] = v;
  if (++w.arrived == 32) {
    w.arrived = 0;
    ++w.gen;
    wake_all(w.waiters);
  } else {
    block_on(w.waiters);
  }
  return w.slot[b];
}

inline unsigned lane_id() { return cur()->tid % 32; }

template <typename V>
V shfl_xor(int line, unsigned mask, V v, int o) {
  const uint64_t* s = exchange(line, mask, (uint64_t)v, "__shfl_xor_sync");
  return (V)s[(lane_id() ^ (unsigned)o) & 31];
}

template <typename V>
V shfl_up(int line, unsigned mask, V v, unsigned d) {
  const uint64_t* s = exchange(line, mask, (uint64_t)v, "__shfl_up_sync");
  const unsigned l = lane_id();
  return l >= d ? (V)s[l - d] : v;
}

inline unsigned reduce_add(int line, unsigned mask, unsigned v) {
  const uint64_t* s = exchange(line, mask, v, "__reduce_add_sync");
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r += (unsigned)s[i];
  return r;
}

inline unsigned reduce_or(int line, unsigned mask, unsigned v) {
  const uint64_t* s = exchange(line, mask, v, "__reduce_or_sync");
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)s[i];
  return r;
}

inline unsigned reduce_max(int line, unsigned mask, unsigned v) {
  const uint64_t* s = exchange(line, mask, v, "__reduce_max_sync");
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r = (unsigned)s[i] > r ? (unsigned)s[i] : r;
  return r;
}

inline unsigned ballot(int line, unsigned mask, int pred) {
  const uint64_t* s = exchange(line, mask, pred ? 1 : 0, "__ballot_sync");
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)(s[i] & 1) << i;
  return r;
}

inline int any(int line, unsigned mask, int pred) { return ballot(line, mask, pred) != 0; }

// ---- shared memory ------------------------------------------------------------------------

// The k-th shared object a thread declares: the same storage for every thread of
// the CTA (allocated by the first thread that gets there), garbage to start with.
template <typename S>
S& shared_object() {
  Fiber* f = cur();
  Cta& c = *f->cta;
  const unsigned k = f->smem_calls++;
  if (k == c.smem_offsets.size()) {
    const size_t off = (c.smem_used + 15) & ~(size_t)15;
    if (off + sizeof(S) > kSmemBytes) fail("shared memory of CTA %u exceeds %zu bytes", c.bid.x, kSmemBytes);
    c.smem_offsets.push_back(off);
    c.smem_used = off + sizeof(S);
  } else if (k > c.smem_offsets.size()) {
    fail("shared objects declared in different orders by the threads of CTA %u", c.bid.x);
  }
  return *reinterpret_cast<S*>(c.smem + c.smem_offsets[k]);
}

inline bool in_shared(const void* p, size_t n) {
  const Cta& c = *cur()->cta;
  const uint8_t* q = static_cast<const uint8_t*>(p);
  return q >= c.smem && q + n <= c.smem + c.smem_used;
}

// ---- cp.async ------------------------------------------------------------------------------

inline void cp_async(void* dst, const void* src, int size) {
  if (!in_shared(dst, (size_t)size)) fail("cp.async destination %p is not in this CTA's shared memory", dst);
  if (((uintptr_t)dst | (uintptr_t)src) % (uintptr_t)size)
    fail("cp.async of %d bytes with a misaligned address (dst %p, src %p)", size, dst, src);
  CpCopy c;
  c.dst = dst;
  c.size = size;
  memcpy(c.data, src, (size_t)size);  // the source is read here (it is not written during a kernel)
  memset(dst, kPoison ^ 0x5A, (size_t)size);
  cur()->cp_open.push_back(c);
}

inline void cp_commit() {
  Fiber* f = cur();
  f->cp_groups.push_back(std::move(f->cp_open));
  f->cp_open.clear();
}

inline void cp_wait(int pending) {
  Fiber* f = cur();
  while ((int)f->cp_groups.size() > pending) {
    for (const CpCopy& c : f->cp_groups.front()) memcpy(c.dst, c.data, (size_t)c.size);
    f->cp_groups.pop_front();
  }
}

// ---- global-memory atomics and relaxed accesses (sequentially consistent here) -------------

template <typename V>
V atomic_add(V* p, V v) {
  maybe_yield();
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename V>
V atomic_or(V* p, V v) {
  maybe_yield();
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
inline uint64_t ld_relaxed(const uint64_t* p) {
  maybe_yield();
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
inline void st_relaxed(uint64_t* p, uint64_t v) {
  maybe_yield();
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

// ---- launches -----------------------------------------------------------------------------

inline uint8_t* map_with_guard(size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t* p = (uint8_t*)mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("mmap of %zu bytes failed", bytes + page);
  mprotect(p, page, PROT_NONE);  // below the stack / before the arena
  return p + page;
}

inline void fiber_main() {
  Fiber* f = m().cur;
  m().body();
  f->done = true;
  _longjmp(m().main_jb, 1);
}

inline void start_cta(Cta* c, unsigned bid, std::vector<Fiber>& pool, size_t first) {
  Machine& M = m();
  c->bid = Dim3{bid, 0, 0};
  c->nthreads = c->live = M.block.x;
  c->exited = 0;
  c->bar_arrived = 0;
  for (Warp& w : c->warps) w.arrived = w.exited = 0;
  if (M.free_smem.empty()) M.free_smem.push_back(map_with_guard(kSmemBytes));
  c->smem = M.free_smem.back();
  M.free_smem.pop_back();
  memset(c->smem, kPoison, kSmemBytes);
  c->smem_offsets.clear();
  c->smem_used = 0;
  c->fibers = &pool[first];
  for (unsigned t = 0; t < M.block.x; ++t) {
    Fiber& f = pool[first + t];
    f.cta = c;
    f.tid = t;
    f.done = false;
    f.started = false;
    f.smem_calls = 0;
    f.cp_open.clear();
    f.cp_groups.clear();
    if (!f.stack) {
      if (M.free_stacks.empty()) M.free_stacks.push_back(map_with_guard(kStackBytes));
      f.stack = M.free_stacks.back();
      M.free_stacks.pop_back();
    }
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
    make_runnable(&f);
  }
  draw_priorities(*c);
}

// Runs kernel(grid, block) to completion; `body` is the kernel call with its
// arguments. Returns 0, or a cudaError_t-like code for a bad configuration.
inline int launch(unsigned grid, unsigned block, std::function<void()> body) {
  Machine& M = m();
  if (grid == 0 || block == 0 || block > kMaxThreads) return 9;  // cudaErrorInvalidConfiguration
  if (M.cur) fail("a kernel launched from inside a kernel");
  M.rng.seed(config().seed ^ (0x9E3779B97F4A7C15ull * (grid + 31 * block)));
  M.schedule = (M.rng() & 1) ? Schedule::kPriority : Schedule::kRandom;
  M.body = std::move(body);
  M.grid = Dim3{grid, 1, 1};
  M.block = Dim3{block, 1, 1};
  const unsigned slots = std::min(grid, std::max(1u, config().resident));
  std::vector<Cta> ctas(slots);
  std::vector<Fiber> pool((size_t)slots * block);
  unsigned next = 0;
  for (unsigned s = 0; s < slots; ++s) start_cta(&ctas[s], next++, pool, (size_t)s * block);
  M.switches_since_progress = 0;
  while (!M.runnable.empty()) {
    {
      Fiber* pick = M.runnable[M.rng() % M.runnable.size()];
      if (M.schedule == Schedule::kPriority && M.rng() % 16 != 0)
        for (Fiber* g : M.runnable) pick = g->prio > pick->prio ? g : pick;
      M.cur = pick;
    }
    // Only globals are read after _setjmp returns the second time (locals set
    // before it may not survive the _longjmp back): the fiber that ran is M.cur.
    if (_setjmp(M.main_jb) == 0) {
      if (M.cur->started) _longjmp(M.cur->jb, 1);
      M.cur->started = true;
      swapcontext(&M.main_ctx, &M.cur->ctx);
    }
    Fiber* const f = M.cur;
    M.cur = nullptr;
    if (++M.switches_since_progress > 20000000ull)
      fail("no barrier completed in 20M fiber switches: a livelock (e.g. a look-back that never ends)");
    if (!f->done) continue;
    remove_runnable(f);
    Cta* c = f->cta;
    --c->live;
    ++c->exited;
    M.switches_since_progress = 0;
    if (c->bar_arrived) fail("thread %u of CTA %u exited while others wait at __syncthreads (line %d)", f->tid,
                             c->bid.x, c->bar_line);
    ++c->warps[f->tid / 32].exited;
    if (const Warp& w = c->warps[f->tid / 32]; w.arrived)
      fail("thread %u of CTA %u exited while its warp waits at line %d", f->tid, c->bid.x, w.line);
    if (c->live == 0) {
      M.free_smem.push_back(c->smem);
      if (next < grid) start_cta(c, next++, pool, (size_t)(c - ctas.data()) * block);
    }
  }
  for (const Cta& c : ctas)
    if (c.live) fail("deadlock: every thread left in CTA %u is blocked (barrier at line %d)", c.bid.x, c.bar_line);
  for (Fiber& f : pool) M.free_stacks.push_back(f.stack);
  return 0;
}

// A kernel launch on a stream: runs it now (the emulated stream is the calling
// thread, so stream order holds); a bad configuration becomes the error that
// cudaGetLastError() reports next, as with <<<...>>>.
template <typename Stream>
void launch_async(unsigned grid, unsigned block, Stream, std::function<void()> body) {
  const int e = launch(grid, block, std::move(body));
  if (e) m().last_error = e;
}

}  // namespace simt

// ---- CUDA names the kernels use, and the runtime calls -----------------------------------------
#include "simt_cuda_names.h"
