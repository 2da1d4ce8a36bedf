// W12 GEMM on tensor cores, y[M, N] = x[M, K] @ W^T for M <= 64 (bf16 x and y, fp32
// accumulation), W as W12 planes. Built by kernels/w12/mma.py with nvcc (-arch of the GPU,
// sm_80 or newer) into a shared library called through ctypes: no PyTorch headers.
//
// Grid (N / (8 NG) n-tiles, nsplit K splits); a block of wk warps. Every warp of a block
// works on the same NG n-groups (8 weight rows each) and takes every wk-th 64-wide chunk of
// its split's K range. Per chunk a lane loads 16 hi bytes and 8 lo bytes of each of its NG
// rows (two vector loads a row, issued DEPTH - 1 chunks ahead into a register ring),
// decodes them straight into mma.sync B fragments (w12_mma.cuh says how the permuted k
// makes that possible), reads x with the same permutation (8-byte loads, L1-cached: every
// warp of the grid at this K reads the same x), and runs MT x NG mma.m16n8k16 per step.
// The block's warps add their accumulators in shared memory in a fixed order; one split:
// the block adds the exceptions of its rows and stores bf16 y; more: it stores its fp32
// partial and w12_mma_reduce sums the splits in a fixed order (deterministic: no atomics),
// or (fuse, sm_90) the splits of an output tile are one thread block cluster that sums
// them from each other's shared memory in the same order (cluster_finish): one kernel.
// w12_mma_xs_kernel (xs = 1) is the same GEMM with the warps splitting N and x staged in
// shared memory once a block and chunk (see there); w12_mma_st_kernel (xs = 5, "staged")
// the same again with the weights' ring in shared memory too.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "w12_mma.cuh"

using namespace w12mma;

struct Args {
  const uint16_t* x;
  const uint16_t* zero;  // K zeros: the x row of rows past M
  const uint8_t* hi;
  const uint8_t* lo;
  const uint8_t* base;
  const int32_t* row_ptr;
  const void* exc_idx;
  const uint16_t* exc_val;
  uint16_t* y;    // [M, N] bf16
  float* part;    // [nsplit, M, N] fp32 when nsplit > 1
  int M, N, K;
  int idx64;
  int nsplit;
  int fuse;       // nsplit > 1: the splits summed in the tiles kernel (a cluster a tile)
};

__device__ __forceinline__ void load_raw(Raw& r, const uint8_t* hi, const uint8_t* lo) {
  // each weight byte is read once per call: no L1 allocation
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.h[0]), "=r"(r.h[1]), "=r"(r.h[2]), "=r"(r.h[3])
      : "l"(hi));
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
      : "=r"(r.l[0]), "=r"(r.l[1])
      : "l"(lo));
}

__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A warp's accumulators into a tile of fp32 sums in shared memory ([rows][cols] by
// tile_index, the warp's columns from col0 on; rows past M are zero and never stored).
template <int MT, int NG>
__device__ __forceinline__ void acc_to_tile(float* tile, const float (&acc)[MT][NG][4], Lane l,
                                            int rows, int cols, int col0) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int m = out_row(l, t, r);
        if (m < rows) tile[tile_index(m, col0 + out_col(l, j, r), cols)] = acc[t][j][r];
      }
}

// The fused splits' sum (w12_mma.cuh, fin_first): every thread of the nsplit blocks of a
// cluster calls it once its block's tile of fp32 sums is in its shared memory; the tile's
// columns start at nblock. The second barrier keeps each block's shared memory alive until
// every rank has read it. Compiled for sm_90 and newer only; the launch refuses `fuse`
// below (w12_mma_launch).
__device__ __forceinline__ void cluster_finish(const Args& a, float* tile, int rows, int cols,
                                               int nblock) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // every split's tile written (release / acquire across the cluster)
  const int threads = blockDim.x;
  for (int e = fin_first((int)cl.block_rank(), threadIdx.x, threads); e < rows * cols;
       e += fin_step(a.nsplit, threads)) {
    const int m = e / cols, c = e % cols;
    const int64_t n = nblock + c;
    if (n >= a.N) continue;
    float v = 0.0f;
    for (int r = 0; r < a.nsplit; ++r) v += cl.map_shared_rank(tile, r)[tile_index(m, c, cols)];
    v += exception_sum(m, n, a.K, a.x, a.row_ptr, a.exc_idx, a.idx64, a.exc_val, a.base);
    a.y[(int64_t)m * a.N + n] = f32_to_bf16(v);
  }
  cl.sync();
#endif
}

// A lane's row of each of its NG n-groups from column nbase on: its base2 and its planes'
// pointers at `chunk`. N % 8 == 0, so a group is all inside N or all outside: one outside
// (the last block's) reads row 0 and computes what is never stored, with no predicate in
// the loop.
template <int NG>
__device__ __forceinline__ void rows_at(const Args& a, int nbase, int64_t K, int chunk, Lane l,
                                        uint32_t (&b2)[NG], const uint8_t* (&hp)[NG],
                                        const uint8_t* (&lp)[NG]) {
#pragma unroll
  for (int j = 0; j < NG; ++j) {
    const int64_t n = nbase + GROUP_N * j < a.N ? nbase + GROUP_N * j + l.g : 0;
    b2[j] = base2(a.base[n]);
    hp[j] = a.hi + hi_offset(n, K, chunk, l);
    lp[j] = a.lo + lo_offset(n, K, chunk, l);
  }
}

