// W12 GEMM on tensor cores for M <= 64 rows: what each lane loads, decodes and stores.
//
// Shared by the CUDA kernel (w12_mma.cu) and the CPU emulator (w12_mma_emu.cpp), so that
// the emulator, which runs these same functions for all 32 lanes of a warp and an
// mma.sync.m16n8k16 written from the PTX ISA's fragment tables, tests the kernel's index
// and decode logic on a machine with no GPU.
//
// The idea: y = x W^T sums over k in any order, so the kernel permutes k inside each
// 64-wide chunk so that one lane's 16 *consecutive* weights of a row (16 hi bytes, 8 lo
// bytes: two vector loads) are exactly its B-fragment registers for the chunk's four
// mma steps, decoded in registers (no shared memory, no layout conversion). x is read with
// the same permutation. Lane (g, q) = (lane / 4, lane % 4) of a warp owns weight row
// n0 + g of each n-group and physical k = 16q .. 16q + 15 of each chunk; in mma step s it
// feeds physical k 16q + 4s + {0, 1} as the mma's k = 2q + {0, 1} and 16q + 4s + {2, 3}
// as k = 2q + 8 + {0, 1}, in A (x rows g and g + 8 of an m-tile) and B alike.

#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define W12_HD __host__ __device__ __forceinline__
#else
#define W12_HD static inline
#endif

