// CPU emulator of w12_mma.cu: the kernel's grid, warps and lanes run one after another,
// each lane through w12_mma.cuh's own functions (what it loads, how it decodes, where it
// stores), and each mma.sync.m16n8k16 through `mma_warp`, written from the PTX ISA's
// fragment tables for .bf16 (not from the header's mapping), so that a wrong permutation
// or lane mapping in the header gives wrong products here. It also checks every load
// against its buffer's size. Built by kernels/w12/mma.py with the host C++ compiler.

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "w12_mma.cuh"

using namespace w12mma;

namespace {

constexpr int MAX_MT = 4, MAX_NG = 4;

// One warp's mma.m16n8k16.row.col.f32.bf16.bf16.f32, D = A B + C, for all 32 lanes.
// A (16 x 16): lane (g, q) = (lane / 4, lane % 4) holds elements a0..a7 in registers
// a[0..3], two a register (the lower index in the low 16 bits); element i sits at row
// g + 8 * ((i / 2) % 2), column 2q + (i % 2) + 8 * (i / 4).
// B (16 x 8): elements b0..b3 in b[0..1]; element i at row 2q + (i % 2) + 8 * (i / 2),
// column g. C, D (16 x 8): element i of c[0..3] at row g + 8 * (i / 2), column 2q + i % 2.
void mma_warp(float (*acc)[4], const uint32_t (*a)[4], const uint32_t (*b)[2]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const uint32_t half = (a[lane][i / 2] >> (16 * (i % 2))) & 0xFFFFu;
      A[g + 8 * ((i / 2) % 2)][2 * q + (i % 2) + 8 * (i / 4)] = bf16_to_f32(half);
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t half = (b[lane][i / 2] >> (16 * (i % 2))) & 0xFFFFu;
      B[2 * q + (i % 2) + 8 * (i / 2)][g] = bf16_to_f32(half);
    }
  }
  float C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int i = 0; i < 4; ++i) C[g + 8 * (i / 2)][2 * q + i % 2] = acc[lane][i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float d = C[m][n];
      for (int k = 0; k < 16; ++k) d += A[m][k] * B[k][n];
      C[m][n] = d;
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int i = 0; i < 4; ++i) acc[lane][i] = C[g + 8 * (i / 2)][2 * q + i % 2];
  }
}

struct Bounds {
  int64_t x, hi, lo;  // elements of x (bf16), bytes of hi and lo
  bool ok = true;
  bool in(int64_t off, int64_t len, int64_t size) {
    if (off < 0 || off + len > size) ok = false;
    return ok;
  }
};

}  // namespace