template <int MT, int NG>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NG][4]) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[t][j][r] = 0.0f;
}

// One chunk's planes into a ring slot; the lane's pointers move on by (hstep, lstep) bytes.
template <int NG>
__device__ __forceinline__ void load_chunk(Raw (&slot)[NG], const uint8_t* (&hp)[NG],
                                           const uint8_t* (&lp)[NG], int64_t hstep,
                                           int64_t lstep) {
#pragma unroll
  for (int j = 0; j < NG; ++j) {
    load_raw(slot[j], hp[j], lp[j]);
    hp[j] += hstep;
    lp[j] += lstep;
  }
}

// A lane's 16 x values of one row (two 16-byte vectors) as 8 bf16x2 words.
__device__ __forceinline__ void unpack_x(uint32_t (&w)[8], const uint4 v0, const uint4 v1) {
  w[0] = v0.x; w[1] = v0.y; w[2] = v0.z; w[3] = v0.w;
  w[4] = v1.x; w[5] = v1.y; w[6] = v1.z; w[7] = v1.w;
}

// A lane's x words of every m-tile from one chunk's staged copy in shared memory (the
// shared-x and staged kernels).
template <int MT>
__device__ __forceinline__ void staged_x(const uint16_t* buf, Lane l, uint32_t (&xw)[MT][2][8]) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4* p = reinterpret_cast<const uint4*>(buf + xs_offset(TILE_M * t + l.g + 8 * h, l));
      unpack_x(xw[t][h], p[0], p[1]);
    }
}

// One chunk's four mma steps: each n-group's B fragments decoded once, used by every m-tile.
template <int MT, int NG, bool W8>
__device__ __forceinline__ void mma_chunk(float (&acc)[MT][NG][4], const Raw (&slot)[NG],
                                          const uint32_t (&b2)[NG],
                                          const uint32_t (&xw)[MT][2][8]) {
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    uint32_t bf[NG][2];
#pragma unroll
    for (int j = 0; j < NG; ++j) decode_step(slot[j], s, b2[j], W8, bf[j]);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      uint32_t af[4];
      a_step(xw[t][0], xw[t][1], s, af);
#pragma unroll
      for (int j = 0; j < NG; ++j) mma_bf16(acc[t][j], af, bf[j]);
    }
  }
}

// At most 128 registers a thread (two blocks of 8 warps, or four of 4, an SM) where the
// accumulators leave room: latency is hidden by warps in flight as much as by the ring.
template <int MT, int NG>
constexpr int min_blocks() { return MT * NG >= 8 ? 1 : 2; }
// The shared-x kernel holds no staging registers (cp.async): at M = 64 with two n-groups it
// fits 128 (ptxas for sm_90, (ng, depth) = (2, 2): 132 uncapped, 114 capped, no spill), so
// four blocks of four warps an SM instead of three. Deeper rings and four n-groups stay
// uncapped (capped, (2, 4) at M = 64 spilled 4 bytes and (4, 2) at M = 32 96 bytes).
template <int MT, int NG, int DEPTH>
constexpr int min_blocks_xs() { return NG * DEPTH <= 4 && MT * NG <= 8 ? 2 : 1; }
// MINB > 0 (MmaConfig.blocks, four warps a block only): registers capped so that MINB
// blocks fit an SM, whatever the spills. At M = 64 for sm_90 (nvcc 13.0, ptxas -v): (ng,
// depth) (2, 4) uncapped 156 registers (three blocks), capped for four 128 with 4 bytes
// spilled (W8: 117, none); (4, 2) uncapped 199 (two), capped for three 168 with 228 bytes
// spilled (W8: 153, none). Nsight Compute saw every M = 64 candidate issue-bound at two
// blocks an SM (docs/results.md, 2026-12-06): the tuner times the capped ones beside.
template <int MINB>
constexpr int xs_threads() { return MINB ? 128 : 256; }
template <int MT, int NG, int DEPTH, int MINB>
constexpr int xs_blocks() { return MINB ? MINB : min_blocks_xs<MT, NG, DEPTH>(); }