namespace w12mma {

constexpr int CHUNK_K = 64;  // k per warp iteration: 4 lanes x 16 consecutive k
constexpr int GROUP_N = 8;   // weight rows of one n-group (the mma's n)
constexpr int TILE_M = 16;   // x rows of one m-tile (the mma's m)
constexpr int STEPS = 4;     // mma steps (k = 16 each) of one chunk

struct Lane {
  int g;  // groupID: weight row within the n-group; x row within the m-tile (and +8)
  int q;  // thread in group: which 16 k of the chunk
};

W12_HD Lane lane_of(int lane) { return Lane{lane >> 2, lane & 3}; }

// One lane's bytes of one n-group row in one chunk.
W12_HD int64_t hi_offset(int64_t n, int64_t K, int64_t chunk, Lane l) {
  return n * K + chunk * CHUNK_K + 16 * l.q;
}
W12_HD int64_t lo_offset(int64_t n, int64_t K, int64_t chunk, Lane l) {
  return n * (K / 2) + chunk * (CHUNK_K / 2) + 8 * l.q;
}
// One lane's first x element (bf16 units) of a row in one chunk: 16 values, two 16-byte
// loads. Rows past M read `zero` (a row of K zeros) instead: no predicate in the loop.
W12_HD int64_t x_offset(int64_t chunk, Lane l) { return chunk * CHUNK_K + 16 * l.q; }
W12_HD const uint16_t* x_row(const uint16_t* x, const uint16_t* zero, int64_t m, int64_t M,
                             int64_t K) {
  return m < M ? x + m * K : zero;
}

// x staged in shared memory (the kernel of shared x): a chunk's rows, XS_ROW bf16 apart
// (64 values and 8 of padding: a lane's two 16-byte reads of rows g = 0..7 at 144-byte
// strides fall in distinct banks in each quarter-warp phase), copied in 16-byte units,
// unit u holding row u / 8, values 8 (u % 8) .. 8 (u % 8) + 7 of the chunk.
constexpr int XS_ROW = CHUNK_K + 8;
W12_HD int xs_unit_row(int u) { return u >> 3; }
W12_HD int xs_unit_col(int u) { return 8 * (u & 7); }
// A lane's first staged x value of staged row r (its 16 physical k, as x_offset).
W12_HD int xs_offset(int r, Lane l) {
#ifdef W12_MMA_XS_FAULT  // tests only: rows read without the padding the staging leaves
  return r * CHUNK_K + 16 * l.q;
#else
  return r * XS_ROW + 16 * l.q;
#endif
}

// The staged kernel (w12_mma_st_kernel): a ring of S chunks in shared memory, x's S
// buffers [S][rows][XS_ROW] first, then per stage every lane's own planes: its 16 hi bytes
// of n-group j at unit j * threads + thread (16 bytes each), then its 8 lo bytes at unit j *
// threads + thread of the stage's lo part (8 bytes each). A lane reads back only what it
// copied itself (no barrier for the weights); a warp's reads of one n-group are 512 (256)
// contiguous bytes: no bank conflicts. Offsets in bytes from the ring's start.
W12_HD int st_x_bytes(int rows) { return rows * XS_ROW * 2; }
W12_HD int st_w_bytes(int ng, int threads) { return ng * threads * 24; }
W12_HD int st_hi_offset(int stage, int stages, int rows, int ng, int threads, int j, int t) {
  return stages * st_x_bytes(rows) + stage * st_w_bytes(ng, threads) + 16 * (j * threads + t);
}
W12_HD int st_lo_offset(int stage, int stages, int rows, int ng, int threads, int j, int t) {
#ifdef W12_MMA_ST_FAULT  // tests only: every stage's lo bytes in the same place
  stage = 0;
#endif
  return stages * st_x_bytes(rows) + stage * st_w_bytes(ng, threads) + 16 * ng * threads +
         8 * (j * threads + t);
}
// x units (16 bytes) a stage copies: the rows below M only. The rows from M to the m-tiles'
// end are zeroed once in every stage before the first chunk and never copied (at M = 1 the
// fifteen zero rows were a third of the bytes a block copied a chunk).
W12_HD int st_x_units(int M, int rows) {
#ifdef W12_MMA_ST_FAULT_ROWS  // tests only: one row short
  return (M < rows ? M - 1 : rows - 1) * (CHUNK_K / 8);
#else
  return (M < rows ? M : rows) * (CHUNK_K / 8);
#endif
}
// The ring slot of the chunk `it` chunks into the split: loaded S - 1 chunks ahead, into
// the slot the chunk S chunks before it used.
W12_HD int st_stage(int it, int stages) { return it % stages; }

// The raw planes of one lane, one n-group, one chunk: hi bytes 16q .. 16q + 15 as 4 words
// (word s: weights 4s .. 4s + 3), lo bytes 8q .. 8q + 7 as 2 words (byte p: the nibbles of
// weights 2p and 2p + 1).
struct Raw {
  uint32_t h[4];
  uint32_t l[2];
};

W12_HD uint32_t base2(uint32_t b) { return (b << 7) * 0x00010001u; }

// __byte_perm: byte i of the result is byte (s >> 4i) & 7 of the pair (b:a).
W12_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(a, b, s);
#else
  const uint64_t v = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// Two weights 2p, 2p + 1 as one bf16x2 word (2p in the low half), from the word holding
// their hi bytes (at bytes hb, hb + 1), the word holding their lo byte (at byte lb) and
// base2. Per half: ((h & 0x7F) << 4 | nibble) + (b << 7), sign bit h >> 7 at bit 15
// (kernels/w12/format.py; the sum never carries into the sign). Both halves at once, as
// the GEMV's PTX decode (kernels/w12/gemv.py _pair_asm): e holds the hi bytes at bits
// 8..15 and 24..31, so their sign bits already sit at 15 and 31; lo * 0x1001 puts the
// even nibble at bits 0..3 and the odd one at 16..19. w8: the nested 8-bit view (no lo).
W12_HD uint32_t decode_pair(uint32_t hword, int hb, uint32_t lword, int lb, uint32_t b2,
                            bool w8) {
  const uint32_t e = byte_perm(hword, 0u, hb == 0 ? 0x1404u : 0x3424u);
  uint32_t t = ((e & 0x7F007F00u) >> 4) + b2;
  if (!w8) {
    const uint32_t l = byte_perm(lword, 0u, 0x4440u + lb) * 0x1001u;
    t = (t & 0xFFF0FFF0u) | (l & 0x000F000Fu);
  }
  return t | (e & 0x80008000u);
}

// B fragment of mma step s: b[0] = mma k 2q, 2q + 1 (physical 16q + 4s, + 1),
// b[1] = mma k 2q + 8, 2q + 9 (physical 16q + 4s + 2, + 3); column n0 + g. Their lo bytes
// are bytes 2s and 2s + 1 of the lane's 8.
W12_HD void decode_step(const Raw& r, int s, uint32_t b2, bool w8, uint32_t b[2]) {
  const uint32_t lw = r.l[s >> 1];
  b[0] = decode_pair(r.h[s], 0, lw, 2 * (s & 1), b2, w8);
  b[1] = decode_pair(r.h[s], 2, lw, 2 * (s & 1) + 1, b2, w8);
}

// A fragment of mma step s from one lane's 16 x values of rows g and g + 8 (8 bf16x2
// words each: word i holds physical k 16q + 2i, + 1): a[0] row g, mma k 2q, 2q + 1
// (physical 16q + 4s, + 1); a[1] row g + 8, the same k; a[2] row g, mma k 2q + 8, 2q + 9
// (physical 16q + 4s + 2, + 3); a[3] row g + 8, the same k.
W12_HD void a_step(const uint32_t xg[8], const uint32_t xg8[8], int s, uint32_t a[4]) {
  a[0] = xg[2 * s];
#ifdef W12_MMA_FAULT  // tests only: a wrong register order, which the emulator must catch
  a[1] = xg[2 * s + 1];
  a[2] = xg8[2 * s];
#else
  a[1] = xg8[2 * s];
  a[2] = xg[2 * s + 1];
#endif
  a[3] = xg8[2 * s + 1];
}

// Where accumulator register r (0..3) of m-tile t and n-group j lands in the block's tile:
// row 16t + g (+8 for r >= 2), column 8j + 2q + (r & 1).
W12_HD int out_row(Lane l, int t, int r) { return TILE_M * t + l.g + 8 * (r >> 1); }
W12_HD int out_col(Lane l, int j, int r) { return GROUP_N * j + 2 * l.q + (r & 1); }

// Chunks [c0, c1) of K split `split` of `nsplit` (K / CHUNK_K chunks in all); warp w of
// the block's wk warps takes chunks c0 + w, c0 + w + wk, ...: how many.
W12_HD void split_chunks(int split, int nsplit, int chunks, int* c0, int* c1) {
  *c0 = (int)((int64_t)split * chunks / nsplit);
  *c1 = (int)((int64_t)(split + 1) * chunks / nsplit);
}
W12_HD int warp_iters(int c0, int c1, int w, int wk) {
  return c0 + w < c1 ? (c1 - c0 - w + wk - 1) / wk : 0;
}

// The K splits summed inside the tiles kernel ("fused", sm_90 and newer): the nsplit blocks
// of one output tile form a thread block cluster, cluster rank r computing split r. Each
// leaves its fp32 sums in its own shared memory as a tile of [rows][cols] (rows below M,
// the block's columns); after the cluster's barrier, thread t of rank r finishes elements
// fin_first(r, t, threads), then every fin_step(nsplit, threads) on: 0 + split 0 + split 1
// + ... read from each rank's tile in split order, then the exceptions, rounded once: the
// same floating-point operations, in the same order, as w12_mma_reduce on the partials.
W12_HD int tile_index(int m, int c, int cols) { return m * cols + c; }
W12_HD int fin_first(int rank, int t, int threads) { return rank * threads + t; }
W12_HD int fin_step(int nsplit, int threads) {
#ifdef W12_MMA_FIN_FAULT  // tests only: a stride one rank too long (elements left unwritten)
  return (nsplit + 1) * threads;
#else
  return nsplit * threads;
#endif
}

W12_HD float bf16_to_f32(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits << 16);
#else
  uint32_t u = bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// Round to nearest even, as torch's .to(torch.bfloat16); every NaN becomes 0x7FC0.
W12_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
#ifdef __CUDA_ARCH__
  u = __float_as_uint(f);
#else
  memcpy(&u, &f, 4);
#endif
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return 0x7FC0u;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// The exceptions of row n for x row m: sum of x[m, k] * w_exc - x[m, k] * w0 (the planes
// hold w0 = 2**(b - 127) at an exception's slot; kernels/w12/reference.py planes_matmul).
W12_HD float exception_sum(int64_t m, int64_t n, int64_t K, const uint16_t* x,
                           const int32_t* row_ptr, const void* exc_idx, bool idx64,
                           const uint16_t* exc_val, const uint8_t* base) {
  int e0 = row_ptr[n], e1 = row_ptr[n + 1];
  if (e0 == e1) return 0.0f;
  float w0 = bf16_to_f32((uint32_t)base[n] << 7);
  float c = 0.0f;
  for (int e = e0; e < e1; ++e) {
    int64_t idx = idx64 ? ((const int64_t*)exc_idx)[e] : (int64_t)((const int32_t*)exc_idx)[e];
    float xv = bf16_to_f32(x[m * K + (idx - n * K)]);
    c += xv * bf16_to_f32(exc_val[e]) - xv * w0;
  }
  return c;
}

}  // namespace w12mma