// Same arguments as w12_mma_launch (no stream) plus the buffers' sizes; out_f32: y is
// float [M, N] (the value before the bf16 rounding), else bf16 bits. fuse: the splits
// summed as the kernel's clusters do, each block's sums left in its tile and every rank's
// threads finishing their elements (w12_mma.cuh, fin_first), else as w12_mma_reduce does;
// an output no thread writes keeps y's value. Returns 0, -1 for a configuration the kernel
// refuses, -2 if a lane would read outside a buffer.
extern "C" int w12_mma_emulate(const void* x_, const void* hi_, const void* lo_,
                               const void* base_, const void* row_ptr_, const void* exc_idx,
                               int idx64, const void* exc_val_, void* y_, int out_f32,
                               int M, int N, int K, int w8, int ng, int depth, int wk,
                               int xs, int nsplit, int fuse, int64_t x_elems,
                               int64_t hi_bytes, int64_t lo_bytes) {
  // depth: the register ring changes when a load is issued, not what is loaded; the
  // staged kernel's (xs == 5) ring is shared memory, emulated below slot by slot
  const bool st = xs == 5;
  if (st && depth < 2) return -1;
  if (M < 1 || M > MAX_MT * TILE_M || K % CHUNK_K || N % GROUP_N || wk < (xs ? 4 : 1) ||
      wk > 8 || nsplit < 1 || ng < 1 || ng > MAX_NG || (fuse && nsplit > 8))
    return -1;
  fuse = fuse && nsplit > 1;
  const uint16_t* x = (const uint16_t*)x_;
  const uint8_t* hi = (const uint8_t*)hi_;
  const uint8_t* lo = (const uint8_t*)lo_;
  const uint8_t* base = (const uint8_t*)base_;
  const int32_t* row_ptr = (const int32_t*)row_ptr_;
  const uint16_t* exc_val = (const uint16_t*)exc_val_;
  Bounds bounds{x_elems, hi_bytes, lo_bytes};

  // xs: the kernel of shared x (w12_mma_xs_kernel): a block's warps split its columns and
  // each takes every chunk of the split, reading x from the block's staged copy of the chunk
  const int mt = (M + TILE_M - 1) / TILE_M, cols = (xs ? wk : 1) * ng * GROUP_N;
  const int rows = M < mt * TILE_M ? M : mt * TILE_M;
  const int tiles = (N + cols - 1) / cols;
  std::vector<float> part(fuse ? 0 : (size_t)nsplit * M * N, 0.0f);   // w12_mma_reduce's input
  // fused: each (split, n-tile) block's tile of sums, [rows][cols] by tile_index
  std::vector<float> tile_sums(fuse ? (size_t)nsplit * tiles * rows * cols : 0, 0.0f);
  std::vector<float> red((size_t)wk * rows * cols);
  const std::vector<uint16_t> zero((size_t)K, 0);
  std::vector<uint16_t> staged((size_t)mt * TILE_M * XS_ROW, 0xFFFFu);
  // the staged kernel's shared memory: depth stages of x rows, then of every lane's planes
  const int threads = wk * 32, ring_rows = mt * TILE_M;
  std::vector<uint8_t> ring(st ? (size_t)depth * (st_x_bytes(ring_rows) + st_w_bytes(ng, threads))
                               : 0, 0xFFu);

  for (int split = 0; split < nsplit; ++split)
    for (int tile = 0; tile < tiles; ++tile) {
      const int nblock = tile * cols;
      int c0, c1;
      split_chunks(split, nsplit, K / CHUNK_K, &c0, &c1);
      std::fill(red.begin(), red.end(), 0.0f);
      for (int w = 0; w < wk; ++w) {
        static float acc[MAX_MT][MAX_NG][32][4];
        memset(acc, 0, sizeof(acc));
        const int64_t nwarp = nblock + (xs ? (int64_t)w * ng * GROUP_N : 0);
        const int iters = xs ? c1 - c0 : warp_iters(c0, c1, w, wk);
        // staged: chunk c0 + i into its slot as the kernel's threads copy it (x by units,
        // every warp's lanes their own planes of their own rows); false: a read outside
        auto fetch = [&](int i) -> bool {
          const int stage = st_stage(i, depth);
          const int64_t chunk = c0 + i;
          for (int u = 0; u < st_x_units(M, ring_rows); ++u) {
            const uint16_t* row = x + (int64_t)xs_unit_row(u) * K;
            const int64_t o = chunk * CHUNK_K + xs_unit_col(u);
            if (!bounds.in((row - x) + o, 8, bounds.x)) return false;
            const int d = stage * st_x_bytes(ring_rows) + 2 * (xs_unit_row(u) * XS_ROW + xs_unit_col(u));
            if (!bounds.in(d, 16, (int64_t)ring.size())) return false;
            memcpy(&ring[d], row + o, 16);
          }
          for (int t = 0; t < threads; ++t) {
            const Lane l = lane_of(t % 32);
            const int64_t nw = nblock + (int64_t)(t / 32) * ng * GROUP_N;
            for (int j = 0; j < ng; ++j) {
              const int64_t n = nw + GROUP_N * j < N ? nw + GROUP_N * j + l.g : 0;
              const int64_t ho = hi_offset(n, K, chunk, l), lo_off = lo_offset(n, K, chunk, l);
              const int dh = st_hi_offset(stage, depth, ring_rows, ng, threads, j, t);
              const int dl = st_lo_offset(stage, depth, ring_rows, ng, threads, j, t);
              if (!bounds.in(ho, 16, bounds.hi) || !bounds.in(lo_off, 8, bounds.lo) ||
                  !bounds.in(dh, 16, (int64_t)ring.size()) || !bounds.in(dl, 8, (int64_t)ring.size()))
                return false;
              memcpy(&ring[dh], hi + ho, 16);
              if (!w8) memcpy(&ring[dl], lo + lo_off, 8);   // the kernel's W8 copies no lo
            }
          }
          return true;
        };
        if (st) {   // the rows past M zeroed in every stage, as the kernel's threads do
          const int units = ring_rows * (CHUNK_K / 8);
          for (int i = 0; i < depth * units; ++i) {
            const int u = i % units;
            if (u < st_x_units(M, ring_rows)) continue;
            memset(&ring[(i / units) * st_x_bytes(ring_rows) +
                         2 * (xs_unit_row(u) * XS_ROW + xs_unit_col(u))], 0, 16);
          }
          for (int d = 0; d < depth - 1 && d < iters; ++d)
            if (!fetch(d)) return -2;
        }
        for (int it = 0; it < iters; ++it) {
          const int64_t chunk = xs ? c0 + it : c0 + w + (int64_t)it * wk;
          if (st && it + depth - 1 < iters && !fetch(it + depth - 1)) return -2;
          if (xs && !st)   // the block's staging of this chunk, unit by unit as the kernel's threads
            for (int u = 0; u < mt * TILE_M * (CHUNK_K / 8); ++u) {
              const uint16_t* row = x_row(x, zero.data(), xs_unit_row(u), M, K);
              const int64_t o = chunk * CHUNK_K + xs_unit_col(u);
              if (row == zero.data() ? !bounds.in(o, 8, K) : !bounds.in((row - x) + o, 8, bounds.x))
                return -2;
              memcpy(&staged[(size_t)xs_unit_row(u) * XS_ROW + xs_unit_col(u)], row + o, 16);
            }
          Raw raw[32][MAX_NG];
          uint32_t b2[32][MAX_NG];
          for (int lane = 0; lane < 32; ++lane) {
            const Lane l = lane_of(lane);
            for (int j = 0; j < ng; ++j) {
              const int64_t n = nwarp + GROUP_N * j < N ? nwarp + GROUP_N * j + l.g : 0;
              b2[lane][j] = base2(base[n]);
              const int64_t ho = hi_offset(n, K, chunk, l), lo_off = lo_offset(n, K, chunk, l);
              if (!bounds.in(ho, 16, bounds.hi) || !bounds.in(lo_off, 8, bounds.lo)) return -2;
              if (st) {   // back from the lane's own slots of this chunk's stage
                const int t = w * 32 + lane, stage = st_stage(it, depth);
                memcpy(raw[lane][j].h, &ring[st_hi_offset(stage, depth, ring_rows, ng, threads, j, t)], 16);
                memcpy(raw[lane][j].l, &ring[st_lo_offset(stage, depth, ring_rows, ng, threads, j, t)], 8);
                continue;
              }
              memcpy(raw[lane][j].h, hi + ho, 16);
              memcpy(raw[lane][j].l, lo + lo_off, 8);
            }
          }
          for (int s = 0; s < STEPS; ++s) {
            uint32_t bf[MAX_NG][32][2];
            for (int lane = 0; lane < 32; ++lane)
              for (int j = 0; j < ng; ++j)
                decode_step(raw[lane][j], s, b2[lane][j], w8 != 0, bf[j][lane]);
            for (int t = 0; t < mt; ++t) {
              uint32_t af[32][4];
              for (int lane = 0; lane < 32; ++lane) {
                const Lane l = lane_of(lane);
                uint32_t xw[2][8];
                for (int h = 0; h < 2; ++h) {
                  if (st) {   // from the chunk's stage of the ring
                    const int o = st_stage(it, depth) * st_x_bytes(ring_rows) +
                                  2 * xs_offset(TILE_M * t + l.g + 8 * h, l);
                    if (!bounds.in(o, 32, (int64_t)ring.size())) return -2;
                    memcpy(xw[h], &ring[o], 32);
                    continue;
                  }
                  if (xs) {   // from the staged copy (its padding is never read: 0xFFFF there)
                    const int o = xs_offset(TILE_M * t + l.g + 8 * h, l);
                    if (!bounds.in(o, 16, (int64_t)staged.size())) return -2;
                    memcpy(xw[h], &staged[o], 32);
                    continue;
                  }
                  const uint16_t* row = x_row(x, zero.data(), TILE_M * t + l.g + 8 * h, M, K);
                  const int64_t o = x_offset(chunk, l);
                  if (row == zero.data() ? !bounds.in(o, 16, K)
                                         : !bounds.in((row - x) + o, 16, bounds.x))
                    return -2;
                  memcpy(xw[h], row + o, 32);
                }
                a_step(xw[0], xw[1], s, af[lane]);
              }
              for (int j = 0; j < ng; ++j) mma_warp(acc[t][j], af, bf[j]);
            }
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          const Lane l = lane_of(lane);
          for (int t = 0; t < mt; ++t)
            for (int j = 0; j < ng; ++j)
              for (int r = 0; r < 4; ++r) {
                const int m = out_row(l, t, r);
                if (m >= rows) continue;
                // xs: every warp its own columns (the others' stay 0 in its row of red)
                const int c = (int)(nwarp - nblock) + out_col(l, j, r);
                red[((size_t)w * rows + m) * cols + c] = acc[t][j][lane][r];
              }
        }
      }
      for (int i = 0; i < rows * cols; ++i) {
        const int m = i / cols, c = i % cols;
        const int64_t n = nblock + c;
        if (n >= N) continue;
        float v = 0.0f;
        for (int w = 0; w < wk; ++w) v += red[((size_t)w * rows + m) * cols + c];
        if (fuse)
          tile_sums[((size_t)split * tiles + tile) * rows * cols + tile_index(m, c, cols)] = v;
        else
          part[((size_t)split * M + m) * N + n] = v;
      }
    }

  auto store = [&](int64_t m, int64_t n, float v) {
    v += exception_sum(m, n, K, x, row_ptr, exc_idx, idx64 != 0, exc_val, base);
    if (out_f32)
      ((float*)y_)[m * N + n] = v;
    else
      ((uint16_t*)y_)[m * N + n] = f32_to_bf16(v);
  };
  if (fuse) {   // every cluster (n-tile): each rank's threads their elements, splits in order
    for (int tile = 0; tile < tiles; ++tile)
      for (int rank = 0; rank < nsplit; ++rank)
        for (int t = 0; t < threads; ++t)
          for (int e = fin_first(rank, t, threads); e < rows * cols; e += fin_step(nsplit, threads)) {
            const int m = e / cols, c = e % cols;
            const int64_t n = (int64_t)tile * cols + c;
            if (n >= N) continue;
            float v = 0.0f;
            for (int s = 0; s < nsplit; ++s)
              v += tile_sums[((size_t)s * tiles + tile) * rows * cols + tile_index(m, c, cols)];
            store(m, n, v);
          }
    return bounds.ok ? 0 : -2;
  }
  for (int64_t i = 0; i < (int64_t)M * N; ++i) {
    const int64_t m = i / N, n = i % N;
    float v = 0.0f;
    for (int s = 0; s < nsplit; ++s) v += part[((size_t)s * M + m) * N + n];
    store(m, n, v);
  }
  return bounds.ok ? 0 : -2;
}