template <int MT, int NG, int DEPTH, bool W8>
__global__ void __launch_bounds__(256, min_blocks<MT, NG>()) w12_mma_kernel(Args a) {
  extern __shared__ float red[];  // [wk][min(M, MT * 16)][NG * 8]
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wk = blockDim.x >> 5;
  const Lane l = lane_of(lane);
  const int64_t K = a.K;
  const int nblock = blockIdx.x * (NG * GROUP_N);
  int c0, c1;
  split_chunks(blockIdx.y, a.nsplit, a.K / CHUNK_K, &c0, &c1);
  const int iters = warp_iters(c0, c1, w, wk);

  // per lane: its planes' pointers for the chunk it loads next, its x rows' for the chunk
  // it computes next; both advance by wk chunks an iteration
  uint32_t b2[NG];
  const uint8_t* hp[NG];
  const uint8_t* lp[NG];
  rows_at<NG>(a, nblock, K, c0 + w, l, b2, hp, lp);
  const uint16_t* xp[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      xp[t][h] = x_row(a.x, a.zero, TILE_M * t + l.g + 8 * h, a.M, K) + x_offset(c0 + w, l);
  const int64_t hstep = (int64_t)wk * CHUNK_K, lstep = hstep / 2, xstep = hstep;

  float acc[MT][NG][4];
  zero_acc<MT, NG>(acc);

  // the ring: DEPTH - 1 chunks loaded ahead of the one computed; it shifts by one slot a
  // chunk (register moves) so that the loop need not be unrolled DEPTH times
  Raw ring[DEPTH][NG];

  auto load = [&](Raw (&slot)[NG]) { load_chunk<NG>(slot, hp, lp, hstep, lstep); };

  auto compute = [&](const Raw (&slot)[NG]) {
    uint32_t xw[MT][2][8];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xp[t][h]);
        unpack_x(xw[t][h], __ldg(p), __ldg(p + 1));
        xp[t][h] += xstep;
      }
    mma_chunk<MT, NG, W8>(acc, slot, b2, xw);
  };

#pragma unroll
  for (int d = 0; d < DEPTH - 1; ++d)
    if (d < iters) load(ring[d]);
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (it + DEPTH - 1 < iters) load(ring[DEPTH - 1]);
    compute(ring[0]);
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d)
#pragma unroll
      for (int j = 0; j < NG; ++j) ring[d][j] = ring[d + 1][j];
  }

  // the block's warps add up in a fixed order (rows past M are zero and never stored)
  constexpr int ROWS = MT * TILE_M, COLS = NG * GROUP_N;
  const int rows = a.M < ROWS ? a.M : ROWS;
  acc_to_tile<MT, NG>(red + w * rows * COLS, acc, l, rows, COLS, 0);   // warp w's slice
  __syncthreads();
  for (int i = threadIdx.x; i < rows * COLS; i += blockDim.x) {
    const int m = i / COLS, c = i % COLS;
    const int64_t n = nblock + c;
    if (n >= a.N) continue;
    float v = 0.0f;
    for (int ww = 0; ww < wk; ++ww) v += red[(ww * rows + m) * COLS + c];
    if (a.nsplit == 1) {
      v += exception_sum(m, n, K, a.x, a.row_ptr, a.exc_idx, a.idx64, a.exc_val, a.base);
      a.y[(int64_t)m * a.N + n] = f32_to_bf16(v);
    } else if (a.fuse) {   // (a.fuse read where used: a flag kept from here spilled at M = 32)
      red[tile_index(m, c, COLS)] = v;   // warp 0's slot of (m, c): read by this thread alone
    } else {
      a.part[((int64_t)blockIdx.y * a.M + m) * a.N + n] = v;
    }
  }
  if (a.nsplit > 1 && a.fuse) cluster_finish(a, red, rows, COLS, nblock);
}

// A warp's own columns from nwarp on (the kernels whose warps split N): with one split, y
// in bf16 with the rows' exceptions added; else the fp32 partial of this split.
template <int MT, int NG>
__device__ __forceinline__ void store_warp(const Args& a, const float (&acc)[MT][NG][4],
                                           Lane l, int nwarp) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int m = out_row(l, t, r);
        const int64_t n = nwarp + out_col(l, j, r);
        if (m >= a.M || n >= a.N) continue;
        if (a.nsplit == 1)
          a.y[(int64_t)m * a.N + n] = f32_to_bf16(
              acc[t][j][r] + exception_sum(m, n, a.K, a.x, a.row_ptr, a.exc_idx, a.idx64,
                                           a.exc_val, a.base));
        else
          a.part[((int64_t)blockIdx.y * a.M + m) * a.N + n] = acc[t][j][r];
      }
}

// The kernels whose warps split N, fused splits: every warp's sums into the block's tile
// (shared memory, [rows][cols], the warp's columns from cw on), then the cluster's sum.
template <int MT, int NG>
__device__ __forceinline__ void finish_tile(const Args& a, float* tile, const float (&acc)[MT][NG][4],
                                            Lane l, int cols, int cw) {
  const int rows = a.M < MT * TILE_M ? a.M : MT * TILE_M;
  __syncthreads();  // every warp done with the shared memory the tile reuses
  acc_to_tile<MT, NG>(tile, acc, l, rows, cols, cw);
  cluster_finish(a, tile, rows, cols, blockIdx.x * cols);
}

// The same GEMM with x shared: the warps of a block split N (each its own NG n-groups, on
// every chunk of the split) instead of K, so that one copy of a chunk's x rows in shared
// memory serves them all: x crosses L2 once a block and chunk, not once a warp. (With warps
// splitting K, every warp reads its own chunks' x: at M = 64 those reads were several times
// the weight bytes, 0.44-0.55x cuBLAS on the H200.) No reduction across warps. Two
// buffers: the next chunk's x is copied into the other buffer (cp.async) while the current
// chunk's mma run; one barrier a chunk. Needs wk >= 4 (each thread copies at most
// UPT units, sized for 128 threads).
template <int MT, int NG, int DEPTH, bool W8, int MINB>
__global__ void __launch_bounds__(xs_threads<MINB>(),
                                  xs_blocks<MT, NG, DEPTH, MINB>()) w12_mma_xs_kernel(Args a) {
  extern __shared__ uint4 xs_raw[];  // [2][MT * 16][XS_ROW] bf16
  uint16_t* const xs = reinterpret_cast<uint16_t*>(xs_raw);
  constexpr int ROWS = MT * TILE_M, BUF = ROWS * XS_ROW, UNITS = ROWS * (CHUNK_K / 8);
  constexpr int UPT = (UNITS + 127) / 128;  // units a thread stages (blocks of >= 4 warps)
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wk = blockDim.x >> 5;
  const Lane l = lane_of(lane);
  const int64_t K = a.K;
  const int nwarp = blockIdx.x * (wk * NG * GROUP_N) + w * (NG * GROUP_N);
  int c0, c1;
  split_chunks(blockIdx.y, a.nsplit, a.K / CHUNK_K, &c0, &c1);
  const int iters = c1 - c0;  // the same for every warp of the block: barriers are safe

  uint32_t b2[NG];
  const uint8_t* hp[NG];
  const uint8_t* lp[NG];
  rows_at<NG>(a, nwarp, K, c0, l, b2, hp, lp);

  // A chunk's x rows straight into shared buffer buf (cp.async, 16 bytes a unit, L1
  // bypassed): no staging registers (the register copy held UPT x 4 words a thread through
  // the chunk's mma), and the copy of chunk c + 1 runs under chunk c's mma.
  auto fetch = [&](int chunk, int buf) {
#pragma unroll
    for (int i = 0; i < UPT; ++i) {
      const int u = threadIdx.x + i * blockDim.x;
      if (u < UNITS) {
        const uint16_t* src = x_row(a.x, a.zero, xs_unit_row(u), a.M, K) +
                              (int64_t)chunk * CHUNK_K + xs_unit_col(u);
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(
            xs + buf * BUF + xs_unit_row(u) * XS_ROW + xs_unit_col(u)));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  // this thread's copies done; after the barrier every thread's are visible
  auto landed = [] { asm volatile("cp.async.wait_group 0;" ::: "memory"); };

  float acc[MT][NG][4];
  zero_acc<MT, NG>(acc);

  Raw ring[DEPTH][NG];
  auto load = [&](Raw (&slot)[NG]) { load_chunk<NG>(slot, hp, lp, CHUNK_K, CHUNK_K / 2); };
  auto compute = [&](const Raw (&slot)[NG], int buf) {
    uint32_t xw[MT][2][8];
    staged_x<MT>(xs + buf * BUF, l, xw);
    mma_chunk<MT, NG, W8>(acc, slot, b2, xw);
  };

  if (iters > 0) fetch(c0, 0);
#pragma unroll
  for (int d = 0; d < DEPTH - 1; ++d)
    if (d < iters) load(ring[d]);
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (it + DEPTH - 1 < iters) load(ring[DEPTH - 1]);
    landed();
    __syncthreads();  // buffer it & 1 staged; nobody still reads buffer (it + 1) & 1
    if (it + 1 < iters) fetch(c0 + it + 1, (it + 1) & 1);
    compute(ring[0], it & 1);
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d)
#pragma unroll
      for (int j = 0; j < NG; ++j) ring[d][j] = ring[d + 1][j];
  }

  if (a.nsplit > 1 && a.fuse)
    finish_tile<MT, NG>(a, reinterpret_cast<float*>(xs_raw), acc, l, wk * NG * GROUP_N,
                        w * NG * GROUP_N);
  else
    store_warp<MT, NG>(a, acc, l, nwarp);
}

// The staged kernel: the shared-x kernel's partition (warps split N, every warp every chunk
// of its split) with the weights' register ring moved into shared memory. Each lane copies
// its own planes of the chunk S - 1 ahead (cp.async: 16 hi bytes L2-only, 8 lo bytes) into
// its slots of an S-chunk ring, the block's threads copy that chunk's x rows beside them,
// and one group a chunk is committed; a chunk is computed once its group has landed
// (wait_group S - 2) and the barrier has made every thread's x copies visible. The bytes in
// flight no longer cost registers: S - 1 chunks a warp ahead where the register ring held
// DEPTH - 1 (1 or 3) and capped the blocks an SM. Shared memory: S x (the x buffer + 24
// bytes a lane and n-group), over 48 KB for deep rings (opted in at launch).
template <int MT, int NG, int S, bool W8>
__global__ void __launch_bounds__(256) w12_mma_st_kernel(Args a) {
  extern __shared__ uint4 st_raw[];
  uint8_t* const sm = reinterpret_cast<uint8_t*>(st_raw);
  constexpr int ROWS = MT * TILE_M, UNITS = ROWS * (CHUNK_K / 8);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, threads = blockDim.x;
  const int tid = threadIdx.x, xunits = st_x_units(a.M, ROWS);
  const Lane l = lane_of(lane);
  const int64_t K = a.K;
  const int nwarp = blockIdx.x * ((threads >> 5) * NG * GROUP_N) + w * (NG * GROUP_N);
  int c0, c1;
  split_chunks(blockIdx.y, a.nsplit, a.K / CHUNK_K, &c0, &c1);
  const int iters = c1 - c0;  // the same for every warp of the block: barriers are safe

  uint32_t b2[NG];
  const uint8_t* hp[NG];
  const uint8_t* lp[NG];
  rows_at<NG>(a, nwarp, K, c0, l, b2, hp, lp);
  const unsigned ring = static_cast<unsigned>(__cvta_generic_to_shared(sm));

  // chunk c0 + it into its slot: x rows (the block's threads), this lane's planes (then
  // its plane pointers move on one chunk: fetches run in chunk order)
  auto fetch = [&](int it) {
    const int stage = st_stage(it, S);
    const int64_t chunk = c0 + it;
    for (int u = tid; u < xunits; u += threads) {
      const uint16_t* src = a.x + xs_unit_row(u) * K + chunk * CHUNK_K + xs_unit_col(u);
      const unsigned dst = ring + stage * st_x_bytes(ROWS) +
                           2 * (xs_unit_row(u) * XS_ROW + xs_unit_col(u));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    }
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      const unsigned dh = ring + st_hi_offset(stage, S, ROWS, NG, threads, j, tid);
      const unsigned dl = ring + st_lo_offset(stage, S, ROWS, NG, threads, j, tid);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dh), "l"(hp[j]) : "memory");
      if (!W8)  // the 8-bit view never reads the lo plane (the register ring's loads of it
                // are dead code the compiler drops; a cp.async is not)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dl), "l"(lp[j]) : "memory");
      hp[j] += CHUNK_K;
      lp[j] += CHUNK_K / 2;
    }
  };
  auto commit = [] { asm volatile("cp.async.commit_group;" ::: "memory"); };

  float acc[MT][NG][4];
  zero_acc<MT, NG>(acc);

  auto compute = [&](int it) {
    const int stage = st_stage(it, S);
    Raw raw[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      const uint4 h = *reinterpret_cast<const uint4*>(
          sm + st_hi_offset(stage, S, ROWS, NG, threads, j, tid));
      const uint2 lo = *reinterpret_cast<const uint2*>(
          sm + st_lo_offset(stage, S, ROWS, NG, threads, j, tid));
      raw[j].h[0] = h.x; raw[j].h[1] = h.y; raw[j].h[2] = h.z; raw[j].h[3] = h.w;
      raw[j].l[0] = lo.x; raw[j].l[1] = lo.y;
    }
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(sm + stage * st_x_bytes(ROWS));
    uint32_t xw[MT][2][8];
    staged_x<MT>(xs, l, xw);
    mma_chunk<MT, NG, W8>(acc, raw, b2, xw);
  };

  // the rows past M, zero in every stage (no copy ever writes them; the loop's first
  // barrier orders these stores before any read)
  for (int i = xunits + tid; i < S * UNITS; i += threads) {
    const int stage = i / UNITS, u = i % UNITS;
    if (u < xunits) continue;
    *reinterpret_cast<uint4*>(sm + stage * st_x_bytes(ROWS) +
                              2 * (xs_unit_row(u) * XS_ROW + xs_unit_col(u))) = make_uint4(0, 0, 0, 0);
  }
#pragma unroll 1
  for (int d = 0; d < S - 1; ++d) {
    if (d < iters) fetch(d);
    commit();  // empty groups too: group i is always chunk i's
  }
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");  // chunk it landed
    __syncthreads();  // everyone's x of chunk it visible; nobody still reads slot it - 1
    if (it + S - 1 < iters) fetch(it + S - 1);
    commit();
    compute(it);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");

  if (a.nsplit > 1 && a.fuse)
    finish_tile<MT, NG>(a, reinterpret_cast<float*>(st_raw), acc, l, (threads >> 5) * NG * GROUP_N,
                        w * NG * GROUP_N);
  else
    store_warp<MT, NG>(a, acc, l, nwarp);
}

// The splits' sum: grid (ceil(N / 4 / 256), M), each thread REDUCE_VEC consecutive outputs
// of row m (blockIdx.y: no 64-bit division), the partials read as float4 where N allows
// (the buffer from PyTorch is 256-byte aligned, a row starts on 16 bytes when N % 4 == 0).
// Each output's sum is the same as one thread per output would make: 0 + split 0 + split 1
// ..., then its exceptions (the emulator's order). Nsight Compute on the H100 saw the
// one-output-a-thread sum take 14 us at M = 64, N = 15360 (10 MB moved, 31 % of the
// memory's rate).
constexpr int REDUCE_VEC = 4;

__global__ void w12_mma_reduce(Args a) {
  const int64_t m = blockIdx.y;
  const int n0 = (blockIdx.x * blockDim.x + threadIdx.x) * REDUCE_VEC;
  if (n0 >= a.N) return;
  const int64_t plane = (int64_t)a.M * a.N, row = m * a.N;
  float v[REDUCE_VEC] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int count = min(REDUCE_VEC, a.N - n0);
  if (count == REDUCE_VEC && a.N % REDUCE_VEC == 0) {
    for (int s = 0; s < a.nsplit; ++s) {
      const float4 p = *reinterpret_cast<const float4*>(a.part + s * plane + row + n0);
      v[0] += p.x; v[1] += p.y; v[2] += p.z; v[3] += p.w;
    }
  } else {
    for (int s = 0; s < a.nsplit; ++s)
      for (int j = 0; j < count; ++j) v[j] += a.part[s * plane + row + n0 + j];
  }
  uint16_t out[REDUCE_VEC];
  for (int j = 0; j < count; ++j)
    out[j] = f32_to_bf16(v[j] + exception_sum(m, n0 + j, a.K, a.x, a.row_ptr, a.exc_idx,
                                              a.idx64, a.exc_val, a.base));
  if (count == REDUCE_VEC && a.N % REDUCE_VEC == 0)   // 8 bytes, 8-byte aligned
    *reinterpret_cast<uint2*>(a.y + row + n0) =
        make_uint2((uint32_t)out[0] | ((uint32_t)out[1] << 16),
                   (uint32_t)out[2] | ((uint32_t)out[3] << 16));
  else
    for (int j = 0; j < count; ++j) a.y[row + n0 + j] = out[j];
}

// Launch a tiles kernel: with fused splits as clusters of the nsplit blocks of an output
// tile (grid.y is nsplit: one cluster a column of the grid), else as a plain grid.
static cudaError_t run_grid(void (*kernel)(Args), const Args& a, dim3 grid, int threads,
                            size_t smem, cudaStream_t stream) {
  if (a.nsplit > 1 && a.fuse) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = dim3(threads);
    c.dynamicSmemBytes = smem;
    c.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = a.nsplit;
    at[0].val.clusterDim.z = 1;
    c.attrs = at;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, kernel, a);
  }
  kernel<<<grid, threads, smem, stream>>>(a);
  return cudaGetLastError();
}

// Shared memory the kernels whose warps split N need beside `ring` bytes: with fused splits
// the block's tile of fp32 sums reuses it, [min(M, rows)][the block's columns].
static size_t with_tile(const Args& a, size_t ring, int rows, int cols) {
  const size_t tile = a.nsplit > 1 && a.fuse ? sizeof(float) * (a.M < rows ? a.M : rows) * cols : 0;
  return ring > tile ? ring : tile;
}

// The shared-x kernel, MINB as there (valid() has checked that a capped one gets four
// warps, its bounds' 128 threads): launch, or (occ) report blocks an SM.
template <int MT, int NG, int DEPTH, bool W8, int MINB>
static cudaError_t launch_xs(const Args& a, int wk, cudaStream_t stream, int* occ) {
  const int cols = wk * NG * GROUP_N;
  const size_t smem = with_tile(a, sizeof(uint16_t) * 2 * MT * TILE_M * XS_ROW, MT * TILE_M, cols);
  if (occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      occ, w12_mma_xs_kernel<MT, NG, DEPTH, W8, MINB>, wk * 32, smem);
  dim3 grid((a.N + cols - 1) / cols, a.nsplit);
  return run_grid(w12_mma_xs_kernel<MT, NG, DEPTH, W8, MINB>, a, grid, wk * 32, smem, stream);
}

// The staged kernel, S = DEPTH stages: launch, or (occ) report blocks an SM. Shared memory
// past 48 KB is opted in once per instantiation and device (and before the occupancy query).
constexpr int MAX_DEVICES = 64;

template <int MT, int NG, int S, bool W8>
static cudaError_t launch_st(const Args& a, int wk, cudaStream_t stream, int* occ) {
  const int threads = wk * 32, cols = wk * NG * GROUP_N;
  const size_t smem = with_tile(a, (size_t)S * (st_x_bytes(MT * TILE_M) + st_w_bytes(NG, threads)),
                                MT * TILE_M, cols);
  static int opted[MAX_DEVICES] = {};  // per device: the largest size opted in so far
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= MAX_DEVICES) return cudaErrorInvalidDevice;
  if ((int)smem > opted[dev]) {
    e = cudaFuncSetAttribute(w12_mma_st_kernel<MT, NG, S, W8>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    opted[dev] = (int)smem;
  }
  if (occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      occ, w12_mma_st_kernel<MT, NG, S, W8>, threads, smem);
  dim3 grid((a.N + cols - 1) / cols, a.nsplit);
  return run_grid(w12_mma_st_kernel<MT, NG, S, W8>, a, grid, threads, smem, stream);
}

// Launch, or (occ != nullptr) only report how many blocks of this shape an SM holds. xs: 0
// the kernel above, 1 the shared-x kernel, 3 or 4 the shared-x kernel capped for that many
// blocks an SM (compiled for (ng, depth) (4, 2) and (2, 4) only: w12_mma_capped).
template <int MT, int NG, int DEPTH, bool W8>
static cudaError_t launch_t(const Args& a, int wk, int xs, cudaStream_t stream, int* occ) {
  if (xs == 1) return launch_xs<MT, NG, DEPTH, W8, 0>(a, wk, stream, occ);
  if constexpr (NG == 2 && DEPTH == 4) {
    if (xs == 4) return launch_xs<MT, NG, DEPTH, W8, 4>(a, wk, stream, occ);
  }
  if constexpr (NG == 4 && DEPTH == 2) {
    if (xs == 3) return launch_xs<MT, NG, DEPTH, W8, 3>(a, wk, stream, occ);
  }
  if (xs) return cudaErrorInvalidValue;
  constexpr int COLS = NG * GROUP_N;
  const int rows = a.M < MT * TILE_M ? a.M : MT * TILE_M;
  const size_t smem = sizeof(float) * wk * rows * COLS;
  if (smem > 48 * 1024) return cudaErrorInvalidConfiguration;
  if (occ) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      occ, w12_mma_kernel<MT, NG, DEPTH, W8>, wk * 32, smem);
  dim3 grid((a.N + COLS - 1) / COLS, a.nsplit);
  return run_grid(w12_mma_kernel<MT, NG, DEPTH, W8>, a, grid, wk * 32, smem, stream);
}

// W12_MMA_ONLY_W12 (tests only: the CPU's register check, half the build): no 8-bit view.
#ifdef W12_MMA_ONLY_W12
constexpr bool VIEW_W8 = false;
#else
constexpr bool VIEW_W8 = true;
#endif

template <int MT, int NG, int DEPTH>
static cudaError_t launch_view(const Args& a, int w8, int wk, int xs, cudaStream_t s, int* occ) {
  if constexpr (VIEW_W8) {
    if (w8) return launch_t<MT, NG, DEPTH, true>(a, wk, xs, s, occ);
  }
  return w8 ? cudaErrorInvalidValue : launch_t<MT, NG, DEPTH, false>(a, wk, xs, s, occ);
}

// xs == STAGED: the staged kernel, depth its stages; compiled for the (ng, stages) pairs
// of w12_mma_staged.
constexpr int STAGED = 5;

template <int MT, int NG, int S>
static cudaError_t launch_st_view(const Args& a, int w8, int wk, cudaStream_t s, int* occ) {
  if constexpr (VIEW_W8) {
    if (w8) return launch_st<MT, NG, S, true>(a, wk, s, occ);
  }
  return w8 ? cudaErrorInvalidValue : launch_st<MT, NG, S, false>(a, wk, s, occ);
}

template <int MT>
static cudaError_t launch_mt(const Args& a, int w8, int ng, int depth, int wk, int xs,
                             cudaStream_t s, int* occ) {
  if (xs == STAGED) {
    if (ng == 1 && depth == 8) return launch_st_view<MT, 1, 8>(a, w8, wk, s, occ);
    if (ng == 2 && depth == 4) return launch_st_view<MT, 2, 4>(a, w8, wk, s, occ);
    if (ng == 2 && depth == 8) return launch_st_view<MT, 2, 8>(a, w8, wk, s, occ);
    if (ng == 4 && depth == 4) return launch_st_view<MT, 4, 4>(a, w8, wk, s, occ);
    return cudaErrorInvalidValue;
  }
  if (ng == 1 && depth == 4) return launch_view<MT, 1, 4>(a, w8, wk, xs, s, occ);
  if (ng == 2 && depth == 2) return launch_view<MT, 2, 2>(a, w8, wk, xs, s, occ);
  if (ng == 2 && depth == 4) return launch_view<MT, 2, 4>(a, w8, wk, xs, s, occ);
  if (ng == 4 && depth == 2) return launch_view<MT, 4, 2>(a, w8, wk, xs, s, occ);
  return cudaErrorInvalidValue;
}

static cudaError_t dispatch(const Args& a, int w8, int ng, int depth, int wk, int xs,
                            cudaStream_t s, int* occ) {
  switch ((a.M + TILE_M - 1) / TILE_M) {
    case 1: return launch_mt<1>(a, w8, ng, depth, wk, xs, s, occ);
    case 2: return launch_mt<2>(a, w8, ng, depth, wk, xs, s, occ);
    case 3: return launch_mt<3>(a, w8, ng, depth, wk, xs, s, occ);
    default: return launch_mt<4>(a, w8, ng, depth, wk, xs, s, occ);
  }
}

// Fused splits: at most a portable cluster's 8 blocks.
constexpr int MAX_FUSED = 8;

static bool valid(int M, int N, int K, int wk, int xs, int nsplit, int fuse) {
  return M >= 1 && M <= 4 * TILE_M && K % CHUNK_K == 0 && N % GROUP_N == 0 &&
         wk >= (xs ? 4 : 1) && wk <= 8 && nsplit >= 1 && (!fuse || nsplit <= MAX_FUSED) &&
         (xs <= 1 || xs == STAGED || wk == 4);
}

// Clusters (fused splits) need sm_90 or newer: the device's, and the library's own build
// (cluster_finish is empty below sm_90).
static cudaError_t clusters_here() {
  static int known[MAX_DEVICES] = {};  // per device: 0 not asked yet, 1 yes, -1 no
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= MAX_DEVICES) return cudaErrorInvalidDevice;
  if (!known[dev]) {
    int major = 0;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, w12_mma_reduce);
    if (e != cudaSuccess) return e;
    known[dev] = major >= 9 && fa.binaryVersion >= 90 ? 1 : -1;
  }
  return known[dev] > 0 ? cudaSuccess : cudaErrorNotSupported;
}

// The (ng, depth) pairs compiled; kernels/w12/mma.py's configurations use only these.
extern "C" int w12_mma_variants(int* out, int cap) {
  static const int v[] = {1, 4, 2, 2, 2, 4, 4, 2};
  const int n = sizeof(v) / sizeof(v[0]);
  for (int i = 0; i < n && i < cap; ++i) out[i] = v[i];
  return n / 2;
}

// The staged kernels compiled: (ng, stages) pairs.
extern "C" int w12_mma_staged(int* out, int cap) {
  static const int v[] = {1, 8, 2, 4, 2, 8, 4, 4};
  const int n = sizeof(v) / sizeof(v[0]);
  for (int i = 0; i < n && i < cap; ++i) out[i] = v[i];
  return n / 2;
}

// The capped shared-x kernels compiled: (ng, depth, blocks an SM) triples.
extern "C" int w12_mma_capped(int* out, int cap) {
  static const int v[] = {2, 4, 4, 4, 2, 3};
  const int n = sizeof(v) / sizeof(v[0]);
  for (int i = 0; i < n && i < cap; ++i) out[i] = v[i];
  return n / 3;
}

extern "C" const char* w12_mma_error(int e) { return cudaGetErrorString((cudaError_t)e); }

// Blocks of one configuration an SM holds at once (registers, shared memory), into *blocks;
// returns 0 or a cudaError_t.
extern "C" int w12_mma_occupancy(int M, int w8, int ng, int depth, int wk, int xs, int fuse,
                                 int* blocks) {
  if (!valid(M, GROUP_N, CHUNK_K, wk, xs, 1, fuse)) return cudaErrorInvalidValue;
  Args a{};
  a.M = M;
  a.nsplit = fuse ? 2 : 1;   // the shared memory of a fused launch (any split)
  a.fuse = fuse;
  return (int)dispatch(a, w8, ng, depth, wk, xs, nullptr, blocks);
}

// 0 on success, else a cudaError_t (cudaErrorInvalidValue: a configuration not compiled;
// cudaErrorInvalidConfiguration: shared memory over 48 KB; cudaErrorNotSupported: fuse
// below sm_90). xs: the kernel of shared x (w12_mma_xs_kernel, wk >= 4; 3 or 4: capped for
// that many blocks an SM, wk == 4, see launch_t); 5: the staged kernel (w12_mma_st_kernel,
// wk >= 4, depth its stages). fuse: K splits (at most 8) summed in the tiles kernel, one
// cluster an output tile, `part` unused; else w12_mma_reduce sums `part`.
extern "C" int w12_mma_launch(const void* x, const void* zero, const void* hi, const void* lo,
                              const void* base, const void* row_ptr, const void* exc_idx,
                              int idx64, const void* exc_val, void* y, void* part, int M, int N,
                              int K, int w8, int ng, int depth, int wk, int xs, int nsplit,
                              int fuse, void* stream) {
  if (!valid(M, N, K, wk, xs, nsplit, fuse)) return cudaErrorInvalidValue;
  fuse = fuse && nsplit > 1;
  if (fuse) {
    const cudaError_t e = clusters_here();
    if (e != cudaSuccess) return (int)e;
  }
  Args a{(const uint16_t*)x, (const uint16_t*)zero, (const uint8_t*)hi, (const uint8_t*)lo,
         (const uint8_t*)base, (const int32_t*)row_ptr, exc_idx, (const uint16_t*)exc_val,
         (uint16_t*)y, (float*)part, M, N, K, idx64, nsplit, fuse};
  cudaStream_t s = (cudaStream_t)stream;
  const cudaError_t e = dispatch(a, w8, ng, depth, wk, xs, s, nullptr);
  if (e != cudaSuccess || nsplit == 1 || fuse) return (int)e;
  const int threads = (N + REDUCE_VEC - 1) / REDUCE_VEC;
  w12_mma_reduce<<<dim3((unsigned)((threads + 255) / 256), (unsigned)M), 256, 0, s>>>(a);
  return (int)cudaGetLastError();
}
